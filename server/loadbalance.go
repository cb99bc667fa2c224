package server

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/brainkv/brain/cluster"
	"github.com/brainkv/brain/kvapi"
)

// Leader balancing by load.
//
// A partition's leader does most of the work for its writes (it evaluates
// them, takes their revisions and replicates them), so where the leaders
// of busy partitions are decides how busy each node is. The placement
// rotation spreads leaderships by count, which spreads load only when the
// partitions take the same write rate; partitions split off a hot range
// do not.
//
// So every node measures the write rate of each partition it leads over a
// split window (splitDriver) and gossips, with its leaderships, its leader
// load: the sum of the last measured rates of the partitions it leads now,
// and how many of those it has not measured yet (it got them since its
// last window; such a node is "unsettled": busier than its load says, and
// no load move goes to it until it measured them, or every busy node
// would move a partition to the same idle one). Each round of the leader
// balancer (balanceLeaders), for each partition it leads, a node compares
// its own load with the gossiped loads of the partition's other voters,
// and
//
//   - moves the busiest partition whose move makes the busier of the two
//     nodes less busy - target load + rate < own load - slack - to the
//     least loaded settled voter, only once every round chose a load
//     move for it while this node and the target measured two new
//     windows. Each node measures on its own clock, so when load starts,
//     stops or shifts, the loads compared are of windows that end up to
//     a window apart, and one may have begun before the change; each
//     node's second new window began after the rounds began choosing the
//     move, so a move still chosen then follows loads measured under the
//     same load, not a ramp. (Nodes gossip how many windows they
//     measured with their load.) At most one such move per round, and
//     none for two split windows after one, so the loads gossiped
//     reflect it before the next;
//   - otherwise hands the partition to its preferred node (the placement
//     rotation's) if that does not leave the preferred node busier than
//     this one is now by more than the slack: target load + rate <= own
//     load + slack. With no load anywhere this is the plain rotation.
//     While there is load, only a partition that takes none (no writes
//     in its last window and none remembered) moves so: one that takes
//     writes moves by the load rule alone (see pickLeader).
//     This rule compares the current loads and also remembered loads
//     (both must allow the move): each partition's rate is
//     remembered as the larger of its last window's and its remembered
//     rate decayed with a half-life of loadMemoryHalfLife (a node gossips
//     the sum for the partitions it leads, NodeLoad.Recent). When the
//     writes pause (a quiet night, the gap between two benchmark phases)
//     the current loads all fall to zero, and compared by them every
//     leadership a load move placed would go back to its preferred node
//     within a window, and move again for load once the writes resume:
//     two pauses of the partition's writes for nothing each time. The
//     remembered loads say there is load through such a pause, so the
//     partitions that took writes stay where they are.
//
// The two rules do not undo each other: a preferred-node move never
// creates the imbalance a load move corrects, and under load it moves
// no partition a load move could have placed. Slack (10% of the node's
// load, at least one write a second) keeps nodes with nearly equal loads
// from trading partitions. The TSO and meta groups take no partition
// writes and always go to their preferred node; the TSO leader counts
// the requests it answers in its load (tsoLoad), so it leads fewer
// partitions.

// loadSlack is the fraction of a node's leader load that another node's
// may differ by without a move; minLoadSlack is its floor, in writes/s.
const (
	loadSlack    = 0.1
	minLoadSlack = 1.0
)

// tsoLoad is what one TSO request costs the TSO leader, in partition
// writes (of a partition's leader): the node leading the TSO group counts
// tsoLoad times the requests a second it answers in its leader load, so
// the balancer gives it fewer partition leaderships. In the scaling
// benchmark's 6-node clusters that node answered about 210 requests a
// second (a gRPC call each from the other nodes, a read-index round per
// 6 of them) and used the most CPU of all (22.8-23.8 CPU-s of its 24 in
// the window against 19.5-22), with a partition load no higher than the
// others': 10-15% of a node, about a quarter of a write per request
// (bench/JOURNAL.md, "The balancer at rest, and the TSO beside the
// watch"). Its own TSO code is little of that (0.6% of its CPU in a
// profile): the cost is the calls from other nodes and the read-index
// rounds' messages. With this weight 6-node clusters did 1.06, 1.06,
// 1.07 and 1.14 times the creates of the same build without it, in
// paired rounds ("The TSO leader's load, again"). At low rates, where
// nearly every write is a TSO request of its own, the weight is a
// larger share of the load, and the TSO leader leads fewer partitions
// still; TestSplitForBalance checks the evenness of this load, not of
// the partitions' writes alone.
const tsoLoad = 0.25

