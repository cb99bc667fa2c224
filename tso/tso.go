package tso

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/internal/bugs"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"
)

// ErrNotLeader is returned by Next on a replica that is not the serving
// leader.
var ErrNotLeader = errors.New("tso: not leader")

// InitialRevision is the revision of a fresh, empty store.
const InitialRevision = 1

// Config configures an Oracle.
type Config struct {
	// WindowSize is how many revisions one raft extension reserves; default
	// 1000. Larger means fewer log writes and larger gaps after a crash.
	WindowSize int64
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

func (c *Config) ensureDefaults() {
	if c.WindowSize == 0 {
		c.WindowSize = 1000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Oracle is the TSO state machine and, on the leader, the allocator.
type Oracle struct {
	cfg     Config
	db      *pebble.DB
	groupID uint64
	group   atomic.Pointer[raftgroup.Group] // nil until this node has a replica
	log     *slog.Logger

	// shrunk: the last window command applied was a shrink (diagnostics).
	shrunk atomic.Bool
	// end is the applied window end W, published once the round that
	// applied it has committed (AfterCommit).
	end atomic.Int64
	// applyEnd is the window end as of the last command applied, its
	// round's batch committed or not: what the next command in the same
	// round builds on. Worker goroutine only (New, Apply, SnapshotApplied).
	applyEnd int64
	// current is the highest revision issued (or, before this replica led,
	// the applied W). Readers use it without the lock.
	current atomic.Int64

	mu struct {
		sync.Mutex
		leader    bool          // protected by mu
		term      uint64        // protected by mu
		next      int64         // next revision to issue; protected by mu
		extending bool          // an extension is in flight; protected by mu
		changed   chan struct{} // closed when end or leadership changes
		closed    bool
		// pausedTerm: issuing is paused in this leader term for a
		// leadership transfer (PrepareTransfer); protected by mu.
		pausedTerm uint64
		// barrier: after a Resume, nothing is issued until an extension
		// proposed after it has applied. A shrink PrepareTransfer proposed
		// may still commit after Resume (its proposal timed out, not
		// failed); the extension orders after it in the log, so the
		// window a next leader starts from covers what was issued.
		// Protected by mu.
		barrier bool
	}
	// conf batches leadership confirmations.
	conf struct {
		sync.Mutex
		waiting  []chan error // protected by conf
		inflight bool         // protected by conf
	}

	// requests counts the Next calls this node's leader answered.
	requests atomic.Int64
	issued   prometheus.Counter
	extends  prometheus.Counter
	batch    prometheus.Histogram
}

// New creates the oracle for raft group groupID, loading its applied state.
// Call Bind with the group once it is created.
func New(cfg Config, db *pebble.DB, groupID uint64) (*Oracle, error) {
	cfg.ensureDefaults()
	o := &Oracle{cfg: cfg, db: db, groupID: groupID, log: cfg.Logger.With("component", "tso")}
	o.mu.changed = make(chan struct{})
	end := int64(InitialRevision)
	v, closer, err := db.Get(o.stateKey())
	switch err {
	case nil:
		end = int64(binary.BigEndian.Uint64(v))
		closer.Close()
	case pebble.ErrNotFound:
	default:
		return nil, fmt.Errorf("tso: load state: %w", err)
	}
	o.end.Store(end)
	o.applyEnd = end
	// Only a leader knows what it issued; until this replica leads it
	// claims nothing (a follower's window end may be above revisions the
	// leader has not issued yet, so it is no safe bound).
	o.current.Store(0)
	o.issued = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_tso_revisions_issued_total", Help: "Revisions issued by this node's TSO leader."})
	o.extends = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_tso_window_extensions_total", Help: "TSO window extensions written through raft."})
	o.batch = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "brain_tso_confirm_batch_size", Help: "TSO requests sharing one leadership confirmation (a ReadIndex round).", Buckets: prometheus.ExponentialBuckets(1, 2, 10)})
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(o.issued, o.extends, o.batch)
	}
	return o, nil
}

