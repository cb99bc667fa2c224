package partition

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3/raftpb"
)

// Splits.
//
// Split(key, child) cuts the partition's span [start, end) at key: the
// partition keeps [start, key) and a new partition, raft group child,
// takes [key, end). The split is a raft command (cmdSplit), so every
// replica applies it at the same point of its log, in one batch with:
//
//   - the new spans of both partitions;
//   - the child's state: its closed revision starts at the parent's closed
//     revision Cs after the split, its compaction revision at the parent's;
//   - the child's event log: copies of the parent's records of the keys
//     that move. The parent keeps its records whole: a subscription to
//     the parent resumed from below the split must deliver every event the
//     parent published before it, whatever keys (the child's feed starts
//     above the split). Reads of the log by key range filter by key;
//   - the child's raft bootstrap state: the parent's configuration at the
//     split entry, at raftgroup.InitialIndex, identical on every replica;
//   - a SplitRecord in the parent's state.
//
// No data moves: the MVCC keys live in the node's shared keyspace.
//
// The parent's leader drains its writes first (as for a planned leader
// transfer): a write that took a revision applies before the split, and
// none is evaluated until it applied, so no revision is lost. Apply still
// rejects writes outside the span, for writes of an earlier term.
//
// Every write to the child's keys after the split has a revision issued
// after the split applied, so above Cs: the child's first closed revision
// breaks no promise. Readers, the gateway's router and the watch hub learn
// of the split through ErrOutsideRange (a read or write that no longer
// fits the span fails and is routed again) and through the split records
// (a feed subscription carries them; see Subscription.Splits).

// ErrBadSplitKey: the split key is not strictly inside the partition's
// span.
var ErrBadSplitKey = errors.New("partition: split key must lie strictly inside the partition")

// SplitRecord is one split of a partition: keys from Key to End moved to
// partition Child, whose closed revision started at Closed.
type SplitRecord struct {
	Key, End []byte
	Child    uint64
	Closed   int64
}

func (p *Partition) splitsKey() []byte { return engine.GroupKey(p.id, "splits") }

func encodeSplits(recs []SplitRecord) []byte {
	b := binary.AppendUvarint(nil, uint64(len(recs)))
	for _, r := range recs {
		b = AppendSplitRecord(b, r)
	}
	return b
}

// AppendSplitRecord encodes r.
func AppendSplitRecord(b []byte, r SplitRecord) []byte {
	b = binary.AppendUvarint(b, uint64(len(r.Key)))
	b = append(b, r.Key...)
	b = binary.AppendUvarint(b, uint64(len(r.End)))
	b = append(b, r.End...)
	b = binary.AppendUvarint(b, r.Child)
	return binary.AppendVarint(b, r.Closed)
}

// ReadSplitRecord decodes a record encoded by AppendSplitRecord and
// returns the rest of b.
func ReadSplitRecord(b []byte) (SplitRecord, []byte, error) {
	d := &decoder{b: b}
	r := SplitRecord{Key: append([]byte{}, d.bytes()...), End: append([]byte(nil), d.bytes()...)}
	r.Child = d.uvarint()
	r.Closed = d.varint()
	return r, d.b, d.err
}

func decodeSplits(b []byte) ([]SplitRecord, error) {
	d := &decoder{b: b}
	n := d.uvarint()
	if d.err != nil || n > uint64(len(b)) {
		return nil, errCorrupt
	}
	out := make([]SplitRecord, 0, n)
	rest := d.b
	for i := uint64(0); i < n; i++ {
		r, next, err := ReadSplitRecord(rest)
		if err != nil {
			return nil, errCorrupt
		}
		out, rest = append(out, r), next
	}
	return out, nil
}

func (p *Partition) loadSplits() error {
	var recs []SplitRecord
	v, closer, err := p.db.Get(p.splitsKey())
	switch {
	case err == pebble.ErrNotFound:
	case err != nil:
		return err
	default:
		recs, err = decodeSplits(v)
		closer.Close()
		if err != nil {
			return fmt.Errorf("partition %d: corrupt split records", p.id)
		}
	}
	p.splits.Store(&recs)
	return nil
}

// Splits returns the partition's splits, oldest first.
func (p *Partition) Splits() []SplitRecord {
	if s := p.splits.Load(); s != nil {
		return *s
	}
	return nil
}

