package raftgroup

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Host runs every raft group of one node.
type Host struct {
	cfg       Config
	db        *pebble.DB
	transport Transport
	sched     *scheduler
	metrics   *metrics
	log       *slog.Logger

	nonce uint64
	seq   atomic.Uint64
	// stopping is set by BeginStop.
	stopping atomic.Bool
	// ticks counts the ticker's ticks; a group created counts its own
	// from there (Group.ticked), so the groups' quiet heartbeats
	// (heartbeatNeedless) go at the same ticks.
	ticks atomic.Uint64
	// quietEvery is how many ticks apart a leader sends a voter its
	// heartbeats (heartbeatNeedless): a third of the election timeout;
	// 0 when that is not above the heartbeat interval.
	quietEvery uint64

	mu struct {
		sync.RWMutex
		groups  map[uint64]*Group    // protected by mu
		removed map[uint64]time.Time // groups removed here, and when; protected by mu
		// deleting are removed groups whose state is not deleted yet
		// (RemoveGroupAfter); protected by mu
		deleting map[uint64]bool
	}
	// snaps are the snapshots on their way to a replica (sendSnapshot).
	snaps struct {
		sync.Mutex
		sending map[snapTo]bool // protected by Mutex
	}
	stopOnce sync.Once
	stopc    chan struct{}
	wg       sync.WaitGroup

	// fatal is called on a non-deterministic failure (a failed write); the
	// node must stop. Tests replace it.
	fatal func(error)
}

// NewHost creates a host over db. t may be nil for a node whose groups all
// have a single replica.
func NewHost(cfg Config, db *pebble.DB, t Transport) (*Host, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if t == nil {
		t = nopTransport{}
	}
	h := &Host{
		cfg:       cfg,
		db:        db,
		transport: t,
		sched:     newScheduler(),
		metrics:   newMetrics(cfg.Registerer),
		log:       cfg.Logger.With("component", "raftgroup"),
		// Proposal IDs are unique per process: a random high part per start
		// keeps an entry proposed before a restart from waking a waiter
		// created after it.
		nonce: rand.Uint64() << 40,
		stopc: make(chan struct{}),
	}
	if e := cfg.ElectionTicks / 3; e > cfg.HeartbeatTicks {
		h.quietEvery = uint64(e)
	}
	h.mu.groups = make(map[uint64]*Group)
	h.mu.removed = make(map[uint64]time.Time)
	h.mu.deleting = make(map[uint64]bool)
	h.fatal = func(err error) {
		h.log.Error("fatal storage error; stopping", "err", err)
		panic(err)
	}
	return h, nil
}

func (h *Host) nextProposalID() uint64 {
	return h.nonce | (h.seq.Add(1) & (1<<40 - 1))
}

// Start launches the workers and the ticker.
func (h *Host) Start() {
	for i := 0; i < h.cfg.Workers; i++ {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.runWorker()
		}()
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.runTicker()
	}()
}

// BeginStop tells the host that its node is stopping: the connections
// that break from now on are its own doing, not its peers' deaths
// (PeerLost ignores them).
func (h *Host) BeginStop() { h.stopping.Store(true) }

// Stop stops the workers. Waiting proposers get ErrStopped.
func (h *Host) Stop() {
	h.stopOnce.Do(func() {
		close(h.stopc)
		h.sched.stop()
		h.wg.Wait()
		h.mu.RLock()
		for _, g := range h.mu.groups {
			g.failAllWaiters(ErrStopped)
		}
		h.mu.RUnlock()
	})
}