// Requests returns how many requests for revisions (Next calls) this
// node answered as the leader, since it started.
func (o *Oracle) Requests() int64 { return o.requests.Load() }

// Bind attaches the oracle to its raft group.
func (o *Oracle) Bind(g *raftgroup.Group) { o.group.Store(g) }

func (o *Oracle) stateKey() []byte { return engine.GroupKey(o.groupID, "tso") }

// End returns the applied window end: no revision above it was issued.
func (o *Oracle) End() int64 { return o.end.Load() }

// Current returns the highest revision this replica issued as leader (0 if
// it never led). On the serving leader, every revision a write has been
// acknowledged with is <= Current(); elsewhere use a Client.
func (o *Oracle) Current() int64 { return o.current.Load() }

// Serving reports whether this replica is the leader issuing revisions.
func (o *Oracle) Serving() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.leader && !o.mu.closed && o.mu.pausedTerm != o.mu.term
}

// ConfirmedCurrent returns Current after confirming, with a quorum, that
// this replica still leads: no other leader can have issued revisions it
// does not know of.
func (o *Oracle) ConfirmedCurrent(ctx context.Context) (int64, error) {
	if err := o.confirm(ctx); err != nil {
		return 0, err
	}
	if !o.Serving() {
		return 0, ErrNotLeader
	}
	return o.current.Load(), nil
}

