package raftgroup

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Errors returned to proposers.
var (
	// ErrNotLeader: this replica is not the leader; the command will not
	// apply (it was not proposed, or, for ProposeAsyncFate, a later
	// leader's entry applied first).
	ErrNotLeader = errors.New("raftgroup: not leader")
	// ErrLeaderChanged: leadership changed while the command was in flight;
	// it may or may not apply.
	ErrLeaderChanged = errors.New("raftgroup: leader changed")
	// ErrStopped: the host is stopping.
	ErrStopped = errors.New("raftgroup: stopped")
)

// StateMachine is a group's replicated state machine.
type StateMachine interface {
	// Apply applies one committed command. It must be deterministic: a pure
	// function of the state visible through ac.Batch and of (e.Index,
	// e.Term, cmd). It runs on a worker goroutine; it must not block on
	// other groups. Its result goes to the proposer, if it is on this node.
	Apply(ac *ApplyContext, e *raftpb.Entry, cmd []byte) any
}

// ConfObserver is optionally implemented by a StateMachine to learn of
// applied membership changes. Called on the worker goroutine.
type ConfObserver interface {
	ConfChanged(cs raftpb.ConfState)
}

// LeadershipObserver is optionally implemented by a StateMachine to learn
// when this replica becomes a leader ready to serve (it has applied an entry
// of its own term, so its state includes every entry committed by earlier
// leaders) and when it stops being leader. Called on the worker goroutine.
type LeadershipObserver interface {
	LeadershipChanged(leader bool, term uint64)
}

// ApplyContext is handed to StateMachine.Apply for one round.
type ApplyContext struct {
	// Batch receives the state changes. It is the round's batch, which
	// also carries the round's new log entries, and is committed once all
	// of them are in. It is not indexed: state machines keep in memory
	// what apply needs to read (changes of earlier entries of the round
	// included) and read committed state from the DB.
	Batch *pebble.Batch
	post  []func()
}

// AfterCommit registers f to run once Batch is committed, in registration
// order, before proposers are woken.
func (ac *ApplyContext) AfterCommit(f func()) { ac.post = append(ac.post, f) }

// Status is a snapshot of a group's raft state.
type Status struct {
	ID          uint64
	Term        uint64
	Lead        uint64
	IsLeader    bool
	LeaderReady bool
	Commit      uint64
	Applied     uint64
	Voters      []uint64
	Learners    []uint64
	// LeadTransferee is, on a leader, the node a leadership transfer in
	// progress hands leadership to (0: none).
	LeadTransferee uint64
	// Match is, on a leader, the highest log index known replicated on
	// each replica (learner catch-up, transfer targets).
	Match map[uint64]uint64
	// Active is, on a leader, the replicas raft heard from recently (the
	// leader included): those it found recently active within the last
	// election timeout. A replica on a node that just died drops out
	// within two election timeouts, long before gossip declares the node
	// dead. Raft's own flag (RecentActive) is cleared for every follower
	// at each election timeout (CheckQuorum) until its next answer, so
	// read alone it left live followers out of about one Status in ten
	// of an idle group, and a leader balancer round that looked then
	// skipped them as transfer targets.
	Active []uint64
}

