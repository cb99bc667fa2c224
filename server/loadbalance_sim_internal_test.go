package server

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/brainkv/brain/cluster"
)

// balanceSim simulates the leader balancer's load rule (leaderLoad.decide)
// and splits for balance (splitForBalance) on n nodes leading partitions
// (12 unless told) by the placement rotation, through a load that starts
// at L and stops at E. Every node measures its windows and runs its rounds
// on its own clock (random phases), and sees the others' loads as they
// published them a second earlier.
type balanceSim struct {
	n    int
	L, E time.Duration
	hot  float64 // partition 0's write rate, in multiples of the others'
	// fullWindows: rates only of partitions led through a whole window,
	// and no move of one without (as the server does); false: the rate
	// since the leadership began counts (as it did before).
	fullWindows bool
	r           *rand.Rand

	leader []int           // partition -> node (0-based)
	gained []time.Duration // partition -> when its leader got it
	weight []float64       // partition -> its share of the load, in partitions
	base   []int           // partition -> the first node of its copyset
	nodes  []*simNode

	loadMoves, preferredMoves int
	preferredUnderLoad        int      // preferred moves while the load lasts
	late                      []string // load moves after E+window
	undone                    []string // preferred moves after E+window of partitions a load move placed
	settledLate               int      // preferred moves after E+window of others (a split's new partition)
	loadPlaced                map[int]bool
	// movedFrom is, for each partition a load move placed, the node it
	// came from and when; bounced lists preferred moves that sent it
	// straight back.
	movedFrom  map[int]simMoved
	bounced    []string
	splits     []string // splits for balance
	lateSplits int      // of them after E+window
	// loadsBeforeE is each node's share of the load a second before E.
	loadsBeforeE []float64

	// across: splits for balance may place a half on far nodes
	// (splitAcross); its replicas take moveDelay to get there, led by
	// the splitter meanwhile, then its preferred node (prefer) leads it.
	across    bool
	moveDelay time.Duration
	// noise is how far a measured rate strays from the true one, as a
	// fraction either way.
	noise float64
	// blindToReplicas: a node sees others' leaderships by gossip only, as
	// before markStale; stale lists the load moves and splits for
	// balance a node made toward a node whose load it saw from before a
	// leadership its own replicas showed.
	blindToReplicas bool
	stale           []string
	now             time.Duration
	movingUntil     map[int]time.Duration
	prefer          map[int]int
	acrossSplits    int
}

type simMoved struct {
	from int
	at   time.Duration
}

type simNode struct {
	phaseW, phaseR time.Duration
	rates          map[uint64]float64
	ledBefore      map[int]bool // the partitions it led at its last window's end
	windows        uint64
	pub            []simPub // what it published, when it changed
	ll             leaderLoad
	lastMove       time.Duration
	lastSplit      time.Duration
}

type simPub struct {
	at    time.Duration
	l     cluster.NodeLoad
	leads []uint64 // the partitions it led (1-based)
}

const (
	simWindow = 10 * time.Second
	simRound  = 5 * time.Second
	simDelay  = time.Second
	simTick   = 100 * time.Millisecond
	simParts  = 12
	simRate   = 90.0
	// simSplitFloor is the floor of a split for balance: a quarter of
	// the scaling benchmark's --split-write-rate 200.
	simSplitFloor = 50.0
)

func newBalanceSim(seed uint64, n int, hot float64, loadFor time.Duration) *balanceSim {
	return newBalanceSimParts(seed, n, simParts, hot, loadFor)
}

func newBalanceSimParts(seed uint64, n, parts int, hot float64, loadFor time.Duration) *balanceSim {
	r := rand.New(rand.NewPCG(seed, 7))
	s := &balanceSim{n: n, hot: hot, r: r, fullWindows: true, loadPlaced: map[int]bool{}, movedFrom: map[int]simMoved{},
		moveDelay: 5 * time.Second, noise: 0.1, movingUntil: map[int]time.Duration{}, prefer: map[int]int{}}
	s.L = time.Duration(20+r.IntN(10)) * time.Second
	s.E = s.L + loadFor + time.Duration(r.IntN(10))*time.Second
	for p := range parts {
		s.leader = append(s.leader, p%n)
		s.gained = append(s.gained, 0)
		s.weight = append(s.weight, 1)
		s.base = append(s.base, (p%n)/3*3)
	}
	s.weight[0] = hot
	for range n {
		s.nodes = append(s.nodes, &simNode{
			phaseW:    time.Duration(r.Int64N(int64(simWindow/simTick))) * simTick,
			phaseR:    time.Duration(r.Int64N(int64(simRound/simTick))) * simTick,
			rates:     map[uint64]float64{},
			lastMove:  -time.Hour,
			lastSplit: -time.Hour,
		})
	}
	return s
}

