package partition

import (
	"bytes"
	"container/heap"
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brainkv/brain/internal/bugs"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Errors of the write path.
var (
	// ErrNotLeader: this replica cannot evaluate writes.
	ErrNotLeader = errors.New("partition: not leader")
	// ErrLeaderChanged: the write may or may not have applied.
	ErrLeaderChanged = errors.New("partition: leader changed")
	// ErrOutsideRange: a key is not in this partition's span.
	ErrOutsideRange = errors.New("partition: key outside partition range")
	// ErrReplicaClosed: the replica stopped (it was removed from its group,
	// or its node is stopping) before the revision a reader waited for
	// became readable here; another replica can serve the read.
	ErrReplicaClosed = errors.New("partition: replica closed")
)

// Revisions is the partition's view of the TSO.
type Revisions interface {
	// Current returns a revision the TSO has issued, as high as known: a
	// lower bound of the TSO's current revision.
	Current() int64
	// Observe records that rev was issued (so Current is at least rev).
	Observe(rev int64)
	// Fresh returns the TSO's current revision, confirmed after the call
	// began: never below an acknowledged write.
	Fresh(ctx context.Context) (int64, error)
	// Next issues n consecutive revisions and returns the first.
	Next(ctx context.Context, n int64) (int64, error)
}

// Leases tells evaluation whether a lease may be attached to a key.
type Leases interface {
	// LeaseUsable reports whether lease id exists and is not being revoked,
	// in this node's (possibly stale) view.
	LeaseUsable(id int64) bool
	// Refresh brings this node's view up to date with every lease change
	// made before Refresh was called; a lease not usable locally is checked
	// again after it.
	Refresh(ctx context.Context) error
}

// RevEvents is the events of one revision, in the order of the ops that
// made them.
type RevEvents struct {
	Rev    int64
	Events []*mvccpb.Event
	// PrevValuesMissing: the events' PrevKv carry the previous version's
	// metadata but not its value; load it with Partition.PrevValue. The feed
	// publishes events this way so that apply reads nothing it may not need.
	PrevValuesMissing bool
}

// Feed receives what a partition applies through a Subscription, in apply
// order, once it is committed to Pebble: at most one revision of events
// (Rev 0 when none) and the partition's closed revision after it (0: no
// change). Live publishes run on a raft worker and must not block.
type Feed interface {
	Publish(partition uint64, evs RevEvents, closed int64)
}

// Metrics are shared by all partitions of a node.
type Metrics struct {
	rejected   *prometheus.CounterVec
	closedLag  *prometheus.GaugeVec
	writes     prometheus.Counter
	retries    prometheus.Counter
	lateWrites prometheus.Counter
}

// NewMetrics creates and registers (if reg is not nil) partition metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brain_partition_rejected_commands_total",
			Help: "Partition commands rejected deterministically at apply, by reason.",
		}, []string{"reason"}),
		closedLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "brain_partition_closed_revision_lag",
			Help: "Revisions between the TSO's current revision and the partition's closed revision, as seen by this node.",
		}, []string{"partition"}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_partition_writes_total", Help: "Writes that consumed a revision and applied.",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_partition_write_retries_total", Help: "Writes re-proposed with a new revision after an apply rejection.",
		}),
		lateWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brain_partition_abandoned_writes_total", Help: "Writes whose caller gave up while their command was in the log (their latches stay held until it applies or fails).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.rejected, m.closedLag, m.writes, m.retries, m.lateWrites)
	}
	return m
}

// Config configures a Partition.
type Config struct {
	// ID is the raft group ID.
	ID uint64
	// Start and End bound the partition's user keys: [Start, End). An empty
	// End means no upper bound. Both nil: the span persisted by an earlier
	// start or snapshot, or, if none, a new replica whose span comes with
	// its first snapshot.
	Start, End []byte
	DB         *pebble.DB
	Revisions  Revisions
	Leases     Leases
	Metrics    *Metrics
	Logger     *slog.Logger
	// ForwardClose, if set, asks the partition's leader elsewhere to close
	// rev; a follower calls it when a reader waits for a revision.
	ForwardClose func(rev int64)
	// Overlaps, if set, reports whether another partition's initialized
	// replica on this node overlaps [start, end) (snapshot check).
	Overlaps func(id uint64, start, end []byte) bool
	// OnSplit, if set, runs after a split committed here (on the raft
	// worker: it must not block); the child's state and raft bootstrap
	// state are in the DB then.
	OnSplit func(SplitRecord)
	// OnLeader, if set, runs on its own goroutine each time this replica
	// becomes a leader ready to serve (a node that waits for a replica to
	// hear a leader before serving it knows then that it may).
	OnLeader func()
}

