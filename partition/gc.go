package partition

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2"
)

// Compaction.
//
// Compact(rev) proposes cmdCompact; once applied, reads below rev are
// refused (by the caller, against the cluster's compaction revision) and
// every replica's gc goroutine removes, in the background:
//
//   - versions older than the newest version <= rev of each key, and that
//     version too when it is a tombstone: nothing can read them any more, and
//     nothing ever writes at or below the closed revision, so deleting them
//     races with no apply;
//   - event log records below rev.
//
// Index keys of keys deleted at or below rev are dropped through the log
// (cmdPurge, proposed by the leader under write latches and re-checked at
// apply), because the index key is live state that a concurrent put
// rewrites.
type gcState struct {
	p      *Partition
	mu     sync.Mutex
	target int64         // protected by mu
	done   int64         // protected by mu
	doneCh chan struct{} // closed when done advances; protected by mu
	wake   chan struct{}
	stopc  chan struct{}
	wg     sync.WaitGroup
}

func (g *gcState) init(p *Partition) {
	g.p = p
	g.doneCh = make(chan struct{})
	g.wake = make(chan struct{}, 1)
	g.stopc = make(chan struct{})
	g.target = p.sm.compact
	// Whatever was compacted before a restart may not have been collected.
	g.done = 0
}

func (g *gcState) start() {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.run()
	}()
	g.kick()
}

func (g *gcState) stop() {
	select {
	case <-g.stopc:
	default:
		close(g.stopc)
	}
	g.wg.Wait()
}

func (g *gcState) kick() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// compacted runs after a compaction revision applies.
func (p *Partition) compacted(rev int64) {
	p.compact.Store(rev)
	p.gc.mu.Lock()
	if rev > p.gc.target {
		p.gc.target = rev
	}
	p.gc.mu.Unlock()
	p.gc.kick()
}

func (g *gcState) run() {
	for {
		select {
		case <-g.stopc:
			return
		case <-g.wake:
		}
		g.mu.Lock()
		target, done := g.target, g.done
		g.mu.Unlock()
		if target <= done {
			continue
		}
		if err := g.p.collect(target); err != nil {
			if errors.Is(err, raftgroup.ErrNotLeader) || errors.Is(err, raftgroup.ErrLeaderChanged) || errors.Is(err, raftgroup.ErrStopped) {
				// The leadership moved while this replica purged deleted
				// keys' index records (cmdPurge): the retry collects as a
				// follower, and whoever leads at the next compaction purges
				// what is left (every compaction scans every key).
				g.p.log.Info("compaction garbage collection stopped purging: the leadership moved; will retry", "rev", target, "err", err)
			} else {
				g.p.log.Error("compaction garbage collection failed; will retry", "rev", target, "err", err)
			}
			select {
			case <-g.stopc:
				return
			case <-time.After(time.Second):
			}
			g.kick()
			continue
		}
		g.mu.Lock()
		g.done = target
		close(g.doneCh)
		g.doneCh = make(chan struct{})
		g.mu.Unlock()
	}
}

// WaitCollected waits until garbage below rev has been collected here.
func (p *Partition) WaitCollected(ctx context.Context, rev int64) error {
	for {
		p.gc.mu.Lock()
		done, ch := p.gc.done, p.gc.doneCh
		p.gc.mu.Unlock()
		if done >= rev {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Compact proposes compaction at rev on this partition (leader only) and
// waits for it to apply.
func (p *Partition) Compact(ctx context.Context, rev int64) error {
	// Every write at or below rev must have applied before any version
	// below it is collected.
	if err := p.WaitClosed(ctx, rev); err != nil {
		return err
	}
	p.prop.Lock()
	ready, term := p.prop.ready, p.prop.term
	p.prop.Unlock()
	if !ready {
		return ErrNotLeader
	}
	_, err := p.group.Propose(ctx, (&command{kind: cmdCompact, term: term, rev: rev}).encode())
	return err
}

const gcBatchOps = 4096

func (p *Partition) collect(rev int64) error {
	start, end := rangeBounds(p.Span())
	it, err := p.db.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return err
	}
	defer it.Close()
	b := p.db.NewBatch()
	defer func() { b.Close() }()
	flush := func() error {
		if b.Count() == 0 {
			return nil
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			return err
		}
		b.Close()
		b = p.db.NewBatch()
		return nil
	}
	var dead [][]byte
	var prefix []byte
	var idxTomb bool
	var idxMod int64
	keptBelow := false // the newest version <= rev of the current key was seen
	for it.First(); it.Valid(); it.Next() {
		pre, suffix, ok := splitMVCCKey(it.Key())
		if !ok {
			return errCorrupt
		}
		if suffix == 0 {
			prefix = append(prefix[:0], pre...)
			m, err := decodeMeta(it.Value())
			if err != nil {
				return err
			}
			idxTomb, idxMod, keptBelow = m.tombstone, m.mod, false
			if idxTomb && idxMod <= rev {
				k, err := userKey(prefix)
				if err != nil {
					return err
				}
				dead = append(dead, k)
			}
			continue
		}
		if !bytes.Equal(pre, prefix) {
			// Versions without an index record: the leader purged the
			// key (a tombstone at or below the compaction revision, see
			// cmdPurge) before this replica collected its versions, which
			// are all garbage then.
			prefix = append(prefix[:0], pre...)
			idxTomb, idxMod, keptBelow = true, 0, true
		}
		vrev := int64(^suffix)
		if vrev > rev {
			continue
		}
		if !keptBelow {
			keptBelow = true
			// The newest version at or below rev stays readable at rev,
			// unless the key is deleted there.
			if len(it.Value()) > 0 && it.Value()[0]&flagTombstone == 0 {
				continue
			}
		}
		if err := b.Delete(it.Key(), nil); err != nil {
			return err
		}
		if b.Count() >= gcBatchOps {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	if err := b.DeleteRange(eventKey(p.id, 0), eventKey(p.id, rev), nil); err != nil {
		return err
	}
	if err := flush(); err != nil {
		return err
	}
	return p.purge(rev, dead)
}

// purge drops the index keys of keys deleted at or below rev, through the
// log. Only the leader proposes; followers apply its commands.
func (p *Partition) purge(rev int64, keys [][]byte) error {
	for len(keys) > 0 {
		n := min(len(keys), 256)
		chunk := keys[:n]
		keys = keys[n:]
		p.prop.Lock()
		ready, term := p.prop.ready, p.prop.term
		p.prop.Unlock()
		if !ready {
			return nil
		}
		spans := make([]latchSpan, len(chunk))
		for i, k := range chunk {
			spans[i] = keySpan(k, nil, true)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		g, err := p.latches.acquire(ctx, spans)
		if err == nil {
			_, err = p.group.Propose(ctx, (&command{kind: cmdPurge, term: term, rev: rev, keys: chunk}).encode())
			p.latches.release(g)
		}
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}