// loadMemoryHalfLife is how fast a partition's remembered write rate
// decays once its writes fall (see the file comment).
const loadMemoryHalfLife = 10 * time.Minute

// leaderLoad is what the leader balancer knows of this node's partitions.
type leaderLoad struct {
	sync.Mutex
	// rates is the write rate of each partition this node led through the
	// last split window.
	rates map[uint64]float64
	// recent is each such partition's remembered rate (remember).
	recent map[uint64]float64
	// windows counts the windows rates were measured over.
	windows uint64
	// moving is how many partitions this node led off their placement
	// when the rebalancing loop last counted (cluster.NodeLoad.Moving).
	moving int
	// lastMove is when this node last moved a leadership for load;
	// lastSplit when it last split a partition.
	lastMove, lastSplit time.Time
	// round counts the balancer's rounds; chosen is, for each partition,
	// the load moves the rounds up to the last one chose, and since which
	// of the nodes' windows.
	round  int64
	chosen map[uint64]chosenMove
	// balanceSplit is the last window's choice of a partition to split
	// for balance, and since when the windows chose one
	// (confirmBalanceSplit).
	balanceSplit struct {
		id uint64
		chosenMove
	}
	// unsplittable: in the last window this node led no partition a
	// split for balance could split (cluster.NodeLoad.Unsplittable).
	unsplittable bool
	// tsoRate is the TSO requests a second this node answered over the
	// last window (tsoLoad); tsoRequests the count at its end.
	tsoRate     float64
	tsoRequests int64
	// stale is, for each partition whose leader this node's replica
	// knows before gossip does, that leader and since when (markStale).
	stale map[uint64]staleLeader
}

type chosenMove struct {
	ownAt   uint64            // this node's window count when rounds began choosing a load move
	ownLoad float64           // and its load then
	toAt    map[uint64]uint64 // each target's window count when a round first chose it
	round   int64             // the last round that chose a load move
}

// loadView is what one balancer round knows of the nodes' leader loads:
// each node's load and remembered load, the nodes that lead partitions
// they have not measured yet, and how many windows each node measured.
type loadView struct {
	loads     map[uint64]float64
	recent    map[uint64]float64
	unsettled map[uint64]bool
	windows   map[uint64]uint64
	// moving holds the nodes leading partitions whose replicas are not at
	// their placement (cluster.NodeLoad.Moving).
	moving map[uint64]bool
	// unsplittable holds the nodes that lead no partition a split for
	// balance could split (cluster.NodeLoad.Unsplittable).
	unsplittable map[uint64]bool
}

// calm reports whether no node leads a partition it has not measured or
// whose replicas are moving: the loads show every split and move made.
func (v loadView) calm() bool {
	for n := range v.loads {
		if v.unsettled[n] || v.moving[n] {
			return false
		}
	}
	return true
}

// busiest reports whether node n is the lowest ID among the nodes whose
// load is within the slack of the highest: one node of those the rates'
// noise makes the busiest by turns, and the same one in each window.
// Only nodes that have a partition to split count: a busiest node whose
// partitions all have too few keys would otherwise keep every other node
// from splitting across placements for good (TestSplitAcrossPlacements
// saw it, a node leading only the halves of a split for balance).
func (v loadView) busiest(n uint64) bool {
	if v.unsplittable[n] {
		return false
	}
	most := 0.0
	for m, l := range v.loads {
		if !v.unsplittable[m] {
			most = max(most, l)
		}
	}
	floor := most - max(minLoadSlack, loadSlack*most)
	if v.loads[n] < floor {
		return false
	}
	for m, l := range v.loads {
		if m < n && l >= floor && !v.unsplittable[m] {
			return false
		}
	}
	return true
}