// PeerLost tells the host that node's connection broke (its process
// died, or the network between them failed): every group that follows it
// forgets it and advances its election (Group.LeaderLost). It returns how
// many groups it told.
func (h *Host) PeerLost(node uint64) int {
	if h.stopping.Load() {
		return 0
	}
	h.mu.RLock()
	var led []*Group
	for _, g := range h.mu.groups {
		if g.Status().Lead == node && node != h.cfg.NodeID {
			led = append(led, g)
		}
	}
	h.mu.RUnlock()
	for _, g := range led {
		g.LeaderLost(node)
	}
	if len(led) > 0 {
		h.metrics.leadersLost.Add(float64(len(led)))
		h.log.Info("a leader's connection broke: its followers here forget it and advance their elections",
			"node", fmt.Sprintf("%x", node), "groups", len(led))
	}
	return len(led)
}

// Group returns the hosted group with the given ID, or nil.
func (h *Host) Group(id uint64) *Group {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.mu.groups[id]
}

// CreateGroup starts hosting group id. If the group has no persisted state
// it is bootstrapped with the given voters (which must include this node);
// otherwise voters is ignored and the group recovers from its log.
// A group whose only voter is this node campaigns at once.
func (h *Host) CreateGroup(id uint64, voters []uint64, sm StateMachine) (*Group, error) {
	var boot *raftpb.ConfState
	if voters != nil {
		boot = &raftpb.ConfState{Voters: voters}
	}
	return h.CreateGroupConf(id, boot, sm)
}

// CreateGroupConf is CreateGroup with an initial configuration that may
// have learners; nil makes an uninitialized replica (waiting for a
// snapshot) when there is no persisted state.
func (h *Host) CreateGroupConf(id uint64, boot *raftpb.ConfState, sm StateMachine) (*Group, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.mu.groups[id]; ok {
		return nil, fmt.Errorf("raftgroup: group %d already exists", id)
	}
	if h.mu.deleting[id] {
		return nil, fmt.Errorf("raftgroup: group %d is being removed here", id)
	}
	delete(h.mu.removed, id)
	return h.createGroupLocked(id, boot, sm, false)
}

// Binder is implemented by state machines that need their group: a
// replica created by Config.NewReplica is bound before it runs.
type Binder interface {
	Bind(g *Group)
}

// createGroupLocked creates a group; boot nil with no persisted state
// makes an uninitialized replica, which waits for a snapshot. With bind,
// a Binder state machine is bound before the group first runs.
func (h *Host) createGroupLocked(id uint64, boot *raftpb.ConfState, sm StateMachine, bind bool) (*Group, error) {
	st, err := loadState(h.db, id)
	if err != nil {
		return nil, err
	}
	if !st.exists && boot != nil {
		b := h.db.NewBatch()
		if err := writeBootstrap(b, id, *boot); err != nil {
			return nil, err
		}
		if err := b.Commit(pebble.Sync); err != nil {
			return nil, fmt.Errorf("raftgroup: bootstrap group %d: %w", id, err)
		}
		if st, err = loadState(h.db, id); err != nil {
			return nil, err
		}
	}
	var ms *raft.MemoryStorage
	if st.exists {
		if ms, err = newMemoryStorage(st); err != nil {
			return nil, err
		}
	} else {
		ms = raft.NewMemoryStorage() // uninitialized: empty log
	}
	g := &Group{id: id, host: h, sm: sm, ms: ms, ticked: h.ticks.Load()}
	rn, err := raft.NewRawNode(&raft.Config{
		ID:                        h.cfg.NodeID,
		ElectionTick:              h.cfg.ElectionTicks,
		HeartbeatTick:             h.cfg.HeartbeatTicks,
		Storage:                   snapStorage{MemoryStorage: ms, g: g},
		Applied:                   st.applied,
		MaxSizePerMsg:             h.cfg.MaxSizePerMsg,
		MaxInflightMsgs:           h.cfg.MaxInflightMsgs,
		MaxUncommittedEntriesSize: 1 << 30,
		CheckQuorum:               true,
		PreVote:                   true,
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true,
		Logger:                    raftLogger{h.log.With("group", id)},
	})
	if err != nil {
		return nil, fmt.Errorf("raftgroup: group %d: %w", id, err)
	}
	g.rn = rn
	g.prevHard, g.conf, g.applied, g.term = st.hard, st.conf, st.applied, st.hard.Term
	g.firstIndex, g.lastIndex = st.truncIdx+1, st.truncIdx+uint64(len(st.entries))
	g.waiters.m = make(map[uint64]*waiter)
	g.publishStatus()
	h.mu.groups[id] = g
	if b, ok := sm.(Binder); ok && bind {
		b.Bind(g)
	}
	if len(st.conf.Voters) == 1 && st.conf.Voters[0] == h.cfg.NodeID {
		g.inbox.campaign = true
	}
	h.sched.enqueue(g)
	return g, nil
}