// Partition is one replica of a key range. Files:
//
//	partition.go  the type, leadership, the write path and closed revisions
//	apply.go      the state machine (Apply) and its persisted state
//	eval.go       evaluation of etcd requests (ported from etcd)
//	mvcc.go       the MVCC encoding and reads
//	read.go       reads at a closed revision and event catch-up
//	lease.go      lease-driven deletes and lease key listing
//	gc.go         compaction
//
// Locking: prop.mu protects the leader's proposal state; it is taken
// before raftgroup's internal locks and never while waiting.
type Partition struct {
	id uint64
	// sp is the partition's span: set at start or by a snapshot, and
	// shrunk by a split (split.go); read it once per operation.
	sp           atomic.Pointer[span]
	db           *pebble.DB
	revs         Revisions
	leases       Leases
	metrics      *Metrics
	log          *slog.Logger
	group        *raftgroup.Group
	latches      *latchManager
	lagGauge     prometheus.Gauge
	forwardClose func(rev int64)

	// sm is owned by the apply goroutine (raft worker).
	sm smState
	// index is the latest meta of every key, in memory; round holds the
	// metas written by commands applied in the current, not yet committed,
	// apply round (owned by the apply goroutine).
	index *keyIndex
	round map[string]meta
	// roundEvents holds the event records written by the current apply
	// round (not yet committed), for a split in the same round; owned by
	// the apply goroutine.
	roundEvents map[int64][]byte
	// load counts the leader's writes for the split driver (split.go).
	load loadStats
	// splits are the partition's split records (split.go).
	splits   atomic.Pointer[[]SplitRecord]
	onSplit  func(SplitRecord)
	onLeader func()
	overlaps func(id uint64, start, end []byte) bool

	// closed is the applied closed revision.
	closed atomic.Int64
	// waiting holds readers waiting for a revision to become readable, by
	// revision; nwaiting counts them, so applies skip the bound when none
	// wait. waiting.Mutex is taken after prop's, never before.
	waiting struct {
		sync.Mutex
		h waiterHeap // protected by waiting
	}
	nwaiting atomic.Int64
	// compact is the applied compaction revision.
	compact atomic.Int64
	// initialized: the replica has its span (a replica added to the group
	// gets it with its first snapshot).
	initialized atomic.Bool
	// stopped: Close was called; readers no longer wait here.
	stopped atomic.Bool

	prop struct {
		sync.Mutex
		ready    bool       // leader and ready to evaluate; protected by prop
		term     uint64     // leader term; protected by prop
		inflight *list.List // of *inflightWrite, registration order; protected by prop
		// unapplied counts proposed writes per revision that have not
		// applied and published yet; protected by prop.
		unapplied  map[int64]int
		lastClosed int64 // highest closed revision proposed; protected by prop
		demand     int64 // highest revision a reader waits to see closed; protected by prop
		closing    bool  // a close command is in flight; protected by prop
		// drainTerm: in this leader term a planned leadership transfer
		// waits for the writes in flight, and new writes are refused
		// before they take a revision (PrepareTransfer); protected by prop.
		drainTerm uint64
	}

	// soon decides when a follower forwards RequestCloseSoon; it sees
	// every applied closed revision.
	soon *CloseSoon

	gc gcState

	// subs are the feed subscriptions (subscribe.go); ptr is a snapshot of
	// list for the apply path.
	subs struct {
		sync.Mutex
		list   []*Subscription // protected by subs
		closed bool            // protected by subs
		ptr    atomic.Pointer[[]*Subscription]
	}
}

// inflightWrite is a write that holds (or is about to get) a revision but
// is not yet in the raft log. Its revision is > lowerBound.
type inflightWrite struct {
	elem       *list.Element
	lowerBound int64
}