// anyLoad reports whether any node has a leader load, current or
// remembered.
func (v loadView) anyLoad() bool {
	for _, l := range v.loads {
		if l > 0 {
			return true
		}
	}
	for _, l := range v.recent {
		if l > 0 {
			return true
		}
	}
	return false
}

// recentOf is node n's remembered load: at least its current one (a node
// of an earlier version publishes none).
func (v loadView) recentOf(n uint64) float64 { return max(v.recent[n], v.loads[n]) }

// moved updates the view for a partition that took rate writes/s
// (recent remembered) and moved from node from to node to.
func (v loadView) moved(from, to uint64, rate, recent float64) {
	fromRecent, toRecent := v.recentOf(from), v.recentOf(to)
	v.loads[from] -= rate
	v.loads[to] += rate
	v.recent[from] = fromRecent - recent
	v.recent[to] = toRecent + recent
}

// remembered returns partition id's remembered rate, given its last rate.
func (l *leaderLoad) remembered(id uint64, rate float64) float64 {
	l.Lock()
	defer l.Unlock()
	return max(rate, l.recent[id])
}

// remember records the rates of the partitions this node led through the
// last window, which lasted window: each one's remembered rate becomes the
// larger of its rate and its remembered rate decayed over the window. A
// partition it no longer leads is forgotten (its new leader measures it).
func (l *leaderLoad) remember(rates map[uint64]float64, window time.Duration) {
	decay := math.Exp2(-window.Seconds() / loadMemoryHalfLife.Seconds())
	recent := make(map[uint64]float64, len(rates))
	for id, r := range rates {
		recent[id] = max(r, l.recent[id]*decay)
	}
	l.rates = rates
	l.recent = recent
	l.windows++
}

// confirmWindows is how many windows of its own and of its target's a node
// waits for, with every round choosing a load move for the partition,
// before making it: the first may have begun before the loads that chose
// it changed. A node that publishes no count (one older than the count)
// gets no load moves.
const confirmWindows = 2

// balanceSplitCooldown is how many split windows after its last split or
// load move a node makes no split for balance.
const balanceSplitCooldown = 2 + confirmWindows

// loadFallRestarts is the fraction by which a node's own load may fall
// while rounds choose a load move before the choice starts over: the load
// is going away (it stops, or the node shed other leaderships), and a
// marginal imbalance that noise keeps choosing on and off would otherwise
// be confirmed as it goes. A load that grows only makes the move more
// worthwhile.
const loadFallRestarts = 0.25

// nextRound starts a balancer round.
func (l *leaderLoad) nextRound() {
	l.Lock()
	l.round++
	l.Unlock()
}

// confirmLoadMove records that this round chose to move group id's
// leadership for load, to node to, when this node and node to had
// measured own and target windows and this node's load was ownLoad, and
// reports whether every round chose a load move for it since this node
// measured confirmWindows more, and node to did since a round first chose
// it. The target may differ from round to round (two voters of nearly
// equal loads trade places with the rates' noise); a round that chose no
// load move, or skipped the group, starts over, as does a target whose
// count went back (it restarted) and a load that fell by more than
// loadFallRestarts since the choice began.
func (l *leaderLoad) confirmLoadMove(id, to, own, target uint64, ownLoad float64) bool {
	l.Lock()
	defer l.Unlock()
	if l.chosen == nil {
		l.chosen = make(map[uint64]chosenMove)
	}
	c, ok := l.chosen[id]
	if at, seen := c.toAt[to]; !ok || c.round != l.round-1 || own < c.ownAt || (seen && target < at) ||
		ownLoad < (1-loadFallRestarts)*c.ownLoad {
		c = chosenMove{ownAt: own, ownLoad: ownLoad, toAt: map[uint64]uint64{}}
	}
	if _, seen := c.toAt[to]; !seen {
		c.toAt[to] = target
	}
	c.round = l.round
	l.chosen[id] = c
	return own >= c.ownAt+confirmWindows && target >= c.toAt[to]+confirmWindows
}