// groupOrCreate returns the group, creating an uninitialized replica with
// the NewReplica factory if this node does not host it. It returns nil if
// there is no factory or it refuses.
func (h *Host) groupOrCreate(id uint64) (*Group, error) {
	h.mu.RLock()
	g := h.mu.groups[id]
	h.mu.RUnlock()
	if g != nil || h.cfg.NewReplica == nil {
		return g, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if g := h.mu.groups[id]; g != nil {
		return g, nil
	}
	if h.isRemovedLocked(id) {
		return nil, nil
	}
	sm, err := h.cfg.NewReplica(id)
	if err != nil || sm == nil {
		return nil, err
	}
	h.log.Info("creating a replica for a peer's message", "group", id)
	return h.createGroupLocked(id, nil, sm, true)
}

func (h *Host) runTicker() {
	t := time.NewTicker(h.cfg.TickInterval)
	defer t.Stop()
	for {
		var fired time.Time
		select {
		case <-h.stopc:
			return
		case fired = <-t.C:
		}
		// The ticker's goroutine is woken by a timer, which Go runs at
		// once; a goroutine woken by the network (a peer's raft batch,
		// read by gRPC's reader) waits behind every goroutine already
		// runnable: on a node with more work than CPU (a throttled
		// container, a thousand client requests) that wait reaches
		// seconds. A tick counted first would let a leader find "no
		// quorum active" (CheckQuorum) while its followers' answers sat
		// unread, and step down with every group it leads. Gosched puts
		// this goroutine at the end of the same queue, so a tick reaches
		// the groups after the batches that arrived before it fired
		// (and, in a group's inbox, counts after them), and the raft
		// clock runs at the pace at which the node reads its peers.
		// Ticks that fire meanwhile are dropped (time.Ticker), so a
		// starved node's election timeouts last longer in wall time.
		runtime.Gosched()
		h.metrics.tickDelay.Observe(time.Since(fired).Seconds())
		h.ticks.Add(1)
		h.mu.RLock()
		for _, g := range h.mu.groups {
			g.inbox.Lock()
			g.addTickLocked()
			g.inbox.Unlock()
			h.sched.enqueue(g)
		}
		h.mu.RUnlock()
	}
}

// isRemovedLocked reports whether group id was removed here recently
// (Config.TombstoneTTL): messages still in flight for the removed replica
// must not re-create it. Later, a leader that adds this node back
// creates a fresh replica.
func (h *Host) isRemovedLocked(id uint64) bool {
	if h.mu.deleting[id] {
		return true
	}
	at, ok := h.mu.removed[id]
	return ok && time.Since(at) < h.cfg.TombstoneTTL
}

// RemoveGroup stops hosting group id and deletes its state (raft and, if
// the state machine is a Snapshotter, replicated state). Messages for it
// are dropped for Config.TombstoneTTL (or until CreateGroup hosts it
// again).
func (h *Host) RemoveGroup(id uint64) error { return h.RemoveGroupAfter(id, 0, nil) }

// RemoveGroupAfter is RemoveGroup with the state deleted only after grace
// (readers of the replicated state may still be finishing), or never if
// stop closes first. The replica stops at once: its raft answers nothing
// more. (A replica that went on answering during the grace could be added
// back by its leader, which would record the old replica's log as
// replicated here; the fresh replica created later from the leader's
// messages, with an empty log, would then be told of commits beyond it,
// which raft treats as a lost log and panics.) Until its state is deleted
// no message re-creates the replica.
func (h *Host) RemoveGroupAfter(id uint64, grace time.Duration, stop <-chan struct{}) error {
	// The replica stops first, and only then leaves the map: once Group
	// returns nil, every message the old replica will ever send has been
	// handed to the transport. (A round in progress sends its messages
	// at its end; had the map forgotten the replica first, a caller that
	// re-adds this node as soon as Group returns nil could have the
	// leader take a late answer of the old replica for one of the new.)
	h.mu.RLock()
	g := h.mu.groups[id]
	h.mu.RUnlock()
	if g != nil {
		if !g.removed.CompareAndSwap(false, true) {
			return nil // another call is removing it
		}
		// Wait for any round in progress on the group to end.
		h.sched.waitIdle(g)
	}
	h.mu.Lock()
	if h.mu.groups[id] == g {
		delete(h.mu.groups, id)
	}
	h.mu.removed[id] = time.Now()
	h.mu.deleting[id] = true
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.mu.deleting, id)
		h.mu.removed[id] = time.Now() // the tombstone runs from the deletion
		h.mu.Unlock()
	}()
	if g == nil {
		return nil
	}
	g.failAllWaiters(ErrLeaderChanged)
	g.forgetGauges()
	if grace > 0 {
		select {
		case <-stop:
			return nil
		case <-time.After(grace):
		}
	}
	b := h.db.NewBatch()
	defer b.Close()
	start, end := groupSpan(id)
	if err := b.DeleteRange(start, end, nil); err != nil {
		return err
	}
	if sn, ok := g.sm.(Snapshotter); ok {
		if err := sn.ClearState(b); err != nil {
			return err
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return err
	}
	h.log.Info("removed replica", "group", id)
	return nil
}