// voters returns partition p's voters: one copyset of three.
func (s *balanceSim) voters(p int) []int {
	base := s.base[p]
	return []int{base, base + 1, base + 2}
}

// measured is partition p's write rate over the window [a, b), with
// s.noise.
func (s *balanceSim) measured(p int, a, b time.Duration) float64 {
	lo, hi := max(a, s.L), min(b, s.E)
	if hi <= lo {
		return 0
	}
	rate := simRate * s.weight[p]
	return rate * (1 - s.noise + 2*s.noise*s.r.Float64()) * float64(hi-lo) / float64(b-a)
}

// own is node i's leader load now, as ownLoad computes it.
func (s *balanceSim) own(i int) cluster.NodeLoad {
	nd := s.nodes[i]
	l := cluster.NodeLoad{Windows: nd.windows}
	for p, at := range s.leader {
		if at != i {
			continue
		}
		if x, ok := nd.rates[uint64(p)]; ok {
			l.Load += x
			l.Recent += nd.ll.recent[uint64(p)]
		} else {
			l.Unmeasured++
		}
		if s.movingUntil[p] > s.now {
			l.Moving++
		}
	}
	return l
}

// leads returns the partitions node i leads now, 1-based (as group IDs
// are: partition 0 is group 1).
func (s *balanceSim) leads(i int) []uint64 {
	var out []uint64
	for p, at := range s.leader {
		if at == i {
			out = append(out, uint64(p+1))
		}
	}
	return out
}

// seen returns what node i sees at now of what node j published: its
// publication of simDelay earlier.
func (s *balanceSim) seen(i, j int, now time.Duration) simPub {
	var out simPub
	for _, pb := range s.nodes[j].pub {
		if pb.at <= now-simDelay {
			out = pb
		}
	}
	return out
}

// replicaLeaders returns the leader of each partition node i is a voter
// of (and does not lead), 1-based, as i's replicas know them: at once.
func (s *balanceSim) replicaLeaders(i int) map[uint64]uint64 {
	out := map[uint64]uint64{}
	for p, at := range s.leader {
		if _, moving := s.movingUntil[p]; !moving && at != i && slices.Contains(s.voters(p), i) {
			out[uint64(p+1)] = uint64(at + 1)
		}
	}
	return out
}

// staleLeads returns, as staleLeaders does for a server, the partitions
// node i's replicas know the leader of while the load i sees that leader
// publish is from before it, and that leader.
func (s *balanceSim) staleLeads(i int, now time.Duration) map[uint64]uint64 {
	listed := map[uint64][]uint64{}
	for j := range s.nodes {
		if j != i {
			listed[uint64(j+1)] = s.seen(i, j, now).leads
		}
	}
	return staleLeaders(s.replicaLeaders(i), listed)
}

// staleSend records, if node i's view at now holds a load of node to
// from before a leadership i's replicas show, that i sent it load then.
func (s *balanceSim) staleSend(i int, to uint64, now time.Duration, what string) {
	for p, lead := range s.staleLeads(i, now) {
		if lead == to {
			s.stale = append(s.stale, fmt.Sprintf("%v: node %d %s toward node %d, whose load it saw from before it led partition %d", now, i+1, what, to, p-1))
			return
		}
	}
}