// Group is one raft group hosted on this node.
type Group struct {
	id   uint64
	host *Host
	sm   StateMachine
	ms   *raft.MemoryStorage

	// Owned by the worker currently processing the group (the scheduler
	// guarantees at most one): the RawNode and the bookkeeping beside it.
	rn         *raft.RawNode
	lastIndex  uint64
	firstIndex uint64
	prevHard   raftpb.HardState
	conf       raftpb.ConfState
	// confApplied: a conf change applied in this round; its status is
	// published before proposers wake (owned by the round's worker).
	confApplied bool
	applied     uint64
	appliedTerm uint64
	lead        uint64
	term        uint64
	isLeader    bool
	leaderReady bool

	inbox struct {
		sync.Mutex
		msgs        []raftpb.Message  // protected by inbox
		msgsSince   time.Time         // when the first of msgs was delivered; protected by inbox
		props       []pendingProp     // protected by inbox
		ticks       int               // ticks before the first queued message; protected by inbox
		ticksAfter  int               // ticks after it; protected by inbox
		campaign    bool              // protected by inbox
		advance     int               // election ticks to advance (AdvanceElection); protected by inbox
		forget      uint64            // a leader whose node died (LeaderLost); protected by inbox
		transfer    uint64            // protected by inbox
		transferIn  uint64            // term transfer is for (0: any); protected by inbox
		transferred chan bool         // told what raft made of transfer (nil: no one asks); protected by inbox
		snapReports []snapReport      // protected by inbox
		snapData    map[uint64][]byte // received snapshot data by index; protected by inbox
		readIndex   []*readIndexReq   // protected by inbox
		confChanges []pendingConf     // protected by inbox
		unreachable []uint64          // peers raft should back off from; protected by inbox
	}
	// appended holds the followers sent an append since the last
	// heartbeat to them (heartbeatNeedless without quiet heartbeats);
	// worker-owned.
	appended map[uint64]bool
	// ticked counts the ticks the group took, from the host's count
	// (Host.ticks) when it was created: every group ticks at each of the
	// host's ticks, so the groups' counts agree (heartbeatNeedless);
	// worker-owned.
	ticked uint64
	// lastContact is, for each voter, the tick (ticked) an append or a
	// heartbeat last went to it (heartbeatNeedless); worker-owned.
	lastContact map[uint64]uint64
	// learnerQuiet counts the heartbeats left out to each learner since
	// the last one sent (heartbeatNeedless); worker-owned.
	learnerQuiet map[uint64]int
	// activeSeen is, on a leader, when publishStatus last found each
	// replica recently active in raft (Status.Active); worker-owned.
	activeSeen map[uint64]time.Time
	// readIndexes waiting for a ReadState, by request context; worker-owned.
	readIndexes map[string]*readIndexReq
	waiters     struct {
		sync.Mutex
		m map[uint64]*waiter // protected by waiters
		// orphans counts the ProposeAsyncFate waiters kept when this
		// replica stopped leading, orphanTerm is the latest term they were
		// proposed in, and orphanDeadline ends their wait. Protected by
		// waiters.
		orphans        int
		orphanTerm     uint64
		orphanDeadline time.Time
	}
	status atomic.Pointer[Status]
	// voters is the number of voters in the applied configuration.
	voters atomic.Int32
	// removed is set when the host stops hosting the group.
	removed atomic.Bool
	// gauges are the group's metric children (set on first publish).
	gauges struct{ leader, term, applied prometheus.Gauge }
}

type pendingProp struct {
	data []byte
	id   uint64
	w    *waiter
}

type snapReport struct {
	to     uint64
	status raft.SnapshotStatus
}

type readIndexReq struct {
	ctx  []byte
	done chan struct{}
	idx  uint64
	err  error
}

type pendingConf struct {
	cc raftpb.ConfChangeV2
	id uint64
}

type waiter struct {
	done   chan struct{}
	result any
	err    error
	cb     func(result any, err error)
	// fate: the waiter outlives this replica's leadership
	// (ProposeAsyncFate). term: the leader term the command was proposed
	// in (0 until raft accepted it). Protected by Group.waiters.
	fate bool
	term uint64
}

func (w *waiter) finish(result any, err error) {
	w.result, w.err = result, err
	if w.cb != nil {
		w.cb(result, err)
		return
	}
	close(w.done)
}

// Entry data header: version byte + BE64 proposal ID.
const (
	entryVersion = 1
	// HeaderLen is the room a command must leave at its start for the
	// entry header (see NewCommand), so that proposing it copies nothing.
	HeaderLen = 9
)

// NewCommand returns a buffer for a command of about n bytes: HeaderLen
// reserved bytes, to which the caller appends the command.
func NewCommand(n int) []byte { return make([]byte, HeaderLen, HeaderLen+n) }

// stampEntry writes the entry header into the reserved room of buf.
func stampEntry(id uint64, buf []byte) []byte {
	buf[0] = entryVersion
	binary.BigEndian.PutUint64(buf[1:HeaderLen], id)
	return buf
}