// ReportUnreachable tells group's raft that messages to node did not get
// through.
func (h *Host) ReportUnreachable(group, node uint64) {
	h.mu.RLock()
	g := h.mu.groups[group]
	h.mu.RUnlock()
	if g == nil {
		return
	}
	g.inbox.Lock()
	g.inbox.unreachable = append(g.inbox.unreachable, node)
	g.inbox.Unlock()
	h.sched.enqueue(g)
}

// Deliver hands inbound raft messages to their groups. A leader's message
// for a group not hosted here creates its replica (see Config.NewReplica);
// other messages for such groups are dropped.
func (h *Host) Deliver(msgs []GroupMessage) {
	for _, m := range msgs {
		var g *Group
		var err error
		switch m.Msg.Type {
		case raftpb.MsgApp, raftpb.MsgHeartbeat, raftpb.MsgSnap:
			g, err = h.groupOrCreate(m.Group)
		default:
			g = h.Group(m.Group)
		}
		if err != nil {
			h.log.Warn("cannot create replica", "group", m.Group, "err", err)
		}
		if g == nil {
			continue
		}
		g.inbox.Lock()
		if len(g.inbox.msgs) == 0 {
			g.inbox.msgsSince = time.Now()
		}
		g.inbox.msgs = append(g.inbox.msgs, m.Msg)
		g.inbox.Unlock()
		h.sched.enqueue(g)
	}
}

func (h *Host) runWorker() {
	buf := make([]*Group, 0, h.cfg.MaxGroupsPerRound)
	for {
		// Let the goroutines that are ready to run go first: a worker woken
		// by a proposer (or a receiver) runs right after it on the same
		// processor, before the other proposers already running could
		// queue their work, so a busy node would make a round - a log
		// commit and a message per follower - per proposal. Once they ran
		// (or blocked) the round takes all their work. On an idle node this
		// returns at once.
		runtime.Gosched()
		gs := h.sched.take(h.cfg.MaxGroupsPerRound, buf)
		if gs == nil {
			return
		}
		h.processRound(gs)
		for _, g := range gs {
			h.sched.done(g, g.rn.HasReady())
		}
	}
}