// decide is one balancer round's decision for group id, which this node
// (self) leads and which took rate writes/s (measured: over a whole
// window it led it through): where its leadership goes (0: it stays), and
// whether that is a load move. A load move pickLeader chooses is made only
// once confirmLoadMove confirms it. A partition this node has not
// measured yet stays while any node has load: its rate is unknown, and
// the node a load move has just reached would otherwise take it for idle
// and hand it back to its preferred node, the sender. With no load
// anywhere (a cluster starting) the rotation applies at once.
func (l *leaderLoad) decide(self, id, pref uint64, rate float64, measured bool, v loadView, candidates []uint64, byLoad bool) (to uint64, forLoad bool) {
	if !measured && v.anyLoad() {
		l.forgetLoadMove(id)
		return 0, false
	}
	to, forLoad = pickLeader(self, pref, rate, l.remembered(id, rate), v, candidates, byLoad)
	if forLoad && !l.confirmLoadMove(id, to, v.windows[self], v.windows[to], v.loads[self]) {
		return 0, false
	}
	l.forgetLoadMove(id)
	return to, forLoad
}

// forgetLoadMove drops group id's chosen load move (it moved, or a round
// chose none: the next choice starts over).
func (l *leaderLoad) forgetLoadMove(id uint64) {
	l.Lock()
	delete(l.chosen, id)
	l.Unlock()
}

// setLeaderRates records the last window's rates of the partitions this
// node leads, and of the TSO requests it answered.
func (s *Server) setLeaderRates(rates map[uint64]float64) {
	var sum float64
	for _, r := range rates {
		sum += r
	}
	s.load.Lock()
	s.load.remember(rates, s.cfg.SplitWindow)
	n := s.oracle.Requests()
	s.load.tsoRate = float64(n-s.load.tsoRequests) / s.cfg.SplitWindow.Seconds()
	s.load.tsoRequests = n
	s.load.Unlock()
	s.leaderWriteRate.Set(sum)
}

// leaderRate returns partition id's write rate over the last window this
// node led it through, and whether it did (else 0, false).
func (s *Server) leaderRate(id uint64) (float64, bool) {
	s.load.Lock()
	defer s.load.Unlock()
	r, ok := s.load.rates[id]
	return r, ok
}

// ownLoad returns this node's leader load now: the rates of the partitions
// among led that it measured, and how many it did not measure yet.
func (s *Server) ownLoad(led []uint64) cluster.NodeLoad {
	s.load.Lock()
	defer s.load.Unlock()
	l := cluster.NodeLoad{Windows: s.load.windows, Moving: s.load.moving, Unsplittable: s.load.unsplittable}
	if slices.Contains(led, kvapi.TSOGroup) {
		l.Load = tsoLoad * s.load.tsoRate
		l.Recent = l.Load
	}
	for _, id := range led {
		if !s.isPartition(id) {
			continue
		}
		if r, ok := s.load.rates[id]; ok {
			l.Load += r
			l.Recent += s.load.recent[id]
		} else {
			l.Unmeasured++
		}
	}
	if s.leaderLoadGauge != nil {
		s.leaderLoadGauge.Set(l.Load)
	}
	return l
}

// nodeLoads returns the leader load of every alive node (this node's from
// the partitions it leads now, the others' as gossiped: at most a gossip
// round old, as each node publishes its own with its leaderships), the
// nodes that lead partitions they have not measured yet, whose load is
// low by an unknown amount, and how many windows each measured.
//
// So is a node that, by this node's replicas, leads a partition it did
// not list with the load it gossiped (markStale).
func (s *Server) nodeLoads(led []uint64) loadView {
	v := newLoadView()
	published := s.membership.Published()
	all := make(map[uint64]cluster.NodeLoad, len(published))
	listed := make(map[uint64][]uint64, len(published))
	for id, info := range published {
		all[id] = info.NodeLoad
		if !info.LeadsOmitted {
			listed[id] = info.Leads
		}
	}
	all[s.id.MemberID] = s.ownLoad(led)
	delete(listed, s.id.MemberID)
	leaders := map[uint64]uint64{}
	for _, p := range s.servingPartitions() {
		if g := s.host.Group(p.ID()); g != nil {
			if lead := g.Status().Lead; lead != 0 {
				leaders[p.ID()] = lead
			}
		}
	}
	for id, l := range all {
		v.loads[id] = l.Load
		v.recent[id] = l.Recent
		v.windows[id] = l.Windows
		if l.Unmeasured > 0 {
			v.unsettled[id] = true
		}
		if l.Moving > 0 {
			v.moving[id] = true
		}
		if l.Unsplittable {
			v.unsplittable[id] = true
		}
	}
	s.load.markStale(v, staleLeaders(leaders, listed), time.Now())
	return v
}

