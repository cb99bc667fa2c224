package partition

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/brainkv/brain/raftgroup"

	"github.com/brainkv/brain/engine"
	"github.com/cockroachdb/pebble/v2"
)

// Raft snapshots of a partition (raftgroup.Snapshotter): every key of its
// replicated state - the MVCC keys of its span, its event log, the lease
// index entries of its keys, and its state and span records.

func (p *Partition) spanKey() []byte { return engine.GroupKey(p.id, "span") }

func encodeSpan(start, end []byte) []byte {
	b := binary.AppendUvarint(nil, uint64(len(start)))
	b = append(b, start...)
	return append(b, end...)
}

func decodeSpan(b []byte) (start, end []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return nil, nil, errCorrupt
	}
	return append([]byte{}, b[k:k+int(n)]...), append([]byte(nil), b[k+int(n):]...), nil
}

// loadSpan reads the persisted span; a new replica with a configured span
// persists it.
func (p *Partition) loadSpan(configured bool) error {
	v, closer, err := p.db.Get(p.spanKey())
	if err == pebble.ErrNotFound {
		if configured {
			p.initialized.Store(true)
			start, end := p.Span()
			return p.db.Set(p.spanKey(), encodeSpan(start, end), pebble.Sync)
		}
		return nil
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	start, end, err := decodeSpan(v)
	if err != nil {
		return err
	}
	if cs, ce := p.Span(); configured && (!bytes.Equal(start, cs) || !bytes.Equal(end, ce)) {
		// A split shrinks the span; the configured one is where it began.
		if !bytes.Equal(start, cs) || len(ce) != 0 && (len(end) == 0 || bytes.Compare(end, ce) > 0) {
			return fmt.Errorf("partition %d: persisted span [%q, %q) is not within the configured [%q, %q)", p.id, start, end, cs, ce)
		}
	}
	p.sp.Store(&span{start: start, end: end})
	p.initialized.Store(true)
	return nil
}

func (p *Partition) eventBounds() (lo, hi []byte) {
	lo = engine.PutUint64([]byte{engine.EventPrefix}, p.id)
	return lo, engine.PrefixEnd(lo)
}

// ErrOverlappingReplica: a snapshot's span overlaps another partition's
// replica on this node.
var ErrOverlappingReplica = errors.New("partition: snapshot overlaps another partition's replica here")

// CheckSnapshot implements raftgroup.SnapshotChecker: a snapshot whose span
// overlaps another partition's replica on this node is refused. Spans only
// shrink, so such a snapshot predates a split whose child is here; its
// older writes to the child's keys would overwrite the child's (shared
// keyspace). The leader sends a newer one later.
func (p *Partition) CheckSnapshot(data []byte) error {
	if p.overlaps == nil {
		return nil
	}
	key := p.spanKey()
	var err error
	walkErr := raftgroup.ForEachSnapshotKV(data, func(k, v []byte) bool {
		if !bytes.Equal(k, key) {
			return true
		}
		start, end, derr := decodeSpan(v)
		if derr != nil {
			err = derr
		} else if p.overlaps(p.id, start, end) {
			err = fmt.Errorf("%w: partition %d [%q, %q)", ErrOverlappingReplica, p.id, start, end)
		}
		return false
	})
	if walkErr != nil {
		return walkErr
	}
	return err
}

// WriteSnapshot implements raftgroup.Snapshotter.
func (p *Partition) WriteSnapshot(r pebble.Reader, emit func(k, v []byte) error) error {
	for _, k := range [][]byte{p.spanKey(), p.stateKey(), p.splitsKey()} {
		v, closer, err := r.Get(k)
		if err == pebble.ErrNotFound {
			continue
		}
		if err != nil {
			return err
		}
		err = emit(k, v)
		closer.Close()
		if err != nil {
			return err
		}
	}
	mlo, mhi := rangeBounds(p.Span())
	elo, ehi := p.eventBounds()
	for _, b := range [][2][]byte{{mlo, mhi}, {elo, ehi}} {
		if err := emitRange(r, b[0], b[1], nil, emit); err != nil {
			return err
		}
	}
	return emitRange(r, []byte{engine.LeasePrefix}, []byte{engine.LeasePrefix + 1}, p.leaseEntryInSpan, emit)
}

// leaseEntryInSpan reports whether a lease index key names a key of this
// partition.
func (p *Partition) leaseEntryInSpan(k []byte) bool {
	key, _, err := engine.DecodeKey(nil, k[9:])
	return err == nil && p.Contains(key)
}

func emitRange(r pebble.Reader, lo, hi []byte, keep func([]byte) bool, emit func(k, v []byte) error) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		if keep != nil && !keep(it.Key()) {
			continue
		}
		if err := emit(it.Key(), it.Value()); err != nil {
			return err
		}
	}
	return it.Error()
}

// ClearState implements raftgroup.Snapshotter: it deletes this replica's
// state (for its current span; a new replica has none).
func (p *Partition) ClearState(b *pebble.Batch) error {
	if err := b.Delete(p.spanKey(), nil); err != nil {
		return err
	}
	if err := b.Delete(p.stateKey(), nil); err != nil {
		return err
	}
	elo, ehi := p.eventBounds()
	if err := b.DeleteRange(elo, ehi, nil); err != nil {
		return err
	}
	if err := b.Delete(p.splitsKey(), nil); err != nil {
		return err
	}
	if start, end := p.Span(); start == nil && end == nil {
		return nil // no span yet: nothing of ours in the shared keyspaces
	}
	mlo, mhi := rangeBounds(p.Span())
	if err := b.DeleteRange(mlo, mhi, nil); err != nil {
		return err
	}
	return emitRange(p.db, []byte{engine.LeasePrefix}, []byte{engine.LeasePrefix + 1}, p.leaseEntryInSpan,
		func(k, _ []byte) error { return b.Delete(k, nil) })
}

// SnapshotApplied implements raftgroup.Snapshotter: it reloads the span,
// state and key index from the installed snapshot.
func (p *Partition) SnapshotApplied() error {
	if err := p.loadSpan(false); err != nil {
		return err
	}
	p.sm = smState{}
	if err := p.loadState(); err != nil {
		return err
	}
	if err := p.loadSplits(); err != nil {
		return err
	}
	start, end := p.Span()
	if err := p.index.reload(p.db, start, end); err != nil {
		return err
	}
	p.round = make(map[string]meta)
	p.closed.Store(max(p.closed.Load(), p.sm.closed))
	p.initialized.Store(true)
	p.compacted(p.sm.compact)
	p.notifyProgress()
	// Subscribers never saw the events the snapshot brought; they resubscribe
	// from what they have and read them from the new event log.
	p.endSubscriptions(false)
	p.log.Info("installed snapshot", "start", fmt.Sprintf("%q", start), "end", fmt.Sprintf("%q", end), "closed", p.sm.closed)
	return nil
}