// confirm establishes that this replica was the group's leader at some
// moment after confirm was called (a ReadIndex round, shared by all the
// callers that arrived before it started). A sole voter needs none.
func (o *Oracle) confirm(ctx context.Context) error {
	if o.group.Load().SoleVoter() {
		return nil
	}
	ch := make(chan error, 1)
	o.conf.Lock()
	o.conf.waiting = append(o.conf.waiting, ch)
	if !o.conf.inflight {
		o.conf.inflight = true
		go o.confirmRounds()
	}
	o.conf.Unlock()
	select {
	case err := <-ch:
		if err != nil {
			return fmt.Errorf("%w: %v", ErrNotLeader, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (o *Oracle) confirmRounds() {
	for {
		o.conf.Lock()
		batch := o.conf.waiting
		o.conf.waiting = nil
		if len(batch) == 0 {
			o.conf.inflight = false
			o.conf.Unlock()
			return
		}
		o.conf.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := o.group.Load().ReadIndex(ctx)
		cancel()
		o.batch.Observe(float64(len(batch)))
		for _, ch := range batch {
			ch <- err
		}
	}
}

// Next issues n consecutive revisions and returns the first. A leader
// confirms it still leads (after the call began) before issuing, so a
// deposed leader that does not know it issues nothing.
func (o *Oracle) Next(ctx context.Context, n int64) (int64, error) {
	if n <= 0 {
		return 0, fmt.Errorf("tso: Next(%d): n must be positive", n)
	}
	if err := o.confirm(ctx); err != nil {
		return 0, err
	}
	o.mu.Lock()
	for {
		if o.mu.closed || !o.mu.leader || o.mu.pausedTerm == o.mu.term {
			o.mu.Unlock()
			return 0, ErrNotLeader
		}
		end := o.end.Load()
		if !o.mu.barrier && o.mu.next+n-1 <= end {
			first := o.mu.next
			o.mu.next += n
			o.current.Store(o.mu.next - 1)
			// Extend ahead of need so writers rarely wait on the log.
			if end-o.mu.next < o.cfg.WindowSize/2 {
				o.extendLocked(end)
			}
			o.mu.Unlock()
			o.issued.Add(float64(n))
			o.requests.Add(1)
			return first, nil
		}
		o.extendLocked(max(end, o.mu.next+n-1))
		ch := o.mu.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		o.mu.Lock()
	}
}

func (o *Oracle) extendLocked(from int64) {
	if o.mu.extending {
		return
	}
	o.mu.extending = true
	o.extends.Inc()
	cmd := encodeCmd(cmdExtend, o.mu.term, from+o.cfg.WindowSize)
	// No shrink is in flight behind an extension proposed under the
	// barrier (Resume lifts the pause only after PrepareTransfer's shrink
	// was proposed, and none is proposed while issuing), so once it has
	// applied the barrier can go.
	lifts := o.mu.barrier
	o.group.Load().ProposeAsync(cmd, func(res any, err error) {
		o.mu.Lock()
		o.mu.extending = false
		if err == nil && res == cmdApplied && lifts {
			o.mu.barrier = false
		}
		o.notifyLocked()
		o.mu.Unlock()
	})
}

func (o *Oracle) notifyLocked() {
	close(o.mu.changed)
	o.mu.changed = make(chan struct{})
}

// Close shrinks the window to the last issued revision (so a clean restart
// continues without a gap) and stops issuing.
func (o *Oracle) Close(ctx context.Context) error {
	o.mu.Lock()
	if o.mu.closed {
		o.mu.Unlock()
		return nil
	}
	o.mu.closed = true
	leader, term, last := o.mu.leader, o.mu.term, o.mu.next-1
	o.notifyLocked()
	o.mu.Unlock()
	if !leader {
		return nil
	}
	_, err := o.group.Load().Propose(ctx, encodeCmd(cmdShrink, term, last))
	return err
}

// PrepareTransfer readies a planned leadership transfer: this leader stops
// issuing and shrinks the window to the last revision it issued, so the
// next leader continues the sequence without a gap (a failover, by
// contrast, skips the rest of the window). Call Resume if the transfer
// does not happen; a new leadership term resumes by itself. It returns the
// leader term it readied: transfer only that term's leadership.
func (o *Oracle) PrepareTransfer(ctx context.Context) (uint64, error) {
	o.mu.Lock()
	if !o.mu.leader || o.mu.closed {
		o.mu.Unlock()
		return 0, ErrNotLeader
	}
	term := o.mu.term
	o.mu.pausedTerm = term
	o.notifyLocked()
	// An extension in flight would re-extend the window after the shrink.
	for o.mu.extending {
		ch := o.mu.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			o.Resume()
			return 0, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		o.mu.Lock()
	}
	last := o.mu.next - 1
	o.mu.Unlock()
	res, err := o.group.Load().Propose(ctx, encodeCmd(cmdShrink, term, last))
	if err != nil {
		o.Resume()
		return 0, err
	}
	if res != cmdApplied {
		// This node lost the leadership of term before the shrink was
		// appended (raft forwarded it to the next leader, whose term
		// rejected it): the window was not shrunk.
		o.Resume()
		return 0, ErrNotLeader
	}
	return term, nil
}

// Resume lets a leader paused by PrepareTransfer issue again, once an
// extension proposed now has applied (see barrier).
func (o *Oracle) Resume() {
	o.mu.Lock()
	if o.mu.pausedTerm != 0 {
		o.mu.barrier = true
	}
	o.mu.pausedTerm = 0
	o.notifyLocked()
	o.mu.Unlock()
}

// Apply's results: a command evaluated by a leader of another term is
// stale and changes nothing (a forwarded proposal of a deposed leader).
type cmdResult int

const (
	cmdApplied cmdResult = iota + 1
	cmdStale
)

// Commands.
const (
	cmdExtend byte = 1
	cmdShrink byte = 2
)

func encodeCmd(kind byte, term uint64, end int64) []byte {
	b := append(raftgroup.NewCommand(17), kind)
	b = binary.BigEndian.AppendUint64(b, term)
	return binary.BigEndian.AppendUint64(b, uint64(end))
}

// Apply implements raftgroup.StateMachine.
func (o *Oracle) Apply(ac *raftgroup.ApplyContext, e *raftpb.Entry, cmd []byte) any {
	if len(cmd) != 17 {
		o.log.Error("malformed tso command; ignored", "index", e.Index)
		return nil
	}
	kind, term, end := cmd[0], binary.BigEndian.Uint64(cmd[1:9]), int64(binary.BigEndian.Uint64(cmd[9:17]))
	// A command evaluated by a leader of another term is stale: a newer
	// leader may already be issuing from the applied window.
	if term != e.Term {
		return cmdStale
	}
	// Whether the window's last change was a shrink: a leader starting
	// after one continues the sequence; after an extension (a failover)
	// it skips the rest of the window.
	o.shrunk.Store(kind == cmdShrink)
	// Not o.end: a command earlier in this round may have changed the
	// window without its batch being committed yet (a replica catching
	// up applies a shrink and the extension after it in one round; an
	// extension compared with the window before the shrink would seem to
	// change nothing, and the window would stay shrunk below revisions
	// the leader issued).
	cur := o.applyEnd
	var next int64
	switch kind {
	case cmdExtend:
		next = max(cur, end)
	case cmdShrink:
		next = min(cur, max(end, InitialRevision))
	default:
		o.log.Error("unknown tso command; ignored", "kind", kind, "index", e.Index)
		return nil
	}
	if next == cur {
		return cmdApplied
	}
	o.applyEnd = next
	if err := ac.Batch.Set(o.stateKey(), engine.PutUint64(nil, uint64(next)), nil); err != nil {
		panic(err)
	}
	ac.AfterCommit(func() {
		if kind == cmdShrink {
			o.log.Info("tso window shrunk for a planned transfer", "term", term, "end", next)
		}
		o.end.Store(next)
		o.mu.Lock()
		o.notifyLocked()
		o.mu.Unlock()
	})
	return cmdApplied
}

// LeadershipChanged implements raftgroup.LeadershipObserver.
func (o *Oracle) LeadershipChanged(leader bool, term uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mu.leader, o.mu.term = leader, term
	// A new term starts from the applied window, which orders after any
	// shrink of an earlier term.
	o.mu.barrier = false
	if leader {
		o.mu.next = o.end.Load() + 1
		if bugs.On("reuse-revision") {
			// Two windows below the end is below what the last leader
			// issued, whether its window was shrunk or not.
			o.mu.next = max(InitialRevision+1, o.mu.next-2*o.cfg.WindowSize)
		}
		o.current.Store(o.mu.next - 1)
		o.log.Info("tso leader ready", "term", term, "next", o.mu.next, "after_planned_transfer", o.shrunk.Load())
	}
	o.notifyLocked()
}

// WaitReady blocks until this replica is the serving leader.
func (o *Oracle) WaitReady(ctx context.Context) error {
	for {
		o.mu.Lock()
		leader, ch := o.mu.leader, o.mu.changed
		o.mu.Unlock()
		if leader {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WriteRestoredState writes the state of a TSO restored from a backup taken
// at revision rev: the next revision issued is rev+1.
func WriteRestoredState(b *pebble.Batch, groupID uint64, rev int64) error {
	return b.Set(engine.GroupKey(groupID, "tso"), engine.PutUint64(nil, uint64(rev)), nil)
}

// WriteSnapshot implements raftgroup.Snapshotter.
func (o *Oracle) WriteSnapshot(r pebble.Reader, emit func(k, v []byte) error) error {
	v, closer, err := r.Get(o.stateKey())
	if err == pebble.ErrNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	return emit(o.stateKey(), v)
}

// ClearState implements raftgroup.Snapshotter.
func (o *Oracle) ClearState(b *pebble.Batch) error { return b.Delete(o.stateKey(), nil) }

// SnapshotApplied implements raftgroup.Snapshotter.
func (o *Oracle) SnapshotApplied() error {
	end := int64(InitialRevision)
	v, closer, err := o.db.Get(o.stateKey())
	switch err {
	case nil:
		end = int64(binary.BigEndian.Uint64(v))
		closer.Close()
	case pebble.ErrNotFound:
	default:
		return err
	}
	o.applyEnd = end
	o.end.Store(end)
	return nil
}