// New creates a partition replica and loads its applied state. Bind it to
// its raft group before use.
func New(cfg Config) (*Partition, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	p := &Partition{
		id: cfg.ID, db: cfg.DB,
		revs: cfg.Revisions, leases: cfg.Leases, metrics: cfg.Metrics, forwardClose: cfg.ForwardClose, onSplit: cfg.OnSplit, onLeader: cfg.OnLeader, overlaps: cfg.Overlaps,
		log:     cfg.Logger.With("component", "partition", "partition", cfg.ID),
		latches: newLatchManager(),
	}
	p.lagGauge = cfg.Metrics.closedLag.WithLabelValues(strconv.FormatUint(cfg.ID, 10))
	p.prop.inflight = list.New()
	p.load.rng = cfg.ID*0x9E3779B97F4A7C15 | 1
	p.prop.unapplied = make(map[int64]int)
	p.soon = NewCloseSoon(func(rev int64) {
		if !p.stopped.Load() {
			p.RequestClose(rev)
		}
	})
	p.sp.Store(&span{start: cfg.Start, end: cfg.End})
	if err := p.loadSpan(cfg.Start != nil || cfg.End != nil); err != nil {
		return nil, err
	}
	if err := p.loadState(); err != nil {
		return nil, err
	}
	p.index = newKeyIndex()
	p.round = make(map[string]meta)
	if err := p.loadSplits(); err != nil {
		return nil, err
	}
	// A replica added to its group has no span until its first snapshot
	// (SnapshotApplied loads the index then). Its unset span reads as the
	// whole key space: loading the index over it would read every key of
	// every partition on the node, and a node creates added replicas under
	// its raft host's lock, so no group there ticks or hears its peers
	// meanwhile.
	if p.initialized.Load() {
		start, end := p.Span()
		if _, err := p.index.load(p.db, start, end); err != nil {
			return nil, err
		}
	}
	p.closed.Store(p.sm.closed)
	p.compact.Store(p.sm.compact)
	p.gc.init(p)
	return p, nil
}

// SetRevisions replaces the TSO (before Bind).
func (p *Partition) SetRevisions(r Revisions) { p.revs = r }

// Bind attaches the partition to its raft group and starts background work.
func (p *Partition) Bind(g *raftgroup.Group) {
	p.group = g
	p.gc.start()
}

// Close stops background work, ends the feed subscriptions, and fails
// the readers waiting for a revision with ErrReplicaClosed (a removed
// replica applies nothing more, so they would wait forever).
func (p *Partition) Close() {
	p.stopped.Store(true)
	p.waiting.Lock()
	for _, w := range p.waiting.h {
		close(w.ch)
	}
	p.waiting.h = nil
	p.nwaiting.Store(0)
	p.waiting.Unlock()
	p.endSubscriptions(true)
	p.gc.stop()
}

// ID returns the partition's raft group ID.
func (p *Partition) ID() uint64 { return p.id }

// Span returns the partition's key range [start, end).
func (p *Partition) Span() (start, end []byte) {
	s := p.sp.Load()
	return s.start, s.end
}

// span is a key range [start, end); end empty: unbounded.
type span struct{ start, end []byte }

func (s *span) contains(key []byte) bool {
	return bytes.Compare(key, s.start) >= 0 && (len(s.end) == 0 || bytes.Compare(key, s.end) < 0)
}

// Contains reports whether key belongs to this partition.
func (p *Partition) Contains(key []byte) bool { return p.sp.Load().contains(key) }

// Initialized reports whether the replica has its state (a replica added
// to its group waits for a snapshot).
func (p *Partition) Initialized() bool { return p.initialized.Load() }

// Closed returns the applied closed revision.
func (p *Partition) Closed() int64 { return p.closed.Load() }

// CompactRevision returns the applied compaction revision.
func (p *Partition) CompactRevision() int64 { return p.compact.Load() }

// IsLeader reports whether this replica evaluates writes.
func (p *Partition) IsLeader() bool {
	p.prop.Lock()
	defer p.prop.Unlock()
	return p.prop.ready
}

// LeadershipChanged implements raftgroup.LeadershipObserver.
func (p *Partition) LeadershipChanged(leader bool, term uint64) {
	p.prop.Lock()
	defer p.prop.Unlock()
	p.prop.ready, p.prop.term = leader, term
	// Everything below the applied closed revision is in the log. Writes
	// this replica proposed as leader may still apply (a later leader
	// commits them) until an entry of a later term applies here; a leader
	// is ready only once it applied one of its own term, so by then they
	// have applied or failed.
	p.prop.lastClosed = p.closed.Load()
	p.prop.closing = false
	if leader {
		p.maybeCloseLocked()
		if p.onLeader != nil {
			go p.onLeader()
		}
	}
	go p.notifyProgress() // readers may now use the leader-local bound (it takes prop)
}

