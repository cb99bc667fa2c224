package snapshot

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
)

const magic = "brain-snapshot v1\n"

const (
	kindHeader  byte = 1
	kindVersion byte = 2
	kindLease   byte = 3
	// kindAuth is one record of the auth state (package auth): a key
	// (uvarint length and bytes) and its value.
	kindAuth byte = 4
	kindEnd  byte = 0xFF
)

// Header describes a backup.
type Header struct {
	// Revision is the revision the backup was taken at: every write at or
	// below it is in it, and none above.
	Revision int64 `json:"revision"`
	// CompactRevision is the store's compaction revision.
	CompactRevision int64 `json:"compact_revision"`
	// SplitPoints are the store's partition boundaries.
	SplitPoints []string `json:"split_points"`
	// ClusterID and MemberID identify the node the backup came from.
	ClusterID uint64 `json:"cluster_id"`
	MemberID  uint64 `json:"member_id"`
}

// ErrCorrupt reports a backup that does not parse or whose checksum does
// not match.
var ErrCorrupt = errors.New("snapshot: corrupt backup")

// Writer writes a backup.
type Writer struct {
	w   *bufio.Writer
	n   int64
	buf []byte
}

// NewWriter starts a backup on w with header h. The caller must call
// Version and Lease for the content, then Close. The checksum is left to
// the caller (etcd's Snapshot stream appends it): use WriteChecksummed to
// produce a complete file.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	sw := &Writer{w: bufio.NewWriterSize(w, 1<<20)}
	if err := sw.raw([]byte(magic)); err != nil {
		return nil, err
	}
	hb, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	return sw, sw.record(kindHeader, hb)
}

func (w *Writer) raw(b []byte) error {
	n, err := w.w.Write(b)
	w.n += int64(n)
	return err
}

func (w *Writer) record(kind byte, payload []byte) error {
	w.buf = append(w.buf[:0], kind)
	w.buf = binary.AppendUvarint(w.buf, uint64(len(payload)))
	if err := w.raw(w.buf); err != nil {
		return err
	}
	return w.raw(payload)
}

// Version writes one MVCC version.
func (w *Writer) Version(v *partition.Version) error {
	b := binary.AppendUvarint(nil, uint64(len(v.Key)))
	b = append(b, v.Key...)
	b = binary.AppendUvarint(b, uint64(v.Rev))
	var flags byte
	if v.Tombstone {
		flags = 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(v.KV.CreateRevision))
	b = binary.AppendUvarint(b, uint64(v.KV.Version))
	b = binary.AppendVarint(b, v.KV.Lease)
	b = append(b, v.KV.Value...)
	return w.record(kindVersion, b)
}

// Lease writes one lease.
func (w *Writer) Lease(l meta.Lease) error {
	b := binary.BigEndian.AppendUint64(nil, uint64(l.ID))
	b = binary.BigEndian.AppendUint64(b, uint64(l.TTL))
	return w.record(kindLease, b)
}

// Auth writes one record of the auth state (users, roles, settings).
func (w *Writer) Auth(key, value []byte) error {
	b := binary.AppendUvarint(nil, uint64(len(key)))
	b = append(b, key...)
	b = append(b, value...)
	return w.record(kindAuth, b)
}

// Close writes the end record and the padding, and flushes.
func (w *Writer) Close() error {
	if err := w.record(kindEnd, nil); err != nil {
		return err
	}
	if pad := (512 - w.n%512) % 512; pad > 0 {
		if err := w.raw(make([]byte, pad)); err != nil {
			return err
		}
	}
	return w.w.Flush()
}

// Contents is a parsed backup.
type Contents struct {
	Header Header
	Leases []meta.Lease
	// Auth is the auth state's records (key, value), as Writer.Auth got
	// them.
	Auth [][2][]byte
}

// Read verifies and parses a complete backup file (content and checksum),
// calling fn for every version in order.
func Read(data []byte, fn func(*partition.Version) error) (*Contents, error) {
	if len(data) < len(magic)+sha256.Size {
		return nil, fmt.Errorf("%w: too short (%d bytes)", ErrCorrupt, len(data))
	}
	body, sum := data[:len(data)-sha256.Size], data[len(data)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	if !bytes.HasPrefix(body, []byte(magic)) {
		return nil, fmt.Errorf("%w: not a brain backup (an etcd snapshot must be imported, not restored)", ErrCorrupt)
	}
	b := body[len(magic):]
	c := &Contents{}
	sawHeader := false
	for {
		if len(b) == 0 {
			return nil, fmt.Errorf("%w: missing end record", ErrCorrupt)
		}
		kind := b[0]
		n, k := binary.Uvarint(b[1:])
		if k <= 0 || uint64(len(b)-1-k) < n {
			return nil, fmt.Errorf("%w: truncated record", ErrCorrupt)
		}
		payload := b[1+k : 1+k+int(n)]
		b = b[1+k+int(n):]
		switch kind {
		case kindHeader:
			if err := json.Unmarshal(payload, &c.Header); err != nil {
				return nil, fmt.Errorf("%w: header: %v", ErrCorrupt, err)
			}
			sawHeader = true
		case kindVersion:
			v, err := decodeVersion(payload)
			if err != nil {
				return nil, err
			}
			if err := fn(v); err != nil {
				return nil, err
			}
		case kindLease:
			if len(payload) != 16 {
				return nil, fmt.Errorf("%w: lease record", ErrCorrupt)
			}
			c.Leases = append(c.Leases, meta.Lease{ID: int64(binary.BigEndian.Uint64(payload)), TTL: int64(binary.BigEndian.Uint64(payload[8:]))})
		case kindAuth:
			kl, k := binary.Uvarint(payload)
			if k <= 0 || uint64(len(payload)-k) < kl {
				return nil, fmt.Errorf("%w: auth record", ErrCorrupt)
			}
			key := append([]byte(nil), payload[k:k+int(kl)]...)
			c.Auth = append(c.Auth, [2][]byte{key, append([]byte(nil), payload[k+int(kl):]...)})
		case kindEnd:
			if !sawHeader {
				return nil, fmt.Errorf("%w: no header", ErrCorrupt)
			}
			return c, nil
		default:
			return nil, fmt.Errorf("%w: unknown record kind %d", ErrCorrupt, kind)
		}
	}
}

func decodeVersion(p []byte) (*partition.Version, error) {
	v := &partition.Version{}
	next := func() uint64 {
		x, k := binary.Uvarint(p)
		if k <= 0 {
			p = nil
			return 0
		}
		p = p[k:]
		return x
	}
	kl := next()
	if p == nil || uint64(len(p)) < kl {
		return nil, fmt.Errorf("%w: version record", ErrCorrupt)
	}
	v.Key = append([]byte(nil), p[:kl]...)
	p = p[kl:]
	v.Rev = int64(next())
	if len(p) < 1 {
		return nil, fmt.Errorf("%w: version record", ErrCorrupt)
	}
	v.Tombstone = p[0] == 1
	p = p[1:]
	v.KV.CreateRevision = int64(next())
	v.KV.Version = int64(next())
	l, k := binary.Varint(p)
	if p == nil || k <= 0 {
		return nil, fmt.Errorf("%w: version record", ErrCorrupt)
	}
	v.KV.Lease = l
	v.KV.Value = append([]byte(nil), p[k:]...)
	if v.Tombstone {
		v.KV.Value = nil
	}
	v.KV.Key, v.KV.ModRevision = v.Key, v.Rev
	return v, nil
}