// view is node i's loadView at now.
func (s *balanceSim) view(i int, now time.Duration) loadView {
	v := newLoadView()
	for j := range s.nodes {
		var l cluster.NodeLoad
		if j == i {
			l = s.own(i)
		} else {
			l = s.seen(i, j, now).l
		}
		v.loads[uint64(j+1)] = l.Load
		v.recent[uint64(j+1)] = l.Recent
		v.windows[uint64(j+1)] = l.Windows
		if l.Unmeasured > 0 {
			v.unsettled[uint64(j+1)] = true
		}
		if l.Moving > 0 {
			v.moving[uint64(j+1)] = true
		}
	}
	if !s.blindToReplicas {
		s.nodes[i].ll.markStale(v, s.staleLeads(i, now), time.Unix(0, 0).Add(now))
	}
	return v
}

// preferred returns partition p's preferred node (0-based).
func (s *balanceSim) preferred(p int) int {
	if x, ok := s.prefer[p]; ok {
		return x
	}
	return p % s.n
}

// round is node i's balancer round at now, as balanceLeadersOnce runs it.
func (s *balanceSim) round(i int, now time.Duration) {
	nd := s.nodes[i]
	v := s.view(i, now)
	nd.ll.nextRound()
	byLoad := now-nd.lastMove > 2*simWindow
	var led []int
	for p, at := range s.leader {
		if at == i {
			led = append(led, p)
		}
	}
	slices.SortStableFunc(led, func(a, b int) int { return cmp.Compare(nd.rates[uint64(b)], nd.rates[uint64(a)]) })
	self := uint64(i + 1)
	for _, p := range led {
		if _, moving := s.movingUntil[p]; moving {
			continue // not at its voters yet: leaderCandidates refuses
		}
		var cands []uint64
		for _, x := range s.voters(p) {
			if x != i {
				cands = append(cands, uint64(x+1))
			}
		}
		rate, measured := nd.rates[uint64(p)]
		if !s.fullWindows {
			measured = true // as before: any rate counts
		}
		to, forLoad := nd.ll.decide(self, uint64(p), uint64(s.preferred(p)+1), rate, measured, v, cands, byLoad)
		if to == 0 {
			continue
		}
		if forLoad {
			s.staleSend(i, to, now, fmt.Sprintf("moved partition %d for load", p))
			s.loadMoves++

			if now >= s.E+simWindow {
				s.late = append(s.late, fmt.Sprintf("%v: node %d moved partition %d to node %d (loads %v)", now, self, p, to, v.loads))
			}
			byLoad = false
			nd.lastMove = now
			s.loadPlaced[p] = true
			s.movedFrom[p] = simMoved{i, now}
		} else {
			if m, ok := s.movedFrom[p]; ok && m.from == int(to-1) && now-m.at < 3*simWindow {
				s.bounced = append(s.bounced, fmt.Sprintf("%v: node %d handed partition %d back to its preferred node %d, which moved it there for load at %v (loads %v, remembered %v)", now, self, p, to, m.at, v.loads, v.recent))
			}
			s.preferredMoves++
			if now >= s.L && now < s.E {
				s.preferredUnderLoad++
			}
			switch {
			case now < s.E+simWindow:
			case s.loadPlaced[p]:
				s.undone = append(s.undone, fmt.Sprintf("%v: node %d handed partition %d to its preferred node %d (loads %v, remembered %v)", now, self, p, to, v.loads, v.recent))
			default:
				// Within the slack of the remembered loads, and kept
				// only by the current ones while the load lasted.
				s.settledLate++
			}
			delete(s.loadPlaced, p)
		}
		s.leader[p] = int(to - 1)
		if simTrace != nil {
			*simTrace = append(*simTrace, fmt.Sprintf("%v: %d -> %d partition %d load %v rate %v loads %v", now, self, to, p, forLoad, rate, v.loads))
		}
		s.gained[p] = now
		v.moved(self, to, rate, nd.ll.remembered(uint64(p), rate))
	}
}