// SplitKeyOK reports whether key can split the partition now.
func (p *Partition) SplitKeyOK(key []byte) bool {
	sp := p.sp.Load()
	return bytes.Compare(key, sp.start) > 0 && (len(sp.end) == 0 || bytes.Compare(key, sp.end) < 0)
}

// Split splits the partition at key, creating partition child (an ID
// never used before) for the keys from key on. It runs on the leader and
// returns once the split applied here.
func (p *Partition) Split(ctx context.Context, key []byte, child uint64) error {
	if !p.Contains(key) {
		return ErrOutsideRange
	}
	if !p.SplitKeyOK(key) {
		return ErrBadSplitKey
	}
	term, err := p.PrepareTransfer(ctx)
	if err != nil {
		return err
	}
	defer p.Resume()
	p.prop.Lock()
	c := max(p.closeCandidateLocked(), p.prop.lastClosed)
	p.prop.lastClosed = c
	p.prop.Unlock()
	cmd := &command{kind: cmdSplit, term: term, closed: c, child: child, keys: [][]byte{key}}
	res, err := p.group.Propose(ctx, cmd.encode())
	if err != nil {
		if errors.Is(err, raftgroup.ErrNotLeader) {
			return ErrNotLeader
		}
		if errors.Is(err, raftgroup.ErrLeaderChanged) {
			return ErrLeaderChanged
		}
		return err
	}
	switch res.(applyResult).reject {
	case accepted:
		return nil
	case rejectBadSplit:
		return ErrBadSplitKey
	case rejectStaleTerm:
		return ErrLeaderChanged
	default:
		return fmt.Errorf("partition %d: split rejected (%d)", p.id, res.(applyResult).reject)
	}
}

// applySplit applies cmdSplit; see the comment at the top of the file.
func (p *Partition) applySplit(ac *raftgroup.ApplyContext, e *raftpb.Entry, c *command) applyResult {
	key, child := c.keys[0], c.child
	sp := p.sp.Load()
	conf := p.group.AppliedConf()
	if !p.SplitKeyOK(key) || child == p.id || child == 0 || len(conf.VotersOutgoing) > 0 {
		p.log.Error("split outside the span or to an invalid group rejected", "key", fmt.Sprintf("%q", key), "child", child, "index", e.Index)
		p.metrics.rejected.WithLabelValues("bad_split").Inc()
		return applyResult{reject: rejectBadSplit}
	}
	for _, r := range p.Splits() {
		if r.Child == child {
			p.metrics.rejected.WithLabelValues("bad_split").Inc()
			return applyResult{reject: rejectBadSplit}
		}
	}
	b := ac.Batch
	p.sm.closed = max(p.sm.closed, c.closed)
	p.saveState(b)
	rec := SplitRecord{Key: append([]byte(nil), key...), End: sp.end, Child: child, Closed: p.sm.closed}
	splits := append(append([]SplitRecord(nil), p.Splits()...), rec)
	mustSet(b, p.splitsKey(), encodeSplits(splits))
	mustSet(b, p.spanKey(), encodeSpan(sp.start, key))

	has, err := raftgroup.HasState(p.db, child)
	if err != nil {
		panic(fmt.Errorf("partition %d: split: %w", p.id, err))
	}
	if has {
		// The child's replica came here another way first (a snapshot
		// while this replica lagged); its state is newer than ours.
		p.log.Warn("split child already has a replica here; keeping it", "child", child)
	} else {
		mustSet(b, engine.GroupKey(child, "span"), encodeSpan(key, sp.end))
		cs := smState{closed: p.sm.closed, compact: p.sm.compact}
		mustSet(b, engine.GroupKey(child, "part"), engine.PutUint64(engine.PutUint64(nil, uint64(cs.closed)), uint64(cs.compact)))
		if err := raftgroup.WriteBootstrap(b, child, conf); err != nil {
			panic(fmt.Errorf("partition %d: split: %w", p.id, err))
		}
	}
	if !has {
		if err := p.copyEvents(b, key, sp.end, child); err != nil {
			panic(fmt.Errorf("partition %d: split: copying event records: %w", p.id, err))
		}
	}
	closed := p.sm.closed
	ac.AfterCommit(func() {
		p.sp.Store(&span{start: sp.start, end: key})
		p.splits.Store(&splits)
		p.index.dropFrom(string(key))
		p.log.Info("split", "key", fmt.Sprintf("%q", key), "child", child, "closed", closed)
		// Subscribers learn of the split when they resubscribe (the
		// record comes with the subscription), before any closed
		// revision above it.
		p.endSubscriptions(false)
		p.published(RevEvents{}, closed)
		if p.onSplit != nil {
			p.onSplit(rec)
		}
	})
	return applyResult{}
}

