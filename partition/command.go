package partition

import (
	"encoding/binary"
	"errors"

	"github.com/brainkv/brain/raftgroup"
)

// Raft commands of a partition. Every command carries the term of the
// leader that evaluated it; apply rejects a command whose term differs from
// its entry's term (it was evaluated by a leader that has since lost
// leadership, against state a newer leader may have changed).
const (
	cmdWrite   byte = 1 // mutations at one revision, plus a closed revision
	cmdClose   byte = 2 // advance the closed revision
	cmdCompact byte = 3 // record the compaction revision
	cmdPurge   byte = 4 // drop index keys of keys deleted at or below the compaction revision
	cmdSplit   byte = 5 // split the partition (split.go); keys[0] is the split key
)

// Mutation kinds.
const (
	mutPut    byte = 1
	mutDelete byte = 2
)

// mutation is one evaluated change of a write command.
type mutation struct {
	kind  byte
	key   []byte
	value []byte
	lease int64
}

// command is a partition command. encode returns it with room for the raft
// entry header at the front (raftgroup.NewCommand); decodeCommand takes it
// without.
type command struct {
	kind   byte
	term   uint64
	rev    int64 // cmdWrite: the write's revision; cmdCompact/cmdPurge: compaction revision
	closed int64 // cmdWrite/cmdClose: closed revision promised after this entry
	muts   []mutation
	keys   [][]byte // cmdPurge; cmdSplit: the split key
	child  uint64   // cmdSplit: the new partition's group
}

var errBadCommand = errors.New("partition: malformed command")

func (c *command) encode() []byte {
	n := 1 + 8 + 8 + 8 + 10 + 10
	for i := range c.muts {
		n += 1 + 10 + len(c.muts[i].key) + 10 + 10 + len(c.muts[i].value)
	}
	for _, k := range c.keys {
		n += 10 + len(k)
	}
	b := raftgroup.NewCommand(n)
	b = append(b, c.kind)
	b = binary.BigEndian.AppendUint64(b, c.term)
	b = binary.BigEndian.AppendUint64(b, uint64(c.rev))
	b = binary.BigEndian.AppendUint64(b, uint64(c.closed))
	switch c.kind {
	case cmdWrite:
		b = binary.AppendUvarint(b, uint64(len(c.muts)))
		for i := range c.muts {
			m := &c.muts[i]
			b = append(b, m.kind)
			b = binary.AppendUvarint(b, uint64(len(m.key)))
			b = append(b, m.key...)
			if m.kind == mutPut {
				b = binary.AppendVarint(b, m.lease)
				b = binary.AppendUvarint(b, uint64(len(m.value)))
				b = append(b, m.value...)
			}
		}
	case cmdPurge:
		b = binary.AppendUvarint(b, uint64(len(c.keys)))
		for _, k := range c.keys {
			b = binary.AppendUvarint(b, uint64(len(k)))
			b = append(b, k...)
		}
	case cmdSplit:
		b = binary.AppendUvarint(b, c.child)
		b = binary.AppendUvarint(b, uint64(len(c.keys[0])))
		b = append(b, c.keys[0]...)
	}
	return b
}

// setClosed patches the closed revision of an encoded command (as returned
// by encode, entry header room included) in place.
func setClosed(b []byte, closed int64) {
	binary.BigEndian.PutUint64(b[raftgroup.HeaderLen+17:raftgroup.HeaderLen+25], uint64(closed))
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errBadCommand
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errBadCommand
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if uint64(len(d.b)) < n {
		d.err = errBadCommand
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func decodeCommand(b []byte) (*command, error) {
	if len(b) < 25 {
		return nil, errBadCommand
	}
	c := &command{
		kind:   b[0],
		term:   binary.BigEndian.Uint64(b[1:9]),
		rev:    int64(binary.BigEndian.Uint64(b[9:17])),
		closed: int64(binary.BigEndian.Uint64(b[17:25])),
	}
	d := &decoder{b: b[25:]}
	switch c.kind {
	case cmdWrite:
		n := d.uvarint()
		if n > uint64(len(d.b)) {
			return nil, errBadCommand
		}
		c.muts = make([]mutation, 0, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			if len(d.b) < 1 {
				return nil, errBadCommand
			}
			m := mutation{kind: d.b[0]}
			d.b = d.b[1:]
			m.key = d.bytes()
			switch m.kind {
			case mutPut:
				m.lease = d.varint()
				m.value = d.bytes()
			case mutDelete:
			default:
				return nil, errBadCommand
			}
			c.muts = append(c.muts, m)
		}
	case cmdPurge:
		n := d.uvarint()
		if n > uint64(len(d.b)) {
			return nil, errBadCommand
		}
		for i := uint64(0); i < n && d.err == nil; i++ {
			c.keys = append(c.keys, d.bytes())
		}
	case cmdSplit:
		c.child = d.uvarint()
		c.keys = [][]byte{d.bytes()}
	case cmdClose, cmdCompact:
	default:
		return nil, errBadCommand
	}
	if d.err != nil {
		return nil, d.err
	}
	return c, nil
}