// splitOnce is node i's split for balance at now, after it measured a
// window, as splitForBalanceOnce makes it.
func (s *balanceSim) splitOnce(i int, now time.Duration) {
	nd := s.nodes[i]
	v := s.view(i, now)
	cooldown := balanceSplitCooldown * simWindow
	if now-nd.lastMove < cooldown || now-nd.lastSplit < cooldown || v.unsettled[uint64(i+1)] {
		nd.ll.confirmBalanceSplit(0, 0, 0, 0, 0)
		return
	}
	var led []ledPartition
	for p, at := range s.leader {
		if _, moving := s.movingUntil[p]; at != i || moving {
			continue
		}
		lp := ledPartition{id: uint64(p + 1), rate: nd.rates[uint64(p)]}
		for _, x := range s.voters(p) {
			if x != i {
				lp.candidates = append(lp.candidates, uint64(x+1))
			}
		}
		for x := range s.n {
			if s.across && !slices.Contains(s.voters(p), x) {
				lp.far = append(lp.far, uint64(x+1))
			}
		}
		led = append(led, lp)
	}
	self := uint64(i + 1)
	id, to := splitForBalance(self, led, v, simSplitFloor)
	if !nd.ll.confirmBalanceSplit(id, to, v.windows[self], v.windows[to], v.loads[self]) {
		return
	}
	p := int(id - 1)
	s.staleSend(i, to, now, fmt.Sprintf("split partition %d for balance", p))
	nd.lastSplit = now
	s.weight[p] /= 2
	s.leader = append(s.leader, i)
	s.gained = append(s.gained, now)
	s.weight = append(s.weight, s.weight[p])
	if t := int(to - 1); !slices.Contains(s.voters(p), t) {
		// Across placements: the half's replicas move to t's copyset.
		child := len(s.leader) - 1
		s.base = append(s.base, t/3*3)
		s.prefer[child] = t
		s.movingUntil[child] = now + s.moveDelay
		s.acrossSplits++
	} else {
		s.base = append(s.base, s.base[p])
	}
	s.splits = append(s.splits, fmt.Sprintf("%v: node %d split partition %d (loads %v)", now, i+1, p, v.loads))
	if now >= s.E+simWindow {
		s.lateSplits++
	}
}

// shares returns each node's share of the load, in partitions.
func (s *balanceSim) shares() []float64 {
	out := make([]float64, s.n)
	for p, at := range s.leader {
		out[at] += s.weight[p]
	}
	return out
}

// run simulates until a minute after the load stops.
func (s *balanceSim) run() {
	for now := time.Duration(0); now < s.E+time.Minute; now += simTick {
		s.now = now
		for p, until := range s.movingUntil {
			if now >= until {
				// At its new voters: the preferred node leads it.
				delete(s.movingUntil, p)
				s.leader[p], s.gained[p] = s.prefer[p], now
			}
		}
		if now == s.E-time.Second {
			s.loadsBeforeE = s.shares()
		}
		for i, nd := range s.nodes {
			if now >= simWindow && (now-nd.phaseW)%simWindow == 0 {
				// Writes counted since the leadership began; only a
				// partition led through the whole window has a rate
				// (splitDriver).
				nd.rates = map[uint64]float64{}
				led := map[int]bool{}
				for p, at := range s.leader {
					if at != i {
						continue
					}
					led[p] = true
					if nd.ledBefore[p] || !s.fullWindows {
						nd.rates[uint64(p)] = s.measured(p, max(now-simWindow, s.gained[p]), now) * float64(now-max(now-simWindow, s.gained[p])) / float64(simWindow)
					}
				}
				nd.ledBefore = led
				nd.windows++
				nd.ll.remember(nd.rates, simWindow)
				s.splitOnce(i, now)
			}
			if l, leads := s.own(i), s.leads(i); len(nd.pub) == 0 || nd.pub[len(nd.pub)-1].l != l || !slices.Equal(nd.pub[len(nd.pub)-1].leads, leads) {
				nd.pub = append(nd.pub, simPub{now, l, leads})
			}
		}
		for i, nd := range s.nodes {
			if (now-nd.phaseR)%simRound == 0 {
				s.round(i, now)
			}
		}
	}
}

