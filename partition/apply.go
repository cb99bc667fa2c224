package partition

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/internal/bugs"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/raft/v3/raftpb"
)

// applyResult is what Apply returns to the proposer.
type applyResult struct {
	reject rejectReason
}

type rejectReason uint8

const (
	accepted rejectReason = iota
	// rejectStaleTerm: evaluated by a leader of another term.
	rejectStaleTerm
	// rejectClosed: the write's revision is at or below the closed revision.
	rejectClosed
	// rejectMalformed: the command does not decode.
	rejectMalformed
	// rejectOutsideRange: a write's key is outside the partition's span
	// (it split after the write was evaluated).
	rejectOutsideRange
	// rejectBadSplit: a split key outside the span, or a reused child.
	rejectBadSplit
)

// smState is the replicated state beside the MVCC data, persisted under
// GroupKey(id, "part") in the same batch as every change to it. Owned by the
// apply goroutine.
type smState struct {
	closed  int64
	compact int64
}

func (p *Partition) stateKey() []byte { return engine.GroupKey(p.id, "part") }

func (p *Partition) loadState() error {
	v, closer, err := p.db.Get(p.stateKey())
	if err == pebble.ErrNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	if len(v) != 16 {
		return fmt.Errorf("partition %d: corrupt state", p.id)
	}
	p.sm.closed = int64(binary.BigEndian.Uint64(v[0:8]))
	p.sm.compact = int64(binary.BigEndian.Uint64(v[8:16]))
	return nil
}

func (p *Partition) saveState(b *pebble.Batch) {
	v := engine.PutUint64(engine.PutUint64(nil, uint64(p.sm.closed)), uint64(p.sm.compact))
	mustSet(b, p.stateKey(), v)
}

func mustSet(b *pebble.Batch, k, v []byte) {
	if err := b.Set(k, v, nil); err != nil {
		panic(fmt.Errorf("partition: batch set: %w", err))
	}
}

func mustDelete(b *pebble.Batch, k []byte) {
	if err := b.Delete(k, nil); err != nil {
		panic(fmt.Errorf("partition: batch delete: %w", err))
	}
}

// eventKey is EventPrefix + BE64(partition) + BE64(rev).
func eventKey(partition uint64, rev int64) []byte {
	k := make([]byte, 0, 17)
	k = append(k, engine.EventPrefix)
	k = engine.PutUint64(k, partition)
	return engine.PutUint64(k, uint64(rev))
}

// leaseIndexKey is LeasePrefix + BE64(lease) + enc(key).
func leaseIndexKey(lease int64, key []byte) []byte {
	k := make([]byte, 0, 9+engine.EncodedLen(key))
	k = append(k, engine.LeasePrefix)
	k = engine.PutUint64(k, uint64(lease))
	return engine.AppendKey(k, key)
}

// Apply implements raftgroup.StateMachine. It is a deterministic function of
// the partition's state in ac.Batch and the entry.
func (p *Partition) Apply(ac *raftgroup.ApplyContext, e *raftpb.Entry, data []byte) any {
	c, err := decodeCommand(data)
	if err != nil {
		p.log.Error("malformed partition command; rejected", "index", e.Index, "err", err)
		return applyResult{reject: rejectMalformed}
	}
	if c.term != e.Term {
		if c.kind == cmdWrite {
			p.log.Info("write of an earlier leader term rejected", "rev", c.rev, "term", c.term, "entry-term", e.Term, "index", e.Index)
		}
		p.metrics.rejected.WithLabelValues("stale_term").Inc()
		return applyResult{reject: rejectStaleTerm}
	}
	b := ac.Batch
	switch c.kind {
	case cmdWrite:
		if c.rev <= p.sm.closed && !bugs.On("write-below-closed") {
			// Invariant 4: nothing at or below the closed revision applies.
			p.log.Info("write at or below the closed revision rejected", "rev", c.rev, "closed", p.sm.closed, "index", e.Index)
			p.metrics.rejected.WithLabelValues("closed").Inc()
			return applyResult{reject: rejectClosed}
		}
		sp := p.sp.Load()
		for i := range c.muts {
			if !sp.contains(c.muts[i].key) {
				p.log.Info("write outside the span rejected", "rev", c.rev, "key", fmt.Sprintf("%q", c.muts[i].key), "index", e.Index)
				p.metrics.rejected.WithLabelValues("outside_range").Inc()
				return applyResult{reject: rejectOutsideRange}
			}
		}
		evs := p.applyWrite(ac, c)
		p.sm.closed = max(p.sm.closed, c.closed)
		p.saveState(b)
		closed := p.sm.closed
		ac.AfterCommit(func() { p.published(RevEvents{Rev: c.rev, Events: evs, PrevValuesMissing: true}, closed) })
	case cmdClose:
		if c.closed > p.sm.closed {
			p.sm.closed = c.closed
			p.saveState(b)
		}
		closed := p.sm.closed
		ac.AfterCommit(func() { p.published(RevEvents{}, closed) })
	case cmdSplit:
		return p.applySplit(ac, e, c)
	case cmdCompact:
		if c.rev > p.sm.compact {
			p.sm.compact = c.rev
			p.saveState(b)
			rev := c.rev
			ac.AfterCommit(func() { p.compacted(rev) })
		}
	case cmdPurge:
		var purged []string
		for _, k := range c.keys {
			m, ok := p.applyMeta(k)
			if ok && m.tombstone && m.mod <= p.sm.compact {
				mustDelete(b, indexKey(k))
				p.round[string(k)] = meta{}
				purged = append(purged, string(k))
			}
		}
		ac.AfterCommit(func() {
			for _, k := range purged {
				p.index.del(k)
				if p.round[k] == (meta{}) {
					delete(p.round, k)
				}
			}
		})
	}
	return applyResult{}
}