type readyItem struct {
	g  *Group
	rd raft.Ready
}

// processRound runs steps 1-6 of the package documentation for gs.
func (h *Host) processRound(gs []*Group) {
	items := make([]readyItem, 0, len(gs))
	for _, g := range gs {
		if g.removed.Load() {
			continue
		}
		g.drainInbox()
		if g.rn.HasReady() {
			items = append(items, readyItem{g: g, rd: g.rn.Ready()})
		}
	}
	if len(items) == 0 {
		return
	}
	h.metrics.roundGroups.Observe(float64(len(items)))

	// A Ready carrying a snapshot: install it, in a batch of its own, so
	// the state machine reloads before it applies the entries after it.
	for i := range items {
		if it := &items[i]; !raft.IsEmptySnap(it.rd.Snapshot) {
			if err := h.installSnapshot(it.g, it.rd.Snapshot, it.rd.HardState); err != nil {
				h.fatal(err)
				return
			}
			it.g.snapshotInstalled()
		}
	}

	// One batch for the whole round: the state changes of the committed
	// entries (durable in earlier rounds) and the new entries and hard
	// states, committed once, with a single sync if any Ready needs one.
	b := h.db.NewBatch()
	defer b.Close()
	ac := &ApplyContext{Batch: b}
	deliveries, truncations, ok := h.applyEntries(items, ac)
	if !ok {
		return
	}
	mustSync := false
	for i := range items {
		it := &items[i]
		if err := appendReady(b, it.g.id, &it.rd, it.g.lastIndex); err != nil {
			h.fatal(err)
			return
		}
		if raft.MustSync(it.rd.HardState, it.g.prevHard, len(it.rd.Entries)) {
			mustSync = true
		}
	}
	if !b.Empty() {
		start := time.Now()
		opt := pebble.NoSync
		if mustSync {
			opt = pebble.Sync
		}
		if err := b.Commit(opt); err != nil {
			h.fatal(fmt.Errorf("raftgroup: commit round: %w", err))
			return
		}
		if mustSync {
			h.metrics.logSync.Observe(time.Since(start).Seconds())
		}
	}
	for i := range items {
		g, rd := items[i].g, &items[i].rd
		if len(rd.Entries) > 0 {
			if err := g.ms.Append(rd.Entries); err != nil {
				h.fatal(err)
				return
			}
			g.lastIndex = rd.Entries[len(rd.Entries)-1].Index
		}
		if !raft.IsEmptyHardState(rd.HardState) {
			_ = g.ms.SetHardState(rd.HardState)
			g.prevHard = rd.HardState
			g.term = rd.HardState.Term
		}
	}
	for _, t := range truncations {
		t()
	}
	// Step 5: the changes are visible; run the hooks, then wake proposers.
	for _, f := range ac.post {
		f()
	}
	// A proposer of a conf change that wakes up must find it in Status
	// (replica moves check the membership right after one).
	for i := range items {
		if g := items[i].g; g.confApplied {
			g.confApplied = false
			g.publishStatus()
		}
	}
	for _, d := range deliveries {
		d.w.finish(d.result, d.err)
	}
	for i := range items {
		h.observeLeadership(items[i].g, items[i].rd.SoftState)
		items[i].g.answerReadIndexes(items[i].rd.ReadStates)
	}

	// Step 3: send messages, batched per destination.
	h.sendMessages(items)

	// Step 6.
	for i := range items {
		items[i].g.rn.Advance(items[i].rd)
		items[i].g.publishStatus()
	}
}