// TestLoadMovesFollowSteadyLoad: under an even load (every node leads as
// many partitions, each as busy), no round moves a leadership, however
// the nodes' windows and rounds fall against the load's start and end.
// When a window of rounds choosing a move was enough, the ramps made load
// moves: nodes compared a window measured under the load with one begun
// before it (4 in 200 runs of 3 nodes, 1 in 200 of 6, in the simulation;
// 1-3 in 8 measurements of the scaling benchmark). An uneven load (one
// partition four times as busy as the others) still moves a leadership
// while it lasts, and none once it stopped: a marginal imbalance, chosen
// on and off with the rates' noise, was confirmed as the load went away
// (7 of 100 runs of 3 nodes) until a choice started over when the node's
// own load fell by more than a quarter (loadFallRestarts).
func TestLoadMovesFollowSteadyLoad(t *testing.T) {
	for _, n := range []int{3, 6} {
		var moves int
		for seed := range uint64(300) {
			s := newBalanceSim(seed, n, 1, 15*time.Second)
			s.run()
			if s.loadMoves+s.preferredMoves+len(s.splits) > 0 {
				t.Errorf("%d nodes, seed %d, even load %v-%v: %d load moves, %d preferred moves, splits %v", n, seed, s.L, s.E, s.loadMoves, s.preferredMoves, s.splits)
			}
			moves += s.loadMoves
		}
		t.Logf("%d nodes, even load: %d load moves in 300 runs", n, moves)
	}
	for _, n := range []int{3, 6} {
		var moves, late, settledLate int
		for seed := range uint64(100) {
			s := newBalanceSim(seed, n, 4, time.Minute)
			s.run()
			if s.loadMoves == 0 {
				t.Errorf("%d nodes, seed %d, a hot partition %v-%v: no load move", n, seed, s.L, s.E)
			}
			for _, l := range s.late {
				t.Errorf("%d nodes, seed %d, a hot partition %v-%v: a load move after the load stopped: %s", n, seed, s.L, s.E, l)
			}
			for _, l := range s.undone {
				t.Errorf("%d nodes, seed %d, a hot partition %v-%v: a load move undone after the load stopped: %s", n, seed, s.L, s.E, l)
			}
			settledLate += s.settledLate
			for _, b := range s.bounced {
				t.Errorf("%d nodes, seed %d, a hot partition %v-%v: %s", n, seed, s.L, s.E, b)
			}
			if s.lateSplits > 0 {
				t.Errorf("%d nodes, seed %d, a hot partition %v-%v: splits for balance after the load stopped: %v", n, seed, s.L, s.E, s.splits)
			}
			moves += s.loadMoves
			late += len(s.late)
		}
		t.Logf("%d nodes, a hot partition: %d load moves in 100 runs, %d of them a window or more after the load stopped; %d preferred moves then of partitions no load move placed", n, moves, late, settledLate)
	}
}

// TestSplitsForBalanceEvenOutLoads: 13 equally busy partitions over 6
// nodes (two copysets of 3; the scaling benchmark's one-prefix load ended
// so) leave one node leading 3 against 2 everywhere else, 1.38 times the
// mean, and no load move can change that. A split for balance lets one
// move: within a few windows the busiest node takes at most 1.2 times the
// mean, with few splits, none once the load stopped. The same partitions
// over 3 nodes (5, 4, 4) and 12 over 6 (even) split nothing they need not.
func TestSplitsForBalanceEvenOutLoads(t *testing.T) {
	for _, c := range []struct {
		n, parts  int
		maxSplits int
		maxRatio  float64
	}{{6, 13, 3, 1.2}, {3, 13, 3, 1.2}, {6, 12, 0, 1.1}, {6, 18, 0, 1.1}} {
		var splits int
		worst := 0.0
		for seed := range uint64(100) {
			s := newBalanceSimParts(seed, c.n, c.parts, 1, 3*time.Minute)
			s.run()
			var sum, most float64
			for _, l := range s.loadsBeforeE {
				sum += l
				most = max(most, l)
			}
			ratio := most / (sum / float64(c.n))
			worst = max(worst, ratio)
			if ratio > c.maxRatio {
				t.Errorf("%d nodes, %d partitions, seed %d: the busiest node takes %.2f times the mean before the load stops (shares %v; splits %v)", c.n, c.parts, seed, ratio, s.loadsBeforeE, s.splits)
			}
			if len(s.splits) > c.maxSplits || s.lateSplits > 0 {
				t.Errorf("%d nodes, %d partitions, seed %d: %d splits (%d after the load stopped), want at most %d: %v", c.n, c.parts, seed, len(s.splits), s.lateSplits, c.maxSplits, s.splits)
			}
			splits += len(s.splits)
		}
		t.Logf("%d nodes, %d partitions: %d splits in 100 runs; the busiest node took at most %.2f times the mean", c.n, c.parts, splits, worst)
	}
}