// published runs after an apply commits.
func (p *Partition) published(evs RevEvents, closed int64) {
	if closed > p.closed.Load() {
		p.closed.Store(closed)
		p.soon.Closed(closed)
	}
	p.notifyProgress()
	p.lagGauge.Set(float64(p.revs.Current() - closed))
	if evs.Rev != 0 {
		p.metrics.writes.Inc()
	}
	p.publishToSubscribers(evs, closed)
}

// readWaiter is a reader waiting until its revision is readable here.
type readWaiter struct {
	rev int64
	ch  chan struct{}
}

type waiterHeap []*readWaiter

func (h waiterHeap) Len() int           { return len(h) }
func (h waiterHeap) Less(i, j int) bool { return h[i].rev < h[j].rev }
func (h waiterHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *waiterHeap) Push(x any)        { *h = append(*h, x.(*readWaiter)) }
func (h *waiterHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return w
}

// notifyProgress wakes the readers whose revision became readable: after
// an apply, an abandoned or failed write, or a leadership change. It
// computes the readable bound once, and only if readers wait.
func (p *Partition) notifyProgress() {
	if p.nwaiting.Load() == 0 {
		return
	}
	bound := max(p.closed.Load(), p.localClosed())
	p.waiting.Lock()
	for len(p.waiting.h) > 0 && p.waiting.h[0].rev <= bound {
		close(heap.Pop(&p.waiting.h).(*readWaiter).ch)
		p.nwaiting.Add(-1)
	}
	p.waiting.Unlock()
}

// localClosed is what a leader that is its group's only voter knows to be
// final without writing a close: no write in flight can get a revision at
// or below it, and every write proposed at or below it has applied and
// published. (With other voters, a deposed leader could not know of a new
// leader's writes; the cluster needs a leader lease for this.)
func (p *Partition) localClosed() int64 {
	p.prop.Lock()
	defer p.prop.Unlock()
	return p.localClosedLocked()
}

func (p *Partition) soleReadyLeader() bool {
	if p.group == nil || !p.group.SoleVoter() {
		return false
	}
	p.prop.Lock()
	defer p.prop.Unlock()
	return p.prop.ready
}

func (p *Partition) localClosedLocked() int64 {
	if !p.prop.ready || p.group == nil || !p.group.SoleVoter() {
		return 0
	}
	c := p.closeCandidateLocked()
	for rev := range p.prop.unapplied {
		c = min(c, rev-1)
	}
	return c
}

// ReadableAt reports whether a read at rev can proceed without waiting.
func (p *Partition) ReadableAt(rev int64) bool {
	return p.closed.Load() >= rev || p.localClosed() >= rev
}

// WaitClosed waits until revision rev is final here: the closed revision
// is >= rev (asking the leader to close it), or this replica, as sole
// voter and leader, knows nothing at or below rev is still to apply.
func (p *Partition) WaitClosed(ctx context.Context, rev int64) error {
	if p.ReadableAt(rev) {
		return nil
	}
	w := &readWaiter{rev: rev, ch: make(chan struct{})}
	p.waiting.Lock()
	heap.Push(&p.waiting.h, w)
	p.nwaiting.Add(1)
	p.waiting.Unlock()
	// Close sets stopped before it wakes the waiters: either it saw this
	// one, or this check sees stopped.
	if p.stopped.Load() {
		p.dropWaiter(w)
		return ErrReplicaClosed
	}
	// A sole-voter leader's own bound rises as the writes in flight below
	// rev apply; others need a close through the log.
	request := func() {
		if !p.soleReadyLeader() {
			p.RequestClose(rev)
		}
		p.notifyProgress() // it may have become readable meanwhile
	}
	request()
	// A request can be lost: forwarded before this node could reach the
	// leader (none elected yet, the store not started), or failed on
	// the way. Ask again while waiting, or a reader would wait forever
	// for a partition that takes no writes (its closed revision moves
	// only when asked).
	retry := time.NewTicker(closeRetryInterval)
	defer retry.Stop()
	for {
		select {
		case <-w.ch:
			if !p.ReadableAt(rev) {
				return ErrReplicaClosed // woken by Close
			}
			return nil
		case <-ctx.Done():
			p.dropWaiter(w)
			return ctx.Err()
		case <-retry.C:
			request()
		}
	}
}