func decodeEntry(data []byte) (id uint64, cmd []byte, ok bool) {
	if len(data) < HeaderLen || data[0] != entryVersion {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(data[1:]), data[HeaderLen:], true
}

// ID returns the group ID.
func (g *Group) ID() uint64 { return g.id }

// AppliedIndex returns the index applied as of the last round.
func (g *Group) AppliedIndex() uint64 { return g.Status().Applied }

// AppliedConf returns the configuration as of the entry being applied.
// Call it only from the group's StateMachine.Apply.
func (g *Group) AppliedConf() raftpb.ConfState { return g.conf }

// SoleVoter reports whether this replica is the group's only voter (so
// its leadership cannot be lost to another replica).
func (g *Group) SoleVoter() bool { return g.voters.Load() == 1 }

// Status returns the group's status as of the end of its last round.
func (g *Group) Status() Status {
	if s := g.status.Load(); s != nil {
		return *s
	}
	return Status{ID: g.id}
}

// Propose proposes cmd and waits until it is applied on this replica,
// returning the state machine's result. If ctx ends first the command may
// still apply later. cmd must start with HeaderLen reserved bytes (see
// NewCommand); the group owns it afterwards.
func (g *Group) Propose(ctx context.Context, cmd []byte) (any, error) {
	w := &waiter{done: make(chan struct{})}
	g.enqueueProposal(cmd, w)
	select {
	case <-w.done:
		return w.result, w.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ProposeAsync proposes cmd (laid out as for Propose); cb runs on a worker
// goroutine once the command is applied or has failed. cb must not block.
func (g *Group) ProposeAsync(cmd []byte, cb func(result any, err error)) {
	g.enqueueProposal(cmd, &waiter{cb: cb})
}

// ProposeAsyncFate is ProposeAsync for a command whose proposer must learn
// its fate even if this replica stops leading before it commits (a client's
// write: "leader changed, it may or may not have applied" is an answer a
// client can do little with). Losing leadership does not fail it; cb gets
//   - the state machine's result once the command applies here (a later
//     leader committed it);
//   - ErrNotLeader once an entry of a later term applied here before it:
//     it was never committed, and never will be (raft's logs hold the
//     entries of a term before those of any later term, and apply in
//     order);
//   - ErrLeaderChanged if neither happened within two election timeouts
//     of the step-down (this replica cut off), or a snapshot hid its fate.
func (g *Group) ProposeAsyncFate(cmd []byte, cb func(result any, err error)) {
	g.enqueueProposal(cmd, &waiter{cb: cb, fate: true})
}

func (g *Group) enqueueProposal(cmd []byte, w *waiter) {
	id := g.host.nextProposalID()
	g.waiters.Lock()
	g.waiters.m[id] = w
	g.waiters.Unlock()
	g.inbox.Lock()
	if len(cmd) < HeaderLen {
		panic("raftgroup: command without room for the entry header (use NewCommand)")
	}
	g.inbox.props = append(g.inbox.props, pendingProp{data: stampEntry(id, cmd), id: id, w: w})
	g.inbox.Unlock()
	g.host.sched.enqueue(g)
}

// ReadIndex confirms, with a quorum of the group, that this replica is the
// leader, and returns the commit index at that moment: every entry
// committed before ReadIndex was called is at or below it. A deposed leader
// that does not know it gets no answer (and ctx ends) or ErrNotLeader.
func (g *Group) ReadIndex(ctx context.Context) (uint64, error) {
	r := &readIndexReq{ctx: binary.BigEndian.AppendUint64(nil, g.host.nextProposalID()), done: make(chan struct{})}
	g.inbox.Lock()
	g.inbox.readIndex = append(g.inbox.readIndex, r)
	g.inbox.Unlock()
	g.host.sched.enqueue(g)
	select {
	case <-r.done:
		return r.idx, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// ProposeConfChange proposes a membership change and waits until it is
// applied here.
func (g *Group) ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeV2) error {
	id := g.host.nextProposalID()
	w := &waiter{done: make(chan struct{})}
	g.waiters.Lock()
	g.waiters.m[id] = w
	g.waiters.Unlock()
	cc.Context = binary.BigEndian.AppendUint64(nil, id)
	g.inbox.Lock()
	g.inbox.confChanges = append(g.inbox.confChanges, pendingConf{cc: cc, id: id})
	g.inbox.Unlock()
	g.host.sched.enqueue(g)
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Campaign asks this replica to start an election.
func (g *Group) Campaign() {
	g.inbox.Lock()
	g.inbox.campaign = true
	g.inbox.Unlock()
	g.host.sched.enqueue(g)
}

// AdvanceElection moves a replica that knows no leader close to its
// election timeout: it campaigns (a pre-vote, which peers that hear a
// leader refuse) within a few ticks plus raft's randomisation instead of
// after one to two whole election timeouts. etcd does this when a member
// restarts and reaches its peers (InitialElectionTickAdvance): a cluster
// restarted as a whole elected its leaders a second or more later than
// etcd did. The ticks do not count in the group's tick clock
// (quietClock), which every group shares.
func (g *Group) AdvanceElection() {
	g.inbox.Lock()
	g.inbox.advance = max(g.host.cfg.ElectionTicks-2, 0)
	g.inbox.Unlock()
	g.host.sched.enqueue(g)
}

// LeaderLost tells a follower that the node it follows, leader, died (its
// connection broke): the follower forgets it (raft's ForgetLeader, which
// CockroachDB uses when node liveness says a leader is dead) and advances
// its election (AdvanceElection). A leaderless follower grants pre-votes
// at once, so when the followers of a killed leader all learn it, one of
// them is elected within a few ticks plus raft's randomisation, instead of
// after a whole election timeout with no heartbeat. A follower wrong
// about its leader reverts at the leader's next heartbeat, and its
// pre-vote is refused by followers that still hear the leader.
func (g *Group) LeaderLost(leader uint64) {
	g.inbox.Lock()
	g.inbox.forget = leader
	g.inbox.advance = max(g.host.cfg.ElectionTicks-2, 0)
	g.inbox.Unlock()
	g.host.sched.enqueue(g)
}

// TransferLeadership asks the leader to hand leadership to node to. A
// replica that is not the leader ignores it (raft would forward it to the
// leader, which has not prepared for it).
func (g *Group) TransferLeadership(to uint64) { g.TransferLeadershipInTerm(to, 0) }

// TransferLeadershipInTerm is TransferLeadership, done only if this replica
// still leads in term (0: any term). A caller that readied the transfer in
// one term (a drained leader, a shrunk TSO window) must not transfer the
// leadership of a later term, which it did not ready.
func (g *Group) TransferLeadershipInTerm(to, term uint64) {
	g.queueTransfer(to, term, nil)
}

// CaughtUp reports whether, by this leader's status, replica n has
// acknowledged the log to within slack entries of the commit index.
func (st Status) CaughtUp(n, slack uint64) bool {
	m := st.Match[n]
	return m > 0 && m+slack >= st.Commit
}

// WaitCaughtUp waits, while this replica leads, until replica to is
// CaughtUp(to, slack). With slack 0 a leadership transfer to it starts at
// once: raft hands leadership only to a transferee whose log matches the
// leader's; it sends a lagging one what it lacks and waits, the group's
// proposals refused all that time, and gives up after an election timeout
// if the transferee does not answer (a starved node). It fails with
// ErrNotLeader if this replica stops leading and with the context's error
// if ctx ends first.
func (g *Group) WaitCaughtUp(ctx context.Context, to, slack uint64) error {
	for {
		st := g.Status()
		if !st.IsLeader {
			return ErrNotLeader
		}
		if st.CaughtUp(to, slack) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// StartTransfer is TransferLeadershipInTerm that waits until raft has
// taken the request up. It reports whether raft started the transfer to
// node to, or this replica no longer led in term when it came to it
// (either way the leadership of term may be gone soon or already). False
// means the transfer will not happen: raft refused it (to is not a voter,
// or is this node), a later request replaced it, or ctx ended before a
// worker took it (it is withdrawn then, and ctx's error returned).
//
// A planned transfer must not judge by Status alone: the request waits in
// the inbox until a worker runs the group, which on a starved node takes
// longer than any fixed wait, and a leader that resumed taking writes
// before raft started the transfer has them dropped.
func (g *Group) StartTransfer(ctx context.Context, to, term uint64) (bool, error) {
	done := make(chan bool, 1)
	g.queueTransfer(to, term, done)
	select {
	case started := <-done:
		return started, nil
	case <-ctx.Done():
	}
	g.inbox.Lock()
	withdrawn := g.inbox.transferred == done
	if withdrawn {
		g.inbox.transfer, g.inbox.transferIn, g.inbox.transferred = 0, 0, nil
	}
	g.inbox.Unlock()
	if withdrawn {
		return false, ctx.Err()
	}
	// A worker has the request: it answers within its current round.
	return <-done, nil
}

func (g *Group) queueTransfer(to, term uint64, done chan bool) {
	g.inbox.Lock()
	if prev := g.inbox.transferred; prev != nil {
		prev <- false // replaced before raft saw it
	}
	g.inbox.transfer, g.inbox.transferIn, g.inbox.transferred = to, term, done
	g.inbox.Unlock()
	g.host.sched.enqueue(g)
}

func (g *Group) takeWaiter(id uint64) *waiter {
	g.waiters.Lock()
	w := g.waiters.m[id]
	delete(g.waiters.m, id)
	g.waiters.Unlock()
	return w
}

func (g *Group) failAllWaiters(err error) {
	g.waiters.Lock()
	ws := g.waiters.m
	g.waiters.m = make(map[uint64]*waiter)
	g.waiters.orphans, g.waiters.orphanTerm = 0, 0
	g.waiters.Unlock()
	for _, w := range ws {
		w.finish(nil, err)
	}
}

// steppedDown fails the waiters of a replica that stopped leading with
// ErrLeaderChanged, except the ProposeAsyncFate waiters of commands raft
// accepted, which wait for their fate (takeApplied, expireOrphans,
// snapshotInstalled). Those
// raft has not seen yet are left to be dropped as ErrNotLeader. Call it
// after the round's entries applied.
func (g *Group) steppedDown(grace time.Duration) {
	var failed []*waiter
	g.waiters.Lock()
	// Every accepted fate waiter is an orphan now, with those of an
	// earlier step-down still waiting.
	g.waiters.orphans = 0
	for id, w := range g.waiters.m {
		switch {
		case w.fate && w.term != 0:
			g.waiters.orphans++
			g.waiters.orphanTerm = max(g.waiters.orphanTerm, w.term)
		case w.fate:
		default:
			delete(g.waiters.m, id)
			failed = append(failed, w)
		}
	}
	var dead []*waiter
	switch {
	case g.waiters.orphans > 0 && g.appliedTerm > g.waiters.orphanTerm:
		// The round that deposed this leader applied the next leader's
		// entries: theirs came before them or never will.
		dead = g.takeOrphansLocked()
		g.host.metrics.deposedProposals.WithLabelValues("dropped").Add(float64(len(dead)))
	case g.waiters.orphans > 0:
		g.waiters.orphanDeadline = time.Now().Add(grace)
	}
	g.waiters.Unlock()
	for _, w := range failed {
		w.finish(nil, ErrLeaderChanged)
	}
	for _, w := range dead {
		w.finish(nil, ErrNotLeader)
	}
}

// takeApplied takes the waiter of an applied entry (proposal id, term), and
// the orphans an entry of a later term than theirs proves dead: had their
// commands been committed, they would have applied before it.
func (g *Group) takeApplied(id, term uint64) (w *waiter, dead []*waiter) {
	g.waiters.Lock()
	defer g.waiters.Unlock()
	if id != 0 {
		if w = g.waiters.m[id]; w != nil {
			delete(g.waiters.m, id)
			if g.waiters.orphans > 0 && w.fate && w.term != 0 && w.term <= g.waiters.orphanTerm {
				g.waiters.orphans--
				g.host.metrics.deposedProposals.WithLabelValues("applied").Inc()
			}
		}
	}
	if g.waiters.orphans > 0 && term > g.waiters.orphanTerm {
		dead = g.takeOrphansLocked()
		g.host.metrics.deposedProposals.WithLabelValues("dropped").Add(float64(len(dead)))
	}
	return w, dead
}

// takeOrphansLocked removes every orphan (waiters locked).
func (g *Group) takeOrphansLocked() []*waiter {
	var ws []*waiter
	for id, w := range g.waiters.m {
		if w.fate && w.term != 0 && w.term <= g.waiters.orphanTerm {
			delete(g.waiters.m, id)
			ws = append(ws, w)
		}
	}
	g.waiters.orphans, g.waiters.orphanTerm = 0, 0
	return ws
}

// expireOrphans fails the orphans with ErrLeaderChanged once their
// deadline passed.
func (g *Group) expireOrphans() {
	g.waiters.Lock()
	if g.waiters.orphans == 0 || time.Now().Before(g.waiters.orphanDeadline) {
		g.waiters.Unlock()
		return
	}
	ws := g.takeOrphansLocked()
	g.waiters.Unlock()
	g.failUnknown(ws)
}

// snapshotInstalled fails with ErrLeaderChanged every ProposeAsyncFate
// waiter of a command raft accepted: whether the snapshot holds the
// command cannot be told. The replica installing it does not lead (it may
// have stopped in this very round, before steppedDown counted them as
// orphans).
func (g *Group) snapshotInstalled() {
	var ws []*waiter
	g.waiters.Lock()
	for id, w := range g.waiters.m {
		if w.fate && w.term != 0 {
			delete(g.waiters.m, id)
			ws = append(ws, w)
		}
	}
	g.waiters.orphans, g.waiters.orphanTerm = 0, 0
	g.waiters.Unlock()
	g.failUnknown(ws)
}

func (g *Group) failUnknown(ws []*waiter) {
	if len(ws) == 0 {
		return
	}
	g.host.metrics.deposedProposals.WithLabelValues("unknown").Add(float64(len(ws)))
	for _, w := range ws {
		w.finish(nil, ErrLeaderChanged)
	}
}

// addTickLocked queues a tick (inbox locked): before the queued messages
// if there are none yet, after them otherwise (drainInbox).
func (g *Group) addTickLocked() {
	if len(g.inbox.msgs) == 0 {
		g.inbox.ticks++
	} else {
		g.inbox.ticksAfter++
	}
}

// drainInbox feeds queued work into the RawNode. Worker-owned.
func (g *Group) drainInbox() {
	g.inbox.Lock()
	msgs, props, ticks, ticksAfter := g.inbox.msgs, g.inbox.props, g.inbox.ticks, g.inbox.ticksAfter
	msgsSince := g.inbox.msgsSince
	campaign, transfer, transferIn, transferred := g.inbox.campaign, g.inbox.transfer, g.inbox.transferIn, g.inbox.transferred
	advance, forget := g.inbox.advance, g.inbox.forget
	g.inbox.advance, g.inbox.forget = 0, 0
	reports, reads, confs, unreachable := g.inbox.snapReports, g.inbox.readIndex, g.inbox.confChanges, g.inbox.unreachable
	g.inbox.msgs, g.inbox.props, g.inbox.ticks, g.inbox.ticksAfter = nil, nil, 0, 0
	g.inbox.campaign, g.inbox.transfer, g.inbox.transferIn, g.inbox.transferred = false, 0, 0, nil
	g.inbox.snapReports, g.inbox.readIndex, g.inbox.confChanges, g.inbox.unreachable = nil, nil, nil, nil
	g.inbox.Unlock()
	if len(msgs) > 0 && g.host != nil {
		g.host.metrics.inboxWait.Observe(time.Since(msgsSince).Seconds())
	}

	g.expireOrphans()
	for _, to := range unreachable {
		g.rn.ReportUnreachable(to)
	}
	for _, r := range reports {
		g.rn.ReportSnapshot(r.to, r.status)
	}
	for _, r := range reads {
		if !g.isLeader {
			r.err = ErrNotLeader
			close(r.done)
			continue
		}
		if g.readIndexes == nil {
			g.readIndexes = make(map[string]*readIndexReq)
		}
		g.readIndexes[string(r.ctx)] = r
		g.rn.ReadIndex(r.ctx)
	}
	for _, c := range confs {
		if err := g.rn.ProposeConfChange(c.cc); err != nil {
			if w := g.takeWaiter(c.id); w != nil {
				w.finish(nil, ErrNotLeader)
			}
		}
	}

	for i := 0; i < ticks; i++ {
		g.rn.Tick()
		g.ticked++
	}
	if st := g.rn.BasicStatus(); forget != 0 && st.Lead == forget && st.RaftState == raft.StateFollower {
		_ = g.rn.ForgetLeader()
	}
	if advance > 0 && g.rn.BasicStatus().Lead == raft.None && g.rn.BasicStatus().RaftState == raft.StateFollower {
		for i := 0; i < advance; i++ {
			g.rn.Tick()
		}
	}
	if campaign {
		_ = g.rn.Campaign()
	}
	if transfer != 0 {
		started := true // the term's leadership is gone, or moving
		if st := g.rn.BasicStatus(); st.RaftState == raft.StateLeader && (transferIn == 0 || st.Term == transferIn) {
			g.rn.TransferLeader(transfer)
			after := g.rn.BasicStatus()
			started = after.RaftState != raft.StateLeader || after.Term != st.Term || after.LeadTransferee == transfer
		} else {
			g.host.log.Info("leadership transfer not made: not the leader of that term", "group", g.id, "to", strconv.FormatUint(transfer, 16), "term", st.Term, "for_term", transferIn)
		}
		if transferred != nil {
			transferred <- started
		}
	} else if transferred != nil {
		transferred <- false
	}
	for i := range msgs {
		// Errors here are messages from unknown peers or stale terms;
		// raft has already dropped them.
		_ = g.rn.Step(msgs[i])
	}
	// Ticks that came after messages count after them: a worker that
	// could not run for a while (an overloaded or throttled node) must not
	// let a leader find "no quorum active" (CheckQuorum) nor a follower
	// "no leader" by counting time past messages that had arrived.
	for i := 0; i < ticksAfter; i++ {
		g.rn.Tick()
		g.ticked++
	}
	g.propose(props)
}

// pruneHeartbeatState forgets what heartbeatNeedless kept about nodes
// that are no longer in the configuration (or no longer learners), once it
// changed.
func (g *Group) pruneHeartbeatState() {
	for id := range g.learnerQuiet {
		if !slices.Contains(g.conf.Learners, id) {
			delete(g.learnerQuiet, id)
		}
	}
	for id := range g.appended {
		if !slices.Contains(g.conf.Voters, id) && !slices.Contains(g.conf.Learners, id) {
			delete(g.appended, id)
		}
	}
	for id := range g.lastContact {
		if !slices.Contains(g.conf.Voters, id) && !slices.Contains(g.conf.Learners, id) {
			delete(g.lastContact, id)
		}
	}
}

// heartbeatNeedless notes the appends a leader sends and reports whether
// m is a heartbeat its follower can do without. A heartbeat with a
// read-index context always goes to a voter (the read needs its answers)
// and never to a learner (see below). Of the others, to a voter:
//
//   - with a host (a clock: Group.ticked) and an election timeout of more
//     than three heartbeat intervals, a voter gets a heartbeat at a quiet
//     tick - one whose count is a multiple of quietEvery, a third of the
//     election timeout - if nothing was sent to it yet in that tick; once
//     quietEvery ticks passed since anything was last sent to it (a
//     worker that missed the quiet tick, being late); and when the leader
//     has not heard from it since its last quorum check (CheckQuorum): a
//     leader whose worker then stalls for an election timeout (a
//     throttled node) must have had the answer to a heartbeat sent after
//     the check, or it steps down at the next
//     (TestStalledLeaderKeepsLeadership). So no voter goes more than
//     quietEvery+1 ticks without a message from its leader, and the
//     quiet heartbeats of all the groups a node leads go out together,
//     in one batch per peer every quietEvery ticks; what is left at other
//     ticks is each group's heartbeat after its quorum check, one per
//     election timeout, at the group's own phase. An idle partition is
//     most of a large cluster's, and its heartbeats and their answers
//     were a batch per peer and tick each way, each a round on the
//     receiver (about 40% of the raft messages of a 6-node benchmark run
//     with one prefix written and the other partitions idle);
//   - otherwise (no clock: tests that drive a Group alone; a short
//     election timeout), a heartbeat to a follower sent an append since
//     the last heartbeat is left out, and the next one goes.
//
// Either way an append stands for a heartbeat: it told the follower what
// the heartbeat would have (the leader is alive, so the follower's
// election timer restarts; the commit index, which a leader also sends
// in an append whenever it moves) and its answer tells the leader the
// follower is active (CheckQuorum). A leader paused on a follower whose
// appends were lost resumes on its next heartbeat's answer, a few ticks
// later than with a heartbeat every tick. Raft tolerates any message
// loss; this only drops messages that carry nothing new.
//
// A learner gets one heartbeat in learnerHeartbeatEvery. It never
// campaigns and counts in no quorum, so it does not need the leader's
// sign of life, and the commit index reaches it in the appends the leader
// sends whenever the index moves. What a heartbeat still does for it -
// its answer resumes a leader that stopped sending it appends (lost
// messages, a probe) - can wait that long. The TSO and meta groups have
// every node past the first --replicas as a learner, so without this
// their leaders would send every other node a heartbeat (and get an
// answer) every tick, whatever the load: the one raft cost that grows
// with the cluster's size rather than with its writes.
//
// A learner gets no read-index heartbeat at all: raft counts a read-index
// round's answers from voters only (the round is won by a quorum of
// Voters), so a learner's answer confirms nothing. The TSO leader runs
// such a round for every batch of revision requests (tso.Oracle.confirm),
// tens a second under load, and sent each one to every node of the
// cluster: in a 6-node run with one prefix written, 28% of the raft
// batches between nodes, all of them to or from the TSO leader's node.
func (g *Group) heartbeatNeedless(m *raftpb.Message) bool {
	now, every := g.quietClock()
	switch m.Type {
	case raftpb.MsgApp:
		if every > 0 {
			g.contacted(m.To, now)
			break
		}
		if g.appended == nil {
			g.appended = make(map[uint64]bool)
		}
		g.appended[m.To] = true
	case raftpb.MsgHeartbeat:
		if slices.Contains(g.conf.Learners, m.To) {
			if len(m.Context) > 0 {
				return true // a read-index round counts voters' answers only
			}
			if g.learnerQuiet == nil {
				g.learnerQuiet = make(map[uint64]int)
			}
			if g.learnerQuiet[m.To] < learnerHeartbeatEvery-1 {
				g.learnerQuiet[m.To]++
				return true
			}
			g.learnerQuiet[m.To] = 0
			return false
		}
		if every > 0 {
			last, ok := g.lastContact[m.To]
			if len(m.Context) > 0 || !ok || now-last > every || (now != last && (now%every == 0 || !g.recentlyActive(m.To))) {
				g.contacted(m.To, now)
				return false
			}
			return true
		}
		if !g.appended[m.To] {
			return false
		}
		g.appended[m.To] = false
		return len(m.Context) == 0
	}
	return false
}

// quietClock returns the group's tick count and how many ticks apart
// heartbeatNeedless sends voters their quiet heartbeats (0: it does not,
// and keeps to the append rule).
func (g *Group) quietClock() (now, every uint64) {
	if g.host == nil {
		return 0, 0
	}
	return g.ticked, g.host.quietEvery
}

// recentlyActive reports whether the leader heard from node to since its
// last quorum check (raft's RecentActive, which CheckQuorum clears at each
// check); true without a RawNode (tests driving heartbeatNeedless alone).
func (g *Group) recentlyActive(to uint64) bool {
	if g.rn == nil {
		return true
	}
	active := true
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == to {
			active = pr.RecentActive
		}
	})
	return active
}

// contacted notes that a message that restarts the follower's election
// timer went to node to at tick now.
func (g *Group) contacted(to, now uint64) {
	if g.lastContact == nil {
		g.lastContact = make(map[uint64]uint64)
	}
	g.lastContact[to] = now
}

// learnerHeartbeatEvery: a leader sends a learner one heartbeat in this
// many (at the default ticks, one a second).
const learnerHeartbeatEvery = 10

// propose steps the round's proposals as one MsgProp, so the leader sends
// each follower one append message carrying all of them, gets one answer
// per follower and advances its commit index once, instead of once per
// proposal (each proposed alone costs a message and an answer per
// follower, and another pair when its commit is announced). Raft accepts
// or drops the batch as a whole (not the leader, a leadership transfer in
// progress).
func (g *Group) propose(props []pendingProp) {
	if len(props) == 0 {
		return
	}
	ents := make([]raftpb.Entry, len(props))
	for i, p := range props {
		ents[i] = raftpb.Entry{Type: raftpb.EntryNormal, Data: p.data}
	}
	if err := g.rn.Step(raftpb.Message{Type: raftpb.MsgProp, From: g.host.cfg.NodeID, Entries: ents}); err != nil {
		g.host.metrics.proposalsDropped.Add(float64(len(props)))
		for _, p := range props {
			if w := g.takeWaiter(p.id); w != nil {
				w.finish(nil, ErrNotLeader)
			}
		}
		return
	}
	g.host.metrics.proposals.Add(float64(len(props)))
	// The entries are in the log at the leader's term (the leadership may
	// be new this round, so g.term can still be the previous one).
	term := g.rn.BasicStatus().Term
	g.waiters.Lock()
	for _, p := range props {
		p.w.term = term
	}
	g.waiters.Unlock()
}

// forgetGauges drops the group's series from the per-group gauges once
// its replica left this node (it runs no more rounds), so the node's
// metrics show no replica it does not have. A replica created here again
// later makes its own.
func (g *Group) forgetGauges() {
	label := strconv.FormatUint(g.id, 10)
	m := g.host.metrics
	m.leader.DeleteLabelValues(label)
	m.term.DeleteLabelValues(label)
	m.appliedIndex.DeleteLabelValues(label)
}

func (g *Group) publishStatus() {
	g.voters.Store(int32(len(g.conf.Voters)))
	if g.gauges.leader == nil {
		label := strconv.FormatUint(g.id, 10)
		g.gauges.leader = g.host.metrics.leader.WithLabelValues(label)
		g.gauges.term = g.host.metrics.term.WithLabelValues(label)
		g.gauges.applied = g.host.metrics.appliedIndex.WithLabelValues(label)
	}
	leader := 0.0
	if g.isLeader && g.leaderReady {
		leader = 1
	}
	g.gauges.leader.Set(leader)
	g.gauges.term.Set(float64(g.term))
	g.gauges.applied.Set(float64(g.applied))
	var match map[uint64]uint64
	var active []uint64
	var transferee uint64
	if g.isLeader {
		transferee = g.rn.BasicStatus().LeadTransferee
		match = make(map[uint64]uint64, len(g.conf.Voters)+len(g.conf.Learners))
		if g.activeSeen == nil {
			g.activeSeen = make(map[uint64]time.Time)
		}
		now := time.Now()
		window := time.Duration(g.host.cfg.ElectionTicks) * g.host.cfg.TickInterval
		g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			match[id] = pr.Match
			if pr.RecentActive || id == g.host.cfg.NodeID {
				g.activeSeen[id] = now
			}
			if t, ok := g.activeSeen[id]; ok && now.Sub(t) <= window {
				active = append(active, id)
			}
		})
	} else {
		clear(g.activeSeen)
	}
	g.status.Store(&Status{
		Match:          match,
		Active:         active,
		LeadTransferee: transferee,
		ID:             g.id,
		Term:           g.term,
		Lead:           g.lead,
		IsLeader:       g.isLeader,
		LeaderReady:    g.leaderReady,
		Commit:         g.prevHard.Commit,
		Applied:        g.applied,
		Voters:         append([]uint64(nil), g.conf.Voters...),
		Learners:       append([]uint64(nil), g.conf.Learners...),
	})
}

// answerReadIndexes completes ReadIndex requests raft has confirmed.
func (g *Group) answerReadIndexes(states []raft.ReadState) {
	for _, rs := range states {
		if r := g.readIndexes[string(rs.RequestCtx)]; r != nil {
			delete(g.readIndexes, string(rs.RequestCtx))
			r.idx = rs.Index
			close(r.done)
		}
	}
	if !g.isLeader && len(g.readIndexes) > 0 {
		for k, r := range g.readIndexes {
			r.err = ErrLeaderChanged
			close(r.done)
			delete(g.readIndexes, k)
		}
	}
}

// firstIndexForTest returns the first index of the in-memory log.
func (g *Group) firstIndexForTest() uint64 {
	i, _ := g.ms.FirstIndex()
	return i
}