// copyEvents copies the events of keys in [key, end) from this
// partition's event log (committed, and this round's records) to child's.
func (p *Partition) copyEvents(b *pebble.Batch, key, end []byte, child uint64) error {
	lo, hi := p.eventBounds()
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	copyRecord := func(rev int64, v []byte) error {
		muts, err := decodeEventRecord(v)
		if err != nil {
			return err
		}
		// Keys at or above end left with an earlier split.
		var moved []mutation
		for _, m := range muts {
			if bytes.Compare(m.key, key) >= 0 && (len(end) == 0 || bytes.Compare(m.key, end) < 0) {
				moved = append(moved, m)
			}
		}
		if len(moved) > 0 {
			mustSet(b, eventKey(child, rev), encodeEventRecord(moved))
		}
		return nil
	}
	for it.First(); it.Valid(); it.Next() {
		rev := int64(engineUint64(it.Key()[9:]))
		if _, ok := p.roundEvents[rev]; ok {
			continue
		}
		if err := copyRecord(rev, it.Value()); err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return err
	}
	for rev, v := range p.roundEvents {
		if err := copyRecord(rev, v); err != nil {
			return err
		}
	}
	return nil
}

// encodeEventRecord encodes an event log record (see applyWrite).
func encodeEventRecord(muts []mutation) []byte {
	rec := binary.AppendUvarint(nil, uint64(len(muts)))
	for _, m := range muts {
		rec = append(rec, m.kind)
		rec = binary.AppendUvarint(rec, uint64(len(m.key)))
		rec = append(rec, m.key...)
	}
	return rec
}

// Covers reports whether [key, end) lies within the partition's span (end
// nil: the single key; empty: unbounded). Readers check it after reading:
// spans only shrink, so a range covered after the read was covered during
// it.
func (p *Partition) Covers(key, end []byte) bool {
	sp := p.sp.Load()
	if !sp.contains(key) {
		return false
	}
	if end == nil {
		return true
	}
	if len(sp.end) == 0 {
		return true
	}
	return len(end) != 0 && bytes.Compare(end, sp.end) <= 0
}

// Load and size, for automatic splits (the server's split driver).

// loadStats counts the writes a leader applies and samples their keys
// (reservoir sampling), per window; TakeLoad ends a window.
type loadStats struct {
	mu     sync.Mutex
	writes int64    // protected by mu
	sample [][]byte // protected by mu
	rng    uint64   // protected by mu
}

const loadSampleSize = 512

func (l *loadStats) note(key []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes++
	if len(l.sample) < loadSampleSize {
		l.sample = append(l.sample, key)
		return
	}
	// xorshift: cheap and good enough for sampling.
	l.rng ^= l.rng << 13
	l.rng ^= l.rng >> 7
	l.rng ^= l.rng << 17
	if i := l.rng % uint64(l.writes); i < loadSampleSize {
		l.sample[i] = key
	}
}

// TakeLoad returns the writes this replica evaluated as leader since the
// last call, and the median of a sample of their keys (nil if none lies
// strictly inside the span); it starts a new window.
func (p *Partition) TakeLoad() (writes int64, median []byte) {
	l := &p.load
	l.mu.Lock()
	writes, sample := l.writes, l.sample
	l.writes, l.sample = 0, nil
	l.mu.Unlock()
	sort.Slice(sample, func(i, j int) bool { return bytes.Compare(sample[i], sample[j]) < 0 })
	// The median, or the nearest key after it that can split (a hot key
	// sampled often cannot split from itself).
	for i := len(sample) / 2; i < len(sample); i++ {
		if p.SplitKeyOK(sample[i]) {
			return writes, sample[i]
		}
	}
	return writes, nil
}

// Keys returns the number of keys (live or deleted but not yet purged) in
// the partition's index.
func (p *Partition) Keys() int { return p.index.len() }

// MedianKey returns the middle key of the index, if it can split.
func (p *Partition) MedianKey() []byte {
	k := p.index.nth(p.index.len() / 2)
	if k == nil || !p.SplitKeyOK(k) {
		return nil
	}
	return k
}