// observeLeadership updates a group's leadership after a round: a leader
// that lost leadership fails its waiting proposers (but for those that
// wait for their fate, Group.steppedDown); a leader becomes ready
// once it has applied an entry of its own term, since then it has applied
// everything earlier leaders committed.
func (h *Host) observeLeadership(g *Group, ss *raft.SoftState) {
	if ss != nil {
		g.lead = ss.Lead
		wasLeader := g.isLeader
		g.isLeader = ss.RaftState == raft.StateLeader
		if wasLeader != g.isLeader {
			h.metrics.leadership[g.isLeader].Inc()
			h.log.Info("raft leadership changed", "group", g.id, "leader", g.isLeader, "term", g.term, "lead", strconv.FormatUint(ss.Lead, 16))
		}
		if wasLeader && !g.isLeader {
			g.leaderReady = false
			g.steppedDown(h.cfg.FateGrace)
			if o, ok := g.sm.(LeadershipObserver); ok {
				o.LeadershipChanged(false, g.term)
			}
		}
	}
	if g.isLeader && !g.leaderReady && g.appliedTerm == g.term {
		g.leaderReady = true
		if o, ok := g.sm.(LeadershipObserver); ok {
			o.LeadershipChanged(true, g.term)
		}
	}
}

// sendMessages hands the round's messages to the transport, one batch per
// destination, leaving out heartbeats a follower does not need
// (Group.heartbeatNeedless).
func (h *Host) sendMessages(items []readyItem) {
	var byDest map[uint64][]GroupMessage
	for i := range items {
		if items[i].g.removed.Load() {
			continue // removed during the round: it answers nothing more
		}
		g := items[i].g
		for _, m := range items[i].rd.Messages {
			if m.Type == raftpb.MsgSnap {
				h.sendSnapshot(g, m)
				continue
			}
			if g.heartbeatNeedless(&m) {
				h.metrics.heartbeatsSkipped.Inc()
				continue
			}
			if byDest == nil {
				byDest = make(map[uint64][]GroupMessage)
			}
			byDest[m.To] = append(byDest[m.To], GroupMessage{Group: items[i].g.id, Msg: m})
		}
	}
	for to, msgs := range byDest {
		h.transport.Send(to, msgs)
	}
}

type delivery struct {
	w      *waiter
	result any
	err    error
}

// taken adds the deliveries of an applied entry's waiter (w, with the
// entry's result) and of the orphans it proved dead.
func taken(ds []delivery, w *waiter, result any, dead []*waiter) []delivery {
	if w != nil {
		ds = append(ds, delivery{w: w, result: result})
	}
	for _, d := range dead {
		ds = append(ds, delivery{w: d, err: ErrNotLeader})
	}
	return ds
}

// applyEntries applies the committed entries of every item into ac.Batch
// (step 4). It returns the proposers to wake and the log truncations to
// finish once the batch commits.
func (h *Host) applyEntries(items []readyItem, ac *ApplyContext) ([]delivery, []func(), bool) {
	var deliveries []delivery
	var truncations []func()
	for i := range items {
		g, rd := items[i].g, &items[i].rd
		if len(rd.CommittedEntries) == 0 {
			continue
		}
		for j := range rd.CommittedEntries {
			e := &rd.CommittedEntries[j]
			switch e.Type {
			case raftpb.EntryNormal:
				if len(e.Data) == 0 {
					// A new leader's empty entry.
					w, dead := g.takeApplied(0, e.Term)
					deliveries = taken(deliveries, w, nil, dead)
					break
				}
				id, cmd, ok := decodeEntry(e.Data)
				if !ok {
					h.fatal(fmt.Errorf("raftgroup: group %d: entry %d has an unknown format", g.id, e.Index))
					return nil, nil, false
				}
				res := g.sm.Apply(ac, e, cmd)
				w, dead := g.takeApplied(id, e.Term)
				deliveries = taken(deliveries, w, res, dead)
			case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
				var cc raftpb.ConfChangeI
				var err error
				if e.Type == raftpb.EntryConfChange {
					var c raftpb.ConfChange
					err, cc = c.Unmarshal(e.Data), c
				} else {
					var c raftpb.ConfChangeV2
					err, cc = c.Unmarshal(e.Data), c
				}
				if err != nil {
					h.fatal(fmt.Errorf("raftgroup: group %d: corrupt conf change at %d: %w", g.id, e.Index, err))
					return nil, nil, false
				}
				cs := g.rn.ApplyConfChange(cc)
				g.conf = *cs
				g.pruneHeartbeatState()
				g.confApplied = true
				if err := setProto(ac.Batch, raftKey(g.id, kindConfState), cs); err != nil {
					h.fatal(err)
					return nil, nil, false
				}
				var id uint64
				if ctx := confContext(cc); len(ctx) == 8 {
					id = binary.BigEndian.Uint64(ctx)
				}
				w, dead := g.takeApplied(id, e.Term)
				deliveries = taken(deliveries, w, nil, dead)
				if o, ok := g.sm.(ConfObserver); ok {
					o.ConfChanged(*cs)
				}
			}
			g.applied, g.appliedTerm = e.Index, e.Term
		}
		if err := setApplied(ac.Batch, g.id, g.applied, g.appliedTerm); err != nil {
			h.fatal(err)
			return nil, nil, false
		}
		h.metrics.applied.Add(float64(len(rd.CommittedEntries)))
		if t := h.maybeTruncate(ac.Batch, g); t != nil {
			truncations = append(truncations, t)
		}
	}
	return deliveries, truncations, true
}