// closeRetryInterval is how often a reader waiting for a revision to
// close asks for the close again.
const closeRetryInterval = 250 * time.Millisecond

// dropWaiter removes w from the waiting readers if it is still there.
func (p *Partition) dropWaiter(w *readWaiter) {
	p.waiting.Lock()
	defer p.waiting.Unlock()
	for i, x := range p.waiting.h {
		if x == w {
			heap.Remove(&p.waiting.h, i)
			p.nwaiting.Add(-1)
			return
		}
	}
}

// RequestClose asks the leader to close revision rev promptly through the
// log (if this replica is the leader; followers learn closes from the
// log). The watch hub needs closes in the log; readers need only
// ReadableAt.
//
// rev must be a revision the TSO has issued: the caller got it from the
// TSO, so the leader may close up to it without asking the TSO itself.
func (p *Partition) RequestClose(rev int64) {
	p.revs.Observe(rev)
	p.prop.Lock()
	if rev > p.prop.demand {
		p.prop.demand = rev
	}
	ready := p.prop.ready
	p.maybeCloseLocked()
	p.prop.Unlock()
	if !ready && p.forwardClose != nil && p.closed.Load() < rev {
		p.forwardClose(rev)
	}
}

// RequestCloseSoon is RequestClose for the watch frontier: on a follower
// the request goes to the leader as CloseSoon decides (at once if the
// partition is idle, else only if its closed revision stops moving below
// rev). Readers waiting on a revision use RequestClose (WaitClosed does).
func (p *Partition) RequestCloseSoon(rev int64) {
	p.revs.Observe(rev)
	if p.closed.Load() >= rev {
		return
	}
	p.prop.Lock()
	ready := p.prop.ready
	p.prop.Unlock()
	if ready || p.forwardClose == nil {
		p.RequestClose(rev)
		return
	}
	p.soon.Request(rev)
}

// closeCandidateLocked is the highest revision the leader can promise
// closed now: nothing issued yet is at or below the TSO's current revision
// except writes in flight, whose revisions are above their lower bounds.
func (p *Partition) closeCandidateLocked() int64 {
	c := p.revs.Current()
	if f := p.prop.inflight.Front(); f != nil {
		c = min(c, f.Value.(*inflightWrite).lowerBound)
	}
	return c
}

// maybeCloseLocked proposes a close command if a reader waits for one and
// none is in flight. Writes in flight carry the closed revision themselves
// when they are proposed.
func (p *Partition) maybeCloseLocked() {
	if !p.prop.ready || p.prop.closing || p.prop.demand <= p.prop.lastClosed {
		return
	}
	c := p.closeCandidateLocked()
	if c <= p.prop.lastClosed {
		return
	}
	p.prop.closing = true
	p.prop.lastClosed = c
	cmd := (&command{kind: cmdClose, term: p.prop.term, closed: c}).encode()
	p.group.ProposeAsync(cmd, func(res any, err error) {
		p.prop.Lock()
		defer p.prop.Unlock()
		p.prop.closing = false
		if err != nil || res.(applyResult).reject != accepted {
			p.prop.lastClosed = p.closed.Load()
		}
		p.maybeCloseLocked()
	})
}