var simTrace *[]string

// copysetShares returns the load share of each copyset (of three nodes),
// in partitions.
func (s *balanceSim) copysetShares(nodeShares []float64) []float64 {
	out := make([]float64, s.n/3)
	for i, l := range nodeShares {
		out[i/3] += l
	}
	return out
}

// imbalance returns how many times the mean load the busier copyset and
// the busiest node took a second before the load stopped.
func (s *balanceSim) imbalance() (copyset, node float64) {
	mean := 0.0
	for _, l := range s.loadsBeforeE {
		mean += l / float64(s.n)
	}
	return slices.Max(s.copysetShares(s.loadsBeforeE)) / (3 * mean), slices.Max(s.loadsBeforeE) / mean
}

// TestSplitsAcrossPlacementsEvenOutCopysets: on 6 nodes in two copysets
// whose partitions take unequal loads, splits across placements even out
// the copysets' loads, which no leadership move or split within the
// voters changes (each seed runs without them too, the control):
//   - one copyset's partitions twice as busy as the other's (2/3 of the
//     load, 1.33 times the mean): the busier copyset ends within 1.25
//     times the mean, and over the seeds its excess over the mean falls
//     by half (0.150 against 0.333 when written);
//   - each partition at 0.5, 1 or 2 times the rate at random (as a hot
//     range's halvings leave them): the excess falls by 15% (0.104
//     against 0.131 when written: a half moves only where it leaves the
//     target less loaded than the sender by more than the slack, and
//     halves of a range's 2x partitions seldom fit).
//
// In every case never worse than without, with at most 8 splits, none
// after the load stops.
func TestSplitsAcrossPlacementsEvenOutCopysets(t *testing.T) {
	for _, c := range []struct {
		name      string
		weight    func(s *balanceSim, p int) float64
		maxRatio  float64 // per seed, with splits across
		maxExcess float64 // the mean excess with, against the mean without
	}{
		{"one copyset 2x", func(s *balanceSim, p int) float64 { return 1 + float64(1-s.base[p]/3) }, 1.25, 0.5},
		{"halvings", func(s *balanceSim, p int) float64 { return []float64{0.5, 1, 2}[s.r.IntN(3)] }, 0, 0.85},
	} {
		var splits, across int
		var with, without float64
		worst := 0.0
		for seed := range uint64(100) {
			var ratio [2]float64
			for i, on := range []bool{false, true} {
				s := newBalanceSimParts(seed, 6, 12, 1, 3*time.Minute)
				s.across = on
				for p := range s.weight {
					s.weight[p] = c.weight(s, p)
				}
				s.run()
				ratio[i], _ = s.imbalance()
				if !on {
					continue
				}
				if len(s.splits) > 8 || s.lateSplits > 0 {
					t.Errorf("%s, seed %d: %d splits (%d after the load stopped), want at most 8 and none after: %v", c.name, seed, len(s.splits), s.lateSplits, s.splits)
				}
				splits += len(s.splits)
				across += s.acrossSplits
			}
			if ratio[1] > ratio[0]+0.01 || (c.maxRatio > 0 && ratio[1] > c.maxRatio) {
				t.Errorf("%s, seed %d: the busier copyset takes %.2f times the mean with splits across placements, %.2f without", c.name, seed, ratio[1], ratio[0])
			}
			without += ratio[0] - 1
			with += ratio[1] - 1
			worst = max(worst, ratio[1])
		}
		if with > c.maxExcess*without {
			t.Errorf("%s: the busier copyset's mean excess over the mean is %.3f with splits across placements, %.3f without", c.name, with/100, without/100)
		}
		t.Logf("%s: %d splits (%d across) in 100 runs; the busier copyset's mean excess over the mean %.3f (%.3f without), at most %.2f times the mean", c.name, splits, across, with/100, without/100, worst)
	}
}