// staleLeaders returns the partitions (of leaders: each partition this
// node holds a replica of, and its leader as the replica knows it) whose
// leader did not list them with the load it last gossiped (listed: each
// node's listed leaderships; a node that omitted them, or this one, is
// absent), and that leader. Its load is from before the leadership, low
// by the partition's rate as an unmeasured one's is: gossip shows a
// leadership a round or so later than a replica does.
func staleLeaders(leaders map[uint64]uint64, listed map[uint64][]uint64) map[uint64]uint64 {
	out := map[uint64]uint64{}
	for id, lead := range leaders {
		if l, ok := listed[lead]; ok && !slices.Contains(l, id) {
			out[id] = lead
		}
	}
	return out
}

// staleFor bounds how long a leadership gossip does not show makes its
// leader unsettled (markStale): gossip carries one in about a second, so
// a replica that reports a leader longer than this without gossip
// agreeing is itself behind (cut off, or removed and not yet collected),
// and must not hold a node unsettled for good.
const staleFor = 10 * time.Second

// markStale marks unsettled in v every node that leads a partition of
// stale (staleLeaders) it got since it last gossiped, as one that leads a
// partition it has not measured is. Without this, two nodes that both
// saw the same idle voter sent it load in the same second: one moved a
// partition's leadership there, and the other, still seeing the load that
// voter gossiped before, split a partition for balance toward it
// (TestSplitAcrossPlacements failed so; TestBalancerSeesLeadershipsBeforeLoads).
// A disagreement older than staleFor is ignored.
func (l *leaderLoad) markStale(v loadView, stale map[uint64]uint64, now time.Time) {
	l.Lock()
	defer l.Unlock()
	seen := make(map[uint64]staleLeader, len(stale))
	for id, lead := range stale {
		s, ok := l.stale[id]
		if !ok || s.lead != lead {
			s = staleLeader{lead: lead, since: now}
		}
		seen[id] = s
		if now.Sub(s.since) < staleFor {
			v.unsettled[lead] = true
		}
	}
	l.stale = seen
}

type staleLeader struct {
	lead  uint64
	since time.Time
}

func newLoadView() loadView {
	return loadView{loads: map[uint64]float64{}, recent: map[uint64]float64{}, unsettled: map[uint64]bool{}, windows: map[uint64]uint64{}, moving: map[uint64]bool{}, unsplittable: map[uint64]bool{}}
}