// maybeTruncate deletes applied log entries beyond LogKeepEntries once
// TruncateEvery more have accumulated. A leader keeps what its followers
// still need.
func (h *Host) maybeTruncate(ab *pebble.Batch, g *Group) func() {
	if g.applied < g.firstIndex+h.cfg.LogKeepEntries+h.cfg.TruncateEvery {
		return nil
	}
	idx := g.applied - h.cfg.LogKeepEntries
	if g.isLeader {
		// Keep what followers still need, including followers whose progress
		// a new leader does not know yet (Match 0), unless a follower is so
		// far behind that it will need a snapshot anyway.
		st := g.rn.Status()
		for id, pr := range st.Progress {
			if id == h.cfg.NodeID || g.applied-pr.Match > h.cfg.MaxFollowerLag {
				continue
			}
			if pr.Match < idx {
				idx = pr.Match
			}
		}
	}
	if idx < g.firstIndex {
		return nil
	}
	term, err := g.ms.Term(idx)
	if err != nil {
		return nil
	}
	if err := ab.DeleteRange(logKey(g.id, g.firstIndex), logKey(g.id, idx+1), nil); err != nil {
		h.fatal(err)
		return nil
	}
	if err := setTruncated(ab, g.id, idx, term); err != nil {
		h.fatal(err)
		return nil
	}
	return func() {
		_ = g.ms.Compact(idx)
		g.firstIndex = idx + 1
	}
}

type raftLogger struct{ l *slog.Logger }

func (r raftLogger) Debug(v ...interface{})                 { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Debugf(format string, v ...interface{}) { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r raftLogger) Error(v ...interface{})                 { r.l.Error(fmt.Sprint(v...)) }
func (r raftLogger) Errorf(format string, v ...interface{}) { r.l.Error(fmt.Sprintf(format, v...)) }
func (r raftLogger) Info(v ...interface{})                  { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Infof(format string, v ...interface{})  { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r raftLogger) Warning(v ...interface{})               { r.l.Warn(fmt.Sprint(v...)) }
func (r raftLogger) Warningf(format string, v ...interface{}) {
	r.l.Warn(fmt.Sprintf(format, v...))
}
func (r raftLogger) Fatal(v ...interface{}) { r.l.Error(fmt.Sprint(v...)); panic(fmt.Sprint(v...)) }
func (r raftLogger) Fatalf(format string, v ...interface{}) {
	r.l.Error(fmt.Sprintf(format, v...))
	panic(fmt.Sprintf(format, v...))
}
func (r raftLogger) Panic(v ...interface{}) { panic(fmt.Sprint(v...)) }
func (r raftLogger) Panicf(format string, v ...interface{}) {
	panic(fmt.Sprintf(format, v...))
}