// PrepareTransfer readies a planned leadership transfer: new writes are
// refused with ErrNotLeader before they take a revision (the gateway
// retries them at the next leader), and it returns once every write that
// took one has applied here. A transfer prepared this way leaves no gap in
// the revisions and fails no client's write. Call Resume if the transfer
// does not happen; a new leadership term resumes by itself. It returns the
// leader term it drained: transfer only that term's leadership.
func (p *Partition) PrepareTransfer(ctx context.Context) (uint64, error) {
	p.prop.Lock()
	if !p.prop.ready {
		p.prop.Unlock()
		return 0, ErrNotLeader
	}
	term := p.prop.term
	p.prop.drainTerm = term
	p.prop.Unlock()
	for {
		p.prop.Lock()
		still := p.prop.ready && p.prop.term == term
		drained := p.prop.inflight.Len() == 0 && len(p.prop.unapplied) == 0
		p.prop.Unlock()
		switch {
		case !still:
			return 0, ErrNotLeader
		case drained:
			return term, nil
		}
		select {
		case <-ctx.Done():
			p.Resume()
			return 0, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Resume lets a leader drained by PrepareTransfer accept writes again.
func (p *Partition) Resume() {
	p.prop.Lock()
	p.prop.drainTerm = 0
	p.prop.Unlock()
}

// register records a write about to ask the TSO for a revision.
func (p *Partition) register() (*inflightWrite, uint64, error) {
	p.prop.Lock()
	defer p.prop.Unlock()
	if !p.prop.ready || p.prop.drainTerm == p.prop.term {
		return nil, 0, ErrNotLeader
	}
	w := &inflightWrite{lowerBound: p.revs.Current()}
	w.elem = p.prop.inflight.PushBack(w)
	return w, p.prop.term, nil
}

func (p *Partition) abandon(w *inflightWrite) {
	p.prop.Lock()
	p.prop.inflight.Remove(w.elem)
	p.maybeCloseLocked()
	p.prop.Unlock()
	p.notifyProgress()
}

// proposeWrite moves w from in flight into the raft log (as cmd, whose
// closed revision it fills in) and waits for it to apply.
func (p *Partition) proposeWrite(ctx context.Context, w *inflightWrite, term uint64, rev int64, cmd []byte) (applyResult, error) {
	done := make(chan struct{})
	var res applyResult
	var perr error
	p.prop.Lock()
	p.prop.inflight.Remove(w.elem)
	if !p.prop.ready || p.prop.term != term {
		p.maybeCloseLocked()
		p.prop.Unlock()
		return applyResult{}, ErrNotLeader
	}
	c := p.closeCandidateLocked()
	if bugs.On("write-below-closed") {
		c = rev + 1
	}
	setClosed(cmd, c)
	p.prop.lastClosed = max(p.prop.lastClosed, c)
	p.prop.unapplied[rev]++
	// A client's write must learn whether it applied even if this leader
	// is deposed first: the next leader may commit it (ProposeAsyncFate).
	p.group.ProposeAsyncFate(cmd, func(r any, err error) {
		if err == nil {
			res = r.(applyResult)
		}
		perr = err
		// Runs after the entry's apply hooks (index, feed), or once it
		// failed to propose.
		p.prop.Lock()
		if p.prop.unapplied[rev]--; p.prop.unapplied[rev] == 0 {
			delete(p.prop.unapplied, rev)
		}
		if err != nil {
			p.prop.lastClosed = p.closed.Load()
		}
		p.prop.Unlock()
		if err != nil {
			p.notifyProgress() // a failed proposal publishes nothing
		}
		close(done)
	})
	p.maybeCloseLocked()
	p.prop.Unlock()
	// Wait for the command's fate even when the caller gives up: the
	// caller's latches must stay held until it applied or failed, or a
	// later request on the same keys would evaluate (compare, read) a
	// state the command then changes under it. The fate is known within
	// about three election timeouts: a leader that cannot commit steps
	// down (CheckQuorum) and learns its proposals' fate from the next
	// leader's entries, or fails them after raftgroup's FateGrace.
	select {
	case <-done:
		return res, perr
	case <-ctx.Done():
	}
	p.metrics.lateWrites.Inc()
	select {
	case <-done:
		// Applied or failed; its caller is gone and learns nothing.
		return res, ctx.Err()
	case <-time.After(lateWriteBound):
		p.log.Error("a write's command neither applied nor failed in time; releasing its latches", "rev", rev, "bound", lateWriteBound)
		return applyResult{}, ctx.Err()
	}
}

// lateWriteBound bounds how long a write whose caller gave up waits for its
// command's fate before releasing its latches anyway (it should never be
// reached: leadership loss fails proposals within an election timeout).
const lateWriteBound = 30 * time.Second

// Txn evaluates and applies rt, which must only touch this partition's
// keys. It is called on the leader.
func (p *Partition) Txn(ctx context.Context, rt *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := p.refreshLeases(ctx, rt); err != nil {
		return nil, err
	}
	spans := txnSpans(rt, nil)
	if err := p.checkSpans(spans); err != nil {
		return nil, err
	}
	g, err := p.latches.acquire(ctx, spans)
	if err != nil {
		return nil, err
	}
	defer p.latches.release(g)
	for attempt := 0; ; attempt++ {
		// A split may have applied while this waited for its latches.
		if err := p.checkSpans(spans); err != nil {
			return nil, err
		}
		resp, err := p.txnLatched(ctx, rt)
		if err == errRetry {
			if attempt < 3 {
				p.metrics.retries.Inc()
				continue
			}
			err = ErrRetriesExhausted
		}
		return resp, err
	}
}

var errRetry = errors.New("partition: retry with a new revision")

// ErrRetriesExhausted: a write's revision was refused (at or below the
// closed revision, as after a leader change) on every attempt. The write
// was not applied; the client may retry it (etcdcompat answers etcd's
// retryable "request timed out", code Unavailable).
var ErrRetriesExhausted = errors.New("partition: no usable revision after 4 attempts")

// freshClosed returns the TSO's current revision once it is closed here:
// state read at it is linearizable, whether or not this replica still
// leads.
func (p *Partition) freshClosed(ctx context.Context) (int64, error) {
	fresh, err := p.revs.Fresh(ctx)
	if err != nil {
		return 0, err
	}
	return fresh, p.WaitClosed(ctx, fresh)
}

func (p *Partition) txnLatched(ctx context.Context, rt *pb.TxnRequest) (*pb.TxnResponse, error) {
	if !p.IsLeader() {
		return nil, ErrNotLeader
	}
	// Decide whether the txn writes: reads, failed compares and refused
	// requests consume no revision. The compares and etcd's checks settle
	// it when the chosen ops include a put; otherwise a dry run finds out
	// (a delete may delete nothing).
	cur := p.revs.Current()
	dry := &view{r: p.db, index: p.index, readRev: latestRev, beginRev: cur, compactRev: p.compact.Load(), leaseOK: p.leases.LeaseUsable}
	path, writes, err := dry.precheck(rt)
	if err != nil {
		// A refusal is an answer from this replica's state too, which may
		// be stale (see below): confirm it at the current revision.
		fresh, ferr := p.freshClosed(ctx)
		if ferr != nil {
			return nil, ferr
		}
		again := &view{r: p.db, index: p.index, readRev: fresh, beginRev: fresh, compactRev: p.compact.Load(), leaseOK: p.leases.LeaseUsable}
		if _, _, err := again.precheck(rt); err != nil {
			return nil, err
		}
		p.metrics.retries.Inc()
		return nil, errRetry
	}
	var resp *pb.TxnResponse
	if !writes {
		resp, err = dry.evalTxn(rt)
		if err != nil {
			return nil, err
		}
		if len(dry.changes) == 0 {
			// Nothing to write, so no revision: the answer is a read and
			// must be linearizable. This replica may be a leader that was
			// deposed without knowing it (paused, partitioned), whose state
			// lacks writes its successor acknowledged, so the dry run
			// proves nothing: read at the TSO's current revision (the
			// header must be it anyway, docs/design.md, invariant 3) once it is
			// closed here. If that read would write, the dry run saw a
			// stale state: start over.
			fresh, err := p.freshClosed(ctx)
			if err != nil {
				return nil, err
			}
			again := &view{r: p.db, index: p.index, readRev: fresh, beginRev: fresh, compactRev: p.compact.Load(), leaseOK: p.leases.LeaseUsable}
			resp, err := again.evalTxn(rt)
			if err == nil && len(again.changes) > 0 {
				p.metrics.retries.Inc()
				return nil, errRetry
			}
			return resp, err
		}
	}
	w, term, err := p.register()
	if err != nil {
		return nil, err
	}
	rev, err := p.revs.Next(ctx, 1)
	if err != nil {
		p.abandon(w)
		return nil, err
	}
	// Real run at the write's revision, on the path the compares chose:
	// the latches keep the state they saw, and leases they checked cannot
	// be revoked under the latch.
	v := &view{r: p.db, index: p.index, readRev: latestRev, beginRev: rev - 1, compactRev: dry.compactRev, leaseOK: func(int64) bool { return true }}
	if resp, err = v.executePath(rt, path); err != nil {
		p.abandon(w)
		return nil, fmt.Errorf("partition %d: txn changed between evaluations: %w", p.id, err)
	}
	cmd := (&command{kind: cmdWrite, term: term, rev: rev, muts: v.changes}).encode()
	res, err := p.proposeWrite(ctx, w, term, rev, cmd)
	if err != nil {
		if errors.Is(err, raftgroup.ErrNotLeader) {
			return nil, ErrNotLeader
		}
		if errors.Is(err, raftgroup.ErrLeaderChanged) {
			return nil, ErrLeaderChanged
		}
		return nil, err
	}
	switch res.reject {
	case accepted:
		if len(v.changes) > 0 {
			p.load.note(v.changes[0].key)
		}
		return resp, nil
	case rejectClosed:
		return nil, errRetry
	case rejectStaleTerm:
		return nil, ErrLeaderChanged
	case rejectOutsideRange:
		return nil, ErrOutsideRange
	default:
		return nil, fmt.Errorf("partition %d: write rejected (%d)", p.id, res.reject)
	}
}

// checkSpans checks every span with checkSpan.
func (p *Partition) checkSpans(spans []latchSpan) error {
	for _, s := range spans {
		if err := p.checkSpan(s); err != nil {
			return err
		}
	}
	return nil
}

// checkSpan reports whether a latch span over user keys lies inside the
// partition.
func (p *Partition) checkSpan(s latchSpan) error {
	if s.start[0] != 'k' || bytes.Compare(s.start, s.end) >= 0 {
		return nil // not user keys, or an empty range (reads nothing)
	}
	sp := p.sp.Load()
	if !sp.contains(s.start[1:]) {
		return ErrOutsideRange
	}
	if len(sp.end) == 0 {
		return nil
	}
	if s.end[0] != 'k' || bytes.Compare(s.end[1:], sp.end) > 0 {
		return ErrOutsideRange
	}
	return nil
}

// txnSpans returns the latches rt needs: reads for compares and ranges,
// writes for puts and deletes, and a shared latch on every lease a put
// attaches (lease revocation takes it exclusively).
func txnSpans(rt *pb.TxnRequest, spans []latchSpan) []latchSpan {
	for _, c := range rt.Compare {
		spans = append(spans, keySpan(c.Key, c.RangeEnd, false))
	}
	for _, ops := range [][]*pb.RequestOp{rt.Success, rt.Failure} {
		for _, op := range ops {
			switch tv := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
				spans = append(spans, keySpan(tv.RequestRange.Key, tv.RequestRange.RangeEnd, false))
			case *pb.RequestOp_RequestPut:
				spans = append(spans, keySpan(tv.RequestPut.Key, nil, true))
				if tv.RequestPut.Lease != 0 {
					spans = append(spans, leaseSpan(tv.RequestPut.Lease, false))
				}
			case *pb.RequestOp_RequestDeleteRange:
				spans = append(spans, keySpan(tv.RequestDeleteRange.Key, tv.RequestDeleteRange.RangeEnd, true))
			case *pb.RequestOp_RequestTxn:
				spans = txnSpans(tv.RequestTxn, spans)
			}
		}
	}
	return spans
}

// refreshLeases makes sure this node's view of the leases rt's puts attach
// is current, so a lease granted through another node is found.
func (p *Partition) refreshLeases(ctx context.Context, rt *pb.TxnRequest) error {
	var missing bool
	var walk func(rt *pb.TxnRequest)
	walk = func(rt *pb.TxnRequest) {
		for _, ops := range [][]*pb.RequestOp{rt.Success, rt.Failure} {
			for _, op := range ops {
				if put := op.GetRequestPut(); put != nil && put.Lease != 0 && !p.leases.LeaseUsable(put.Lease) {
					missing = true
				}
				if t := op.GetRequestTxn(); t != nil {
					walk(t)
				}
			}
		}
	}
	walk(rt)
	if !missing {
		return nil
	}
	return p.leases.Refresh(ctx)
}

// Put applies a put as etcd's Put does (the lease is checked first).
func (p *Partition) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if r.Lease != 0 && !p.leases.LeaseUsable(r.Lease) {
		if err := p.leases.Refresh(ctx); err != nil {
			return nil, err
		}
		if !p.leases.LeaseUsable(r.Lease) {
			return nil, ErrLeaseNotFound
		}
	}
	resp, err := p.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: r}}}})
	if err != nil {
		return nil, err
	}
	out := resp.Responses[0].GetResponsePut()
	out.Header = resp.Header
	return out, nil
}

// DeleteRange deletes the keys of r in this partition.
func (p *Partition) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	resp, err := p.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: r}}}})
	if err != nil {
		return nil, err
	}
	out := resp.Responses[0].GetResponseDeleteRange()
	out.Header = resp.Header
	return out, nil
}

// MVCCBounds returns the storage key range holding the partition's MVCC
// data (index and versions of its keys), for size estimates.
func (p *Partition) MVCCBounds() (lo, hi []byte) { return rangeBounds(p.Span()) }