// applyWrite writes a write command's mutations at c.rev and returns its
// events (with prev_kv) in mutation order.
func (p *Partition) applyWrite(ac *raftgroup.ApplyContext, c *command) []*mvccpb.Event {
	b := ac.Batch
	evs := make([]*mvccpb.Event, 0, len(c.muts))
	written := make([]meta, len(c.muts))
	rec := binary.AppendUvarint(nil, uint64(len(c.muts)))
	var buf []byte
	for i := range c.muts {
		m := &c.muts[i]
		old, exists := p.applyMeta(m.key)
		live := exists && !old.tombstone
		// The previous version's value is not read here: the feed's
		// consumer loads it (PrevValue) if a watch asks for prev_kv.
		var prev *mvccpb.KeyValue
		if live {
			prev = &mvccpb.KeyValue{Key: m.key, ModRevision: old.mod, CreateRevision: old.create, Version: old.version, Lease: old.lease}
		}
		if exists && old.mod == c.rev {
			// Written earlier in this command (a put, then a delete in a
			// nested transaction): both events are at c.rev, and each
			// one's prev_kv is, as etcd's, the key at c.rev-1, the first
			// write's prev_kv, not that write.
			for j := range i {
				if bytes.Equal(c.muts[j].key, m.key) {
					prev = evs[j].PrevKv
					break
				}
			}
		}
		switch m.kind {
		case mutPut:
			nm := meta{mod: c.rev, create: c.rev, version: 1, lease: m.lease}
			if live {
				nm.create, nm.version = old.create, old.version+1
			}
			buf = nm.encode(buf[:0])
			mustSet(b, indexKey(m.key), buf)
			written[i] = nm
			setVersion(b, m.key, c.rev, false, nm.create, nm.version, nm.lease, m.value)
			if live && old.lease != 0 && old.lease != m.lease {
				mustDelete(b, leaseIndexKey(old.lease, m.key))
			}
			if m.lease != 0 && (!live || old.lease != m.lease) {
				mustSet(b, leaseIndexKey(m.lease, m.key), nil)
			}
			evs = append(evs, &mvccpb.Event{
				Type: mvccpb.PUT,
				Kv: &mvccpb.KeyValue{Key: m.key, Value: m.value, ModRevision: c.rev,
					CreateRevision: nm.create, Version: nm.version, Lease: nm.lease},
				PrevKv: prev,
			})
		case mutDelete:
			if !live {
				// Evaluation only emits deletes of live keys; a replica that
				// disagrees has diverged.
				panic(fmt.Errorf("partition %d: delete of missing key %q at revision %d", p.id, m.key, c.rev))
			}
			written[i] = meta{tombstone: true, mod: c.rev}
			buf = written[i].encode(buf[:0])
			mustSet(b, indexKey(m.key), buf)
			setVersion(b, m.key, c.rev, true, 0, 0, 0, nil)
			if old.lease != 0 {
				mustDelete(b, leaseIndexKey(old.lease, m.key))
			}
			evs = append(evs, &mvccpb.Event{
				Type:   mvccpb.DELETE,
				Kv:     &mvccpb.KeyValue{Key: m.key, ModRevision: c.rev},
				PrevKv: prev,
			})
		}
		rec = append(rec, m.kind)
		rec = binary.AppendUvarint(rec, uint64(len(m.key)))
		rec = append(rec, m.key...)
		p.round[string(m.key)] = written[i]
	}
	mustSet(b, eventKey(p.id, c.rev), rec)
	if p.roundEvents == nil {
		p.roundEvents = make(map[int64][]byte)
		ac.AfterCommit(func() { p.roundEvents = nil })
	}
	p.roundEvents[c.rev] = rec
	ac.AfterCommit(func() {
		for i := range c.muts {
			k := string(c.muts[i].key)
			p.index.set(k, written[i])
			if p.round[k] == written[i] {
				delete(p.round, k)
			}
		}
	})
	return evs
}

// applyMeta returns key's latest meta as of the commands applied so far,
// including earlier commands of the current round.
func (p *Partition) applyMeta(key []byte) (meta, bool) {
	if m, ok := p.round[string(key)]; ok {
		return m, m != (meta{})
	}
	return p.index.get(key)
}

// decodeEventRecord decodes an event log record into (kind, key) pairs.
func decodeEventRecord(v []byte) ([]mutation, error) {
	d := &decoder{b: v}
	n := d.uvarint()
	if n > uint64(len(v)) {
		return nil, errCorrupt
	}
	out := make([]mutation, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		if len(d.b) < 1 {
			return nil, errCorrupt
		}
		m := mutation{kind: d.b[0]}
		d.b = d.b[1:]
		m.key = append([]byte(nil), d.bytes()...)
		out = append(out, m)
	}
	return out, d.err
}