// pickLeader decides where the leadership of a partition that self leads,
// and that took rate writes/s (recent remembered), goes: to the least
// loaded of candidates (voters that can take it) when byLoad is allowed
// and that evens out the loads, else to pref when that does not unbalance
// the remembered loads (see the file comment). It returns 0 to keep it.
func pickLeader(self, pref uint64, rate, recent float64, v loadView, candidates []uint64, byLoad bool) (to uint64, forLoad bool) {
	loads, unsettled := v.loads, v.unsettled
	own := loads[self]
	slack := max(minLoadSlack, loadSlack*own)
	// A node that got leaderships it has not measured yet is busier than
	// its load says: no load move goes there until it has (without this,
	// every busy node would move a partition to the same idle one).
	targets := slices.DeleteFunc(slices.Clone(candidates), func(n uint64) bool { return unsettled[n] })
	if byLoad && rate > 0 && len(targets) > 0 {
		least := slices.MinFunc(targets, func(a, b uint64) int {
			if c := cmp.Compare(loads[a], loads[b]); c != 0 {
				return c
			}
			switch {
			case a == pref:
				return -1
			case b == pref:
				return 1
			}
			return cmp.Compare(a, b)
		})
		if loads[least]+rate < own-slack {
			return least, true
		}
	}
	// By the current loads as well as the remembered ones: remembered
	// loads alone let the node a load move had just gone to hand the
	// partition straight back to its preferred node, the sender (the
	// receiver's remembered load, of rates from before the hot range's
	// last splits, was high; the scaling benchmark's one-prefix runs did
	// that to the same partition every 12 to 30 s). The current loads
	// are what the load rule compares, so a move that leaves them
	// balanced never undoes one.
	//
	// Nor to a preferred node that leads partitions it has not measured
	// yet while there is load: its load is low by an unknown amount (it
	// may have just received a load move; the simulation saw the other
	// half of a split follow the first there, and both come back).
	//
	// And while there is load, only a partition that takes none (no
	// writes in its last window, none remembered) goes to its preferred
	// node; one that takes writes moves by the load rule alone. Loads
	// measured over a few seconds of a starved node move by more than
	// the slack between the two rules' conditions from window to window,
	// so under a steady load they took turns with the same partitions (a
	// load move handed back 5-8 s later; bench/JOURNAL.md, "The balancer
	// at rest"; TestNoisyLoadSettles).
	loaded := v.anyLoad()
	idle := rate == 0 && recent < minLoadSlack
	ownRecent := v.recentOf(self)
	if pref != self && slices.Contains(candidates, pref) &&
		(!loaded || (idle && !unsettled[pref])) &&
		loads[pref]+rate <= own+slack &&
		v.recentOf(pref)+recent <= ownRecent+max(minLoadSlack, loadSlack*ownRecent) {
		return pref, false
	}
	return 0, false
}

// Splits for balance.
//
// Load moves place whole partitions, so how evenly they can spread load is
// bounded by the partitions' sizes: a hot range split into 13 partitions
// of similar rates over 6 nodes leaves one node leading 3 of them and the
// others 2 (the scaling benchmark's one-prefix load did exactly that), and
// no move evens that out - moving one of the three leaves its target
// leading three - so pickLeader rightly makes none. Splitting one of them
// does: its halves are two partitions of half the rate, and one of them
// can move.
//
// So a node whose leader load exceeds a voter's by more than a whole move
// of its busiest partition can fix (least + rate >= own - slack) but by
// more than half of it (least + rate/2 < own - slack) splits that
// partition at the middle of its written keys (splitForBalanceOnce), once
// confirmed as a load move is (confirmBalanceSplit); the load rule then
// moves a half. Not within balanceSplitCooldown windows of its last split
// or load move: the halves must be measured and a load move confirmed
// (confirmWindows) before the loads show what the split did. Only
// partitions that take at least a quarter of --split-write-rate split so:
// a split is cheap, but each partition costs every replica a raft group,
// and a cluster with little load has nothing to even out.

// Splits across placements.
//
// Leadership moves only within a partition's voters, and with copysets
// (or any placement that gives a partition fewer voters than there are
// nodes) the voters of a hot range's partitions fall on a few sets of
// nodes. A small partition's split gives its new half a placement of its
// own (the count of split partitions per node and placement decides it:
// childPlacement; a large one's half keeps its voters: localSplitKeys),
// but halving ranges leaves partitions whose rates differ by 2x to 4x, so
// equal counts are not equal loads: in a 6-node scaling benchmark run, one
// copyset's partitions took 62% of the writes, its three nodes were
// throttled 83-91% of the time and the other's 55-59%, and the busy
// copyset bounded the throughput. Neither a load move nor a split for
// balance within the voters can change that.
//
// So when no node leads a partition it has not measured or whose replicas
// are moving (loadView.calm: the loads show every earlier split and
// move), the busiest node of all splits its busiest partition whose half
// would leave a node outside the partition's voters (its far nodes) less
// loaded than this node is now, by more than the slack - least + rate/2 <
// own - slack - and places the new half with that node as its preferred
// leader (childPlacement). The rebalancing loop moves the half's replicas
// there (a snapshot each) and the preferred-node rule its leadership. Only
// the busiest node does, and only while calm, so two nodes do not send
// halves to the same least loaded node before the loads show the first;
// the half's move and leadership change keep the cluster from calm until
// they are done and measured. It is confirmed and cooled down as a split
// for balance is. At 3 nodes with three replicas every node is a voter of
// every partition, and it never happens.