// TestNoisyLoadSettles: under a steady load whose rates the windows
// measure with large noise (each partition's rate anywhere within 50% of
// its true one in every window, as a starved node's few-second windows
// measure them), partitions of a hot range's uneven rates (0.5, 1 or 2
// times the mean) over 6 nodes and 3 are never handed to their
// preferred nodes while the load lasts: only load moves place them (a
// few may go to their preferred nodes once the load stopped). When the
// preferred-node rule applied to partitions taking writes under load
// too, it and the load rule took turns with the same partitions, as the
// noise moved the loads across the slack between the two rules'
// conditions: 146 preferred moves under load in 100 runs of 3 nodes and
// 169 of 6, and the scaling benchmark's 6-node clusters handed a
// partition back to its preferred node 5-8 s after a load move.
func TestNoisyLoadSettles(t *testing.T) {
	for _, n := range []int{3, 6} {
		var preferred, loadMoves int
		for seed := range uint64(100) {
			s := newBalanceSimParts(seed, n, 18, 1, 5*time.Minute)
			s.noise = 0.5
			for p := range s.weight {
				s.weight[p] = []float64{0.5, 1, 2}[s.r.IntN(3)]
			}
			s.run()
			preferred += s.preferredUnderLoad
			loadMoves += s.loadMoves
			if s.preferredUnderLoad > 0 {
				t.Errorf("%d nodes, seed %d: %d preferred moves under load (bounced back: %v)", n, seed, s.preferredUnderLoad, s.bounced)
			}
		}
		t.Logf("%d nodes, 100 runs: %d load moves, %d preferred moves under load", n, loadMoves, preferred)
	}
}

// TestBalancerSeesLeadershipsBeforeLoads: no node makes a load move or a
// split for balance toward a node whose load it sees from before a
// leadership its own replicas already show (markStale). Gossip carries a
// node's load a second or so after a leadership moves to it, and a
// replica of the partition knows at once; two nodes that each saw the
// same idle voter sent it load in the same second, a leadership and a
// half of a split (TestSplitAcrossPlacements failed so in CI). The
// control runs the same seeds with nodes that see leaderships by gossip
// only, and must make such sends, or the scenarios do not reach the race.
func TestBalancerSeesLeadershipsBeforeLoads(t *testing.T) {
	// twoOneNone makes copyset 0's nodes lead 0, 2 and 1 partitions
	// that take writes (as in the CI failure), and copyset 1's even.
	twoOneNone := func(s *balanceSim) {
		s.leader = append(s.leader, 1)
		s.gained = append(s.gained, 0)
		s.weight = append(s.weight, 1)
		s.base = append(s.base, 0)
		s.prefer[len(s.leader)-1] = 1
		s.weight[0] = 0
	}
	for _, c := range []struct {
		name   string
		n      int
		parts  int
		hot    float64
		across bool
		shape  func(*balanceSim)
	}{
		{"6 nodes, one copyset's nodes lead 0, 2 and 1", 6, 6, 1, false, twoOneNone},
		{"6 nodes, one copyset's nodes lead 0, 2 and 1, splits across", 6, 6, 1, true, twoOneNone},
	} {
		var blind, seeing int
		var worst [2]float64 // blind, seeing
		var splits [2]int
		for seed := range uint64(100) {
			for k, b := range []bool{true, false} {
				s := newBalanceSimParts(seed, c.n, c.parts, c.hot, 3*time.Minute)
				s.across, s.blindToReplicas = c.across, b
				if c.shape != nil {
					c.shape(s)
				}
				s.run()
				_, node := s.imbalance()
				worst[k] = max(worst[k], node)
				splits[k] += len(s.splits)
				if b {
					blind += len(s.stale)
					continue
				}
				seeing += len(s.stale)
				for _, l := range s.stale {
					t.Errorf("%s, seed %d: %s", c.name, seed, l)
				}
			}
		}
		t.Logf("%s: %d sends toward a stale load in 100 runs, %d splits, the busiest node at most %.2f times the mean (seeing leaderships by gossip only: %d, %d, %.2f)",
			c.name, seeing, splits[1], worst[1], blind, splits[0], worst[0])
		if blind == 0 {
			t.Errorf("%s: the control made no send toward a stale load in 100 runs: the scenario does not reach the race", c.name)
		}
	}
}