// ledPartition is a partition this node leads, for splitForBalance: its
// last window's rate, the voters its leadership can move to, and the live
// nodes that are not its voters (where a split across placements may put
// a half).
type ledPartition struct {
	id         uint64
	rate       float64
	candidates []uint64
	far        []uint64
}

// leastLoaded returns the least loaded of nodes that is not unsettled in
// v, and its load (+Inf and 0 if none).
func (v loadView) leastLoaded(nodes []uint64) (float64, uint64) {
	least, target := math.Inf(1), uint64(0)
	for _, c := range nodes {
		if !v.unsettled[c] && v.loads[c] < least {
			least, target = v.loads[c], c
		}
	}
	return least, target
}

// splitForBalance returns the partition among led (this node's, self's)
// whose split lets a load move even out the loads v holds where no load
// move of a whole partition can, and the voter a half would move to, or
// 0: the busiest one that takes at least floor writes/s, has a settled
// candidate, and that no load move can take away (pickLeader would move
// it) but half of which one can, by more than the slack (a finer split
// would trade crumbs). Failing that, it returns a split across
// placements (splitAcross), whose target is a far node.
func splitForBalance(self uint64, led []ledPartition, v loadView, floor float64) (id, to uint64) {
	own := v.loads[self]
	slack := max(minLoadSlack, loadSlack*own)
	var best ledPartition
	for _, p := range led {
		least, target := v.leastLoaded(p.candidates)
		switch {
		case p.rate <= 0 || math.IsInf(least, 1):
		case least+p.rate < own-slack:
			// A load move evens it out: the balancer makes that one.
			return 0, 0
		case p.rate >= floor && p.rate > best.rate && least+p.rate/2 < own-slack && p.rate/2 > slack:
			best, to = p, target
		}
	}
	if best.id != 0 {
		return best.id, to
	}
	return splitAcross(self, led, v, floor)
}

// splitAcross returns the partition among led (self's) to split across
// placements, and the far node its new half is to be led by, or 0 (see
// "Splits across placements"): while v is calm and self is the busiest
// node, the busiest partition taking at least floor writes/s whose half
// would leave its least loaded settled far node less loaded than self
// by more than the slack, and is more than the slack itself.
func splitAcross(self uint64, led []ledPartition, v loadView, floor float64) (id, to uint64) {
	if !v.calm() || !v.busiest(self) {
		return 0, 0
	}
	own := v.loads[self]
	slack := max(minLoadSlack, loadSlack*own)
	var best ledPartition
	for _, p := range led {
		least, target := v.leastLoaded(p.far)
		if target != 0 && p.rate >= floor && p.rate > best.rate && least+p.rate/2 < own-slack && p.rate/2 > slack {
			best, to = p, target
		}
	}
	return best.id, to
}

// confirmBalanceSplit records that this window chose to split partition
// id for balance (0: none), for a load move to node to, when this node
// and node to had measured own and target windows and this node's load
// was ownLoad, and reports whether every window since this node measured
// confirmWindows more chose a split, and node to measured as many since a
// window first chose it: as for a load move (confirmLoadMove), the loads
// compared when load starts or shifts may come from windows that began
// before it. Which partition may change from window to window (equally
// busy ones trade places with the rates' noise). A window that chose none
// starts over, as does a load of this node's that fell by more than
// loadFallRestarts.
func (l *leaderLoad) confirmBalanceSplit(id, to, own, target uint64, ownLoad float64) bool {
	l.Lock()
	defer l.Unlock()
	b := &l.balanceSplit
	if id == 0 || b.id == 0 || own < b.ownAt || ownLoad < (1-loadFallRestarts)*b.ownLoad {
		b.id, b.chosenMove = id, chosenMove{ownAt: own, ownLoad: ownLoad, toAt: map[uint64]uint64{}}
	}
	if id == 0 {
		return false
	}
	if at, seen := b.toAt[to]; !seen || target < at {
		b.toAt[to] = target
	}
	if own >= b.ownAt+confirmWindows && target >= b.toAt[to]+confirmWindows {
		b.id, b.chosenMove = 0, chosenMove{}
		return true
	}
	return false
}
