package server

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/brainkv/brain/kvapi"
)

func TestPickLeader(t *testing.T) {
	for _, c := range []struct {
		name  string
		pref  uint64
		rate  float64
		loads map[uint64]float64
		// remembered loads and rate (none: the current ones)
		recent     map[uint64]float64
		recentRate float64
		cands      []uint64
		unsettled  map[uint64]bool
		byLoad     bool
		to         uint64
		forLoad    bool
	}{
		{name: "idle: the preferred node", pref: 2, loads: map[uint64]float64{}, cands: []uint64{2, 3}, byLoad: true, to: 2},
		{name: "idle, preferred here: stay", pref: 1, loads: map[uint64]float64{}, cands: []uint64{2, 3}, byLoad: true},
		{name: "preferred node not a candidate: stay", pref: 4, loads: map[uint64]float64{}, cands: []uint64{2, 3}, byLoad: true},
		{name: "busy here, idle voter: move for load", pref: 1, rate: 400, loads: map[uint64]float64{1: 900, 2: 100, 3: 0}, cands: []uint64{2, 3}, byLoad: true, to: 3, forLoad: true},
		{name: "busy here but load moves paused", pref: 1, rate: 400, loads: map[uint64]float64{1: 900, 2: 100, 3: 0}, cands: []uint64{2, 3}},
		{name: "a move that would only swap the imbalance: stay", pref: 1, rate: 500, loads: map[uint64]float64{1: 500, 2: 100, 3: 400}, cands: []uint64{2, 3}, byLoad: true},
		{name: "preferred node busier: stay", pref: 2, rate: 300, loads: map[uint64]float64{1: 400, 2: 600, 3: 500}, cands: []uint64{2, 3}, byLoad: true},
		{name: "under load, a partition taking writes: not to the preferred node within the slack", pref: 2, rate: 10, loads: map[uint64]float64{1: 400, 2: 420, 3: 405}, cands: []uint64{2, 3}, byLoad: true},
		{name: "under load, a partition taking writes: not to a less loaded preferred node within the slack either", pref: 2, rate: 10, loads: map[uint64]float64{1: 400, 2: 380, 3: 405}, cands: []uint64{2, 3}, byLoad: true},
		{name: "under load, an idle partition: to the preferred node within the slack", pref: 2, loads: map[uint64]float64{1: 400, 2: 420, 3: 405}, cands: []uint64{2, 3}, byLoad: true, to: 2},
		{name: "under load, an idle partition: not to a preferred node busier by more than the slack", pref: 2, loads: map[uint64]float64{1: 400, 2: 500, 3: 405}, cands: []uint64{2, 3}, byLoad: true},
		{name: "equal loads: the preferred node first", pref: 3, rate: 100, loads: map[uint64]float64{1: 500, 2: 0, 3: 0}, cands: []uint64{2, 3}, byLoad: true, to: 3, forLoad: true},
		{name: "equal loads: then the lowest ID", pref: 1, rate: 100, loads: map[uint64]float64{1: 500, 2: 0, 3: 0}, cands: []uint64{3, 2}, byLoad: true, to: 2, forLoad: true},
		{name: "idle partition on a busy node: no load move", pref: 1, rate: 0, loads: map[uint64]float64{1: 900, 2: 0}, cands: []uint64{2}, byLoad: true},
		{name: "no candidates", pref: 2, rate: 100, loads: map[uint64]float64{1: 900}, byLoad: true},
		{name: "least loaded voter unsettled: the next one", pref: 1, rate: 400, loads: map[uint64]float64{1: 900, 2: 100, 3: 0}, unsettled: map[uint64]bool{3: true}, cands: []uint64{2, 3}, byLoad: true, to: 2, forLoad: true},
		{name: "every voter unsettled: no load move", pref: 1, rate: 400, loads: map[uint64]float64{1: 900, 2: 100, 3: 0}, unsettled: map[uint64]bool{2: true, 3: true}, cands: []uint64{2, 3}, byLoad: true},
		{name: "writes paused: the remembered loads keep a load move", pref: 2, recentRate: 300, loads: map[uint64]float64{}, recent: map[uint64]float64{1: 300, 2: 500}, cands: []uint64{2, 3}, byLoad: true},
		{name: "writes paused, the preferred node was idle: a partition that took writes stays", pref: 2, recentRate: 100, loads: map[uint64]float64{}, recent: map[uint64]float64{1: 300, 3: 500}, cands: []uint64{2, 3}, byLoad: true},
		{name: "writes paused: an idle partition goes to its preferred node", pref: 2, loads: map[uint64]float64{}, recent: map[uint64]float64{1: 300, 3: 500}, cands: []uint64{2, 3}, byLoad: true, to: 2},
		{name: "a node publishing no remembered load: its current one counts", pref: 2, rate: 100, loads: map[uint64]float64{1: 300, 2: 500}, recent: map[uint64]float64{1: 300}, cands: []uint64{2, 3}},
		{name: "unsettled preferred node: the rotation still applies", pref: 2, loads: map[uint64]float64{}, unsettled: map[uint64]bool{2: true}, cands: []uint64{2, 3}, byLoad: true, to: 2},
		{name: "unsettled preferred node under load: stay", pref: 2, rate: 10, loads: map[uint64]float64{1: 300, 2: 100, 3: 300}, unsettled: map[uint64]bool{2: true}, cands: []uint64{2, 3}, byLoad: true},
	} {
		recent := max(c.rate, c.recentRate)
		to, forLoad := pickLeader(1, c.pref, c.rate, recent, loadView{loads: c.loads, recent: c.recent, unsettled: c.unsettled}, c.cands, c.byLoad)
		if to != c.to || forLoad != c.forLoad {
			t.Errorf("%s: got (%d, %v), want (%d, %v)", c.name, to, forLoad, c.to, c.forLoad)
		}
	}
}

// TestPickLeaderDoesNotUndo checks on random loads that the node a
// leadership moves to never hands it straight back: neither rule undoes
// a move of the other (or of itself).
func TestPickLeaderDoesNotUndo(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	nodes := []uint64{1, 2, 3, 4}
	others := func(n uint64) []uint64 {
		var out []uint64
		for _, m := range nodes {
			if m != n {
				out = append(out, m)
			}
		}
		return out
	}
	moves := 0
	for i := 0; i < 100000; i++ {
		loads := map[uint64]float64{}
		for _, n := range nodes {
			if r.IntN(4) > 0 {
				loads[n] = float64(r.IntN(1000))
			}
		}
		// The partition is one of node 1's, so its rate is part of
		// node 1's load.
		rate := 0.0
		if loads[1] > 0 && r.IntN(4) > 0 {
			rate = float64(r.IntN(int(loads[1]) + 1))
		}
		// Remembered loads (at least the current ones) and the
		// partition's remembered rate, in half the cases.
		recent := map[uint64]float64{}
		recentRate := rate
		if r.IntN(2) == 0 {
			for _, n := range nodes {
				recent[n] = loads[n] + float64(r.IntN(1000))
			}
			recentRate = rate + float64(r.IntN(int(recent[1]-loads[1])+1))
		}
		pref := nodes[r.IntN(len(nodes))]
		to, _ := pickLeader(1, pref, rate, recentRate, loadView{loads: loads, recent: recent}, others(1), r.IntN(2) == 0)
		if to == 0 {
			continue
		}
		moves++
		after := map[uint64]float64{}
		recentAfter := map[uint64]float64{}
		for _, n := range nodes {
			after[n] = loads[n]
			recentAfter[n] = max(recent[n], loads[n])
		}
		after[1] -= rate
		after[to] += rate
		recentAfter[1] -= recentRate
		recentAfter[to] += recentRate
		// The receiver measured the partition, or not yet (its rate 0,
		// none remembered, its load without it).
		unmeasured, recentUnmeasured := map[uint64]float64{}, map[uint64]float64{}
		for _, n := range nodes {
			unmeasured[n], recentUnmeasured[n] = after[n], recentAfter[n]
		}
		unmeasured[to] -= rate
		recentUnmeasured[to] -= recentRate
		for _, byLoad := range []bool{true, false} {
			if back, _ := pickLeader(to, pref, rate, recentRate, loadView{loads: after, recent: recentAfter}, others(to), byLoad); back == 1 {
				t.Fatalf("loads %v (remembered %v), rate %v (%v), preferred %d: moved to %d, which moves it back (load moves %v)", loads, recent, rate, recentRate, pref, to, byLoad)
			}
			if back, _ := pickLeader(to, pref, 0, 0, loadView{loads: unmeasured, recent: recentUnmeasured, unsettled: map[uint64]bool{to: true}}, others(to), byLoad); back == 1 {
				t.Fatalf("loads %v (remembered %v), rate %v (%v), preferred %d: moved to %d, which moves it back before measuring it (load moves %v)", loads, recent, rate, recentRate, pref, to, byLoad)
			}
		}
	}
	if moves < 10000 {
		t.Fatalf("only %d of 100000 random cases moved: the test covers too little", moves)
	}
}

// TestLoadMoveNeedsConfirmation checks a load move is made only once
// consecutive rounds chose a load move for the group while this node and
// the target measured two new windows each: a round choosing none, or a
// round that skipped the group, starts over, and so does a target whose
// count went back (it restarted), and so does a load of this node's that
// fell by more than a quarter; a target first chosen later needs two
// windows of its own since.
func TestLoadMoveNeedsConfirmation(t *testing.T) {
	var l leaderLoad
	stepAt := func(id, to, own, target uint64, load float64) bool {
		l.nextRound()
		return l.confirmLoadMove(id, to, own, target, load)
	}
	step := func(id, to, own, target uint64) bool { return stepAt(id, to, own, target, 100) }
	for i, c := range []struct {
		to, own, target uint64
		want            bool
	}{
		{to: 2, own: 10, target: 20, want: false},
		{to: 2, own: 11, target: 21, want: false},
		{to: 2, own: 12, target: 21, want: false}, // the target's second window is still to come
		{to: 2, own: 12, target: 22, want: true},
		{to: 3, own: 13, target: 5, want: false}, // another target: two windows of its own
		{to: 3, own: 14, target: 6, want: false},
		{to: 2, own: 14, target: 22, want: true}, // back to the first: its windows still count
		{to: 3, own: 15, target: 7, want: true},
		{to: 3, own: 16, target: 1, want: false}, // the target restarted: starts over
		{to: 3, own: 17, target: 2, want: false},
		{to: 3, own: 18, target: 3, want: true},
	} {
		if got := step(7, c.to, c.own, c.target); got != c.want {
			t.Fatalf("step %d (to %d, windows %d and %d): confirmed %v, want %v", i, c.to, c.own, c.target, got, c.want)
		}
	}
	// A round that did not choose it (the group was skipped) in between.
	step(8, 2, 0, 0)
	l.nextRound()
	if step(8, 2, 2, 2) {
		t.Fatal("a move chosen again after a round that skipped it was confirmed at once")
	}
	if !step(8, 2, 4, 4) {
		t.Fatal("a move chosen through two windows of consecutive rounds was not confirmed")
	}
	// Forgotten (a round chose no load move): starts over.
	l.forgetLoadMove(8)
	if step(8, 2, 6, 6) {
		t.Fatal("a forgotten move was confirmed at once")
	}
	// This node's load: growing, or falling by less than a quarter, does
	// not matter; falling by more (the load is going away) starts over.
	l.forgetLoadMove(9)
	for i, c := range []struct {
		own, target uint64
		load        float64
		want        bool
	}{
		{own: 1, target: 1, load: 100, want: false},
		{own: 2, target: 2, load: 300, want: false},
		{own: 3, target: 3, load: 80, want: true},  // 80% of where the choice began
		{own: 4, target: 4, load: 74, want: false}, // below 75%: starts over at 74
		{own: 5, target: 5, load: 60, want: false},
		{own: 6, target: 6, load: 56, want: true},
	} {
		if got := stepAt(9, 2, c.own, c.target, c.load); got != c.want {
			t.Fatalf("load step %d (windows %d, load %v): confirmed %v, want %v", i, c.own, c.load, got, c.want)
		}
	}
}

// TestMovedUpdatesRememberedLoads: within one balancer round, a
// leadership that moved counts in its new node's current and remembered
// loads for the next decision, and no longer in the old one's. With the
// writes paused, a partition that took writes stays where it is (its
// remembered rate says there is load), so a pause hands the preferred
// nodes nothing.
func TestMovedUpdatesRememberedLoads(t *testing.T) {
	v := loadView{loads: map[uint64]float64{1: 200}, recent: map[uint64]float64{1: 300}, unsettled: map[uint64]bool{}}
	v.moved(1, 2, 50, 150)
	if v.loads[1] != 150 || v.loads[2] != 50 {
		t.Fatalf("loads after the move: %v, want 150 and 50", v.loads)
	}
	if v.recentOf(1) != 150 || v.recentOf(2) != 150 {
		t.Fatalf("remembered loads after the move: %v, want 150 each", v.recent)
	}
	paused := loadView{loads: map[uint64]float64{}, recent: map[uint64]float64{1: 300}, unsettled: map[uint64]bool{}}
	if to, _ := pickLeader(1, 2, 0, 150, paused, []uint64{2}, true); to != 0 {
		t.Fatalf("with the writes paused, a partition that took writes went to its preferred node %d", to)
	}
	if to, _ := pickLeader(1, 2, 0, 0, paused, []uint64{2}, true); to != 2 {
		t.Fatalf("with the writes paused, an idle partition went to %d, want its preferred node 2", to)
	}
}

func TestSplitForBalancePick(t *testing.T) {
	three := func(rates ...float64) []ledPartition {
		var led []ledPartition
		for i, r := range rates {
			led = append(led, ledPartition{id: uint64(10 + i), rate: r, candidates: []uint64{2, 3}})
		}
		return led
	}
	for _, c := range []struct {
		name      string
		led       []ledPartition
		loads     map[uint64]float64
		unsettled map[uint64]bool
		want, to  uint64
	}{
		// The scaling benchmark's case: 3 partitions here, 2 on each voter.
		{name: "three against two: split the busiest", led: three(90, 100, 95), loads: map[uint64]float64{1: 285, 2: 190, 3: 200}, want: 11, to: 2},
		{name: "a load move can even it out: none", led: three(90, 100, 95), loads: map[uint64]float64{1: 285, 2: 90, 3: 200}},
		{name: "a small partition's move evens it out: none", led: three(200, 100, 20), loads: map[uint64]float64{1: 320, 2: 280, 3: 280}},
		{name: "even: none", led: three(100, 100), loads: map[uint64]float64{1: 200, 2: 200, 3: 190}},
		{name: "a half would not even it out: none", led: three(100, 100, 100), loads: map[uint64]float64{1: 300, 2: 260, 3: 270}},
		{name: "a half within the slack: none (crumbs)", led: three(60, 60, 60, 60, 60), loads: map[uint64]float64{1: 300, 2: 220, 3: 230}},
		{name: "below the floor: none", led: three(30, 30, 30), loads: map[uint64]float64{1: 90, 2: 60, 3: 60}},
		{name: "equally busy: the first", led: three(100, 100, 90), loads: map[uint64]float64{1: 290, 2: 200, 3: 190}, want: 10, to: 3},
		{name: "every voter unsettled: none", led: three(90, 100, 95), loads: map[uint64]float64{1: 285, 2: 190, 3: 200}, unsettled: map[uint64]bool{2: true, 3: true}},
		{name: "the less loaded voter unsettled: by the other", led: three(90, 100, 95), loads: map[uint64]float64{1: 285, 2: 190, 3: 250}, unsettled: map[uint64]bool{2: true}},
		{name: "no candidates: none", led: []ledPartition{{id: 10, rate: 300}}, loads: map[uint64]float64{1: 300, 2: 0}},
	} {
		v := newLoadView()
		v.loads = c.loads
		if c.unsettled != nil {
			v.unsettled = c.unsettled
		}
		if got, to := splitForBalance(1, c.led, v, 50); got != c.want || to != c.to {
			t.Errorf("%s: split %d for a move to %d, want %d to %d", c.name, got, to, c.want, c.to)
		}
	}
}

// TestSplitAcrossPick: with its voters (2, 3) as busy as it, node 1
// splits a partition for a far node (4, 5, 6) only while the view is
// calm and it is the busiest node (the lowest ID within the slack).
func TestSplitAcrossPick(t *testing.T) {
	led := func(rates ...float64) []ledPartition {
		var out []ledPartition
		for i, r := range rates {
			out = append(out, ledPartition{id: uint64(10 + i), rate: r, candidates: []uint64{2, 3}, far: []uint64{4, 5, 6}})
		}
		return out
	}
	// The 6-node benchmark's loads: one copyset busier.
	busy := map[uint64]float64{1: 330, 2: 320, 3: 300, 4: 170, 5: 240, 6: 120}
	for _, c := range []struct {
		name      string
		led       []ledPartition
		loads     map[uint64]float64
		unsettled map[uint64]bool
		moving    map[uint64]bool
		want, to  uint64
	}{
		{name: "busy copyset: the busiest partition to the least loaded far node", led: led(130, 100, 50, 50), loads: busy, want: 10, to: 6},
		{name: "a node with a split's half not measured yet: none", led: led(130, 100, 50, 50), loads: busy, unsettled: map[uint64]bool{5: true}},
		{name: "a half still moving: none", led: led(130, 100, 50, 50), loads: busy, moving: map[uint64]bool{2: true}},
		{name: "the least loaded far node unsettled: the next", led: led(130, 100, 50, 50), loads: busy, unsettled: map[uint64]bool{6: true}},
		{name: "not the busiest: none", led: led(130, 100, 50, 50), loads: map[uint64]float64{1: 330, 2: 400, 3: 300, 4: 170, 5: 240, 6: 120}},
		{name: "within the slack of the busiest, the lowest ID: splits", led: led(130, 100, 50, 50), loads: map[uint64]float64{1: 330, 2: 340, 3: 300, 4: 170, 5: 240, 6: 120}, want: 10, to: 6},
		{name: "a half would leave the target as busy: a smaller one", led: led(300, 30), loads: map[uint64]float64{1: 330, 2: 320, 3: 300, 4: 200, 5: 240, 6: 190}},
		{name: "even copysets: none", led: led(130, 100, 50, 50), loads: map[uint64]float64{1: 330, 2: 320, 3: 300, 4: 310, 5: 320, 6: 300}},
		{name: "below the floor: none", led: led(40, 40, 40, 40, 40, 40, 40, 40), loads: busy},
		{name: "a split within the voters first", led: led(130, 100), loads: map[uint64]float64{1: 330, 2: 320, 3: 230, 4: 170, 5: 240, 6: 120}, want: 10, to: 3},
	} {
		v := newLoadView()
		v.loads = c.loads
		if c.unsettled != nil {
			v.unsettled = c.unsettled
		}
		if c.moving != nil {
			v.moving = c.moving
		}
		if got, to := splitForBalance(1, c.led, v, 50); got != c.want || to != c.to {
			t.Errorf("%s: split %d for a move to %d, want %d to %d", c.name, got, to, c.want, c.to)
		}
	}
}

// TestConfirmBalanceSplit: a split for balance is made once every window
// chose one while this node and the target measured two more windows
// each; a window that chose none starts over, as does a load that fell by
// more than a quarter.
func TestConfirmBalanceSplit(t *testing.T) {
	var l leaderLoad
	for i, c := range []struct {
		id, to, own, target uint64
		load                float64
		want                bool
	}{
		{id: 5, to: 2, own: 10, target: 20, load: 100},
		{id: 5, to: 2, own: 11, target: 21, load: 100},
		{id: 5, to: 2, own: 12, target: 21, load: 100}, // the target's second window is still to come
		{id: 5, to: 2, own: 12, target: 22, load: 100, want: true},
		{id: 5, to: 2, own: 13, target: 23, load: 100}, // made: starts over
		{id: 5, to: 2, own: 14, target: 24, load: 100},
		{id: 6, to: 2, own: 15, target: 25, load: 100, want: true}, // another partition: the choice goes on
		{id: 0, own: 16, load: 100},                                // none: over
		{id: 6, to: 2, own: 18, target: 28, load: 100},
		{id: 6, to: 2, own: 19, target: 29, load: 100},
		{id: 6, to: 3, own: 20, target: 5, load: 100}, // another target: two windows of its own
		{id: 6, to: 3, own: 21, target: 6, load: 100},
		{id: 6, to: 3, own: 22, target: 7, load: 100, want: true},
		{id: 7, to: 2, own: 30, target: 40, load: 100},
		{id: 7, to: 2, own: 31, target: 41, load: 70}, // the load fell by more than a quarter: over
		{id: 7, to: 2, own: 32, target: 42, load: 70},
		{id: 7, to: 2, own: 33, target: 43, load: 70, want: true},
	} {
		if got := l.confirmBalanceSplit(c.id, c.to, c.own, c.target, c.load); got != c.want {
			t.Fatalf("step %d (%+v): %v, want %v", i, c, got, c.want)
		}
	}
}

// TestMarkStale: a node that, by this node's replicas, leads a partition
// it did not list with its gossiped load is unsettled, until the
// disagreement has lasted staleFor (the replica, not gossip, is behind);
// a different leader for the partition starts the clock again. A node
// that omitted its leaderships is never stale.
func TestMarkStale(t *testing.T) {
	leaders := map[uint64]uint64{100: 2, 101: 3, 102: 4, 103: 1}
	listed := map[uint64][]uint64{2: {100}, 3: {7}, 4: nil}
	stale := staleLeaders(leaders, listed)
	if fmt.Sprint(stale) != "map[101:3 102:4]" {
		t.Fatalf("staleLeaders = %v, want partitions 101 (node 3) and 102 (node 4)", stale)
	}
	var l leaderLoad
	t0 := time.Unix(1000, 0)
	unsettled := func(stale map[uint64]uint64, at time.Time) string {
		v := newLoadView()
		l.markStale(v, stale, at)
		return fmt.Sprint(v.unsettled)
	}
	if got := unsettled(stale, t0); got != "map[3:true 4:true]" {
		t.Fatalf("at first: unsettled %s", got)
	}
	if got := unsettled(stale, t0.Add(staleFor-time.Second)); got != "map[3:true 4:true]" {
		t.Fatalf("within staleFor: unsettled %s", got)
	}
	// 102's leader changes to node 5: a new disagreement.
	stale = map[uint64]uint64{101: 3, 102: 5}
	if got := unsettled(stale, t0.Add(staleFor)); got != "map[5:true]" {
		t.Fatalf("after staleFor, with partition 102 led by node 5 since: unsettled %s", got)
	}
	// Gossip catches up with 101: a later disagreement starts afresh.
	if got := unsettled(map[uint64]uint64{102: 5}, t0.Add(staleFor+time.Second)); got != "map[5:true]" {
		t.Fatalf("unsettled %s", got)
	}
	if got := unsettled(map[uint64]uint64{101: 3, 102: 5}, t0.Add(staleFor+2*time.Second)); got != "map[3:true 5:true]" {
		t.Fatalf("after a new disagreement on 101: unsettled %s", got)
	}
}

// TestBusiestCanSplit: of the nodes within the slack of the busiest, the
// lowest ID splits across placements, passing over nodes that lead no
// partition a split could split (too few keys or writes), and measuring
// the slack from the busiest node that could split.
func TestBusiestCanSplit(t *testing.T) {
	for _, c := range []struct {
		name         string
		loads        map[uint64]float64
		unsplittable map[uint64]bool
		want         uint64 // the busiest node, 0 for none
	}{
		{"the lowest ID within the slack", map[uint64]float64{1: 24, 2: 24.5, 3: 24, 4: 0}, nil, 1},
		{"the lowest ID has nothing to split: the next", map[uint64]float64{1: 24, 2: 24.5, 3: 24, 4: 0}, map[uint64]bool{1: true}, 2},
		{"none has anything to split", map[uint64]float64{1: 24, 2: 24, 3: 24, 4: 0}, map[uint64]bool{1: true, 2: true, 3: true, 4: true}, 0},
		{"a busier node with nothing to split sets no floor", map[uint64]float64{1: 48, 2: 24, 3: 23, 4: 0}, map[uint64]bool{1: true}, 2},
		{"outside the slack of the busiest: not", map[uint64]float64{1: 20, 2: 24, 3: 24}, nil, 2},
	} {
		v := newLoadView()
		v.loads = c.loads
		if c.unsplittable != nil {
			v.unsplittable = c.unsplittable
		}
		var got []uint64
		for n := range uint64(5) {
			if _, ok := c.loads[n]; ok && v.busiest(n) {
				got = append(got, n)
			}
		}
		want := []uint64{c.want}
		if c.want == 0 {
			want = nil
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: busiest %v, want %v", c.name, got, want)
		}
	}
}

// TestOwnLoadCountsTSORequests: a node leading the TSO group counts
// tsoLoad writes per TSO request a second it answered in its leader load
// (current and remembered); one that does not lead it counts its
// partitions' rates only.
func TestOwnLoadCountsTSORequests(t *testing.T) {
	s := &Server{id: &identity{}}
	p := uint64(kvapi.FirstPartition)
	s.load.rates = map[uint64]float64{p: 100}
	s.load.recent = map[uint64]float64{p: 120}
	s.load.tsoRate = 200
	if l := s.ownLoad([]uint64{p}); l.Load != 100 || l.Recent != 120 {
		t.Errorf("without the TSO: load %v, recent %v; want 100 and 120", l.Load, l.Recent)
	}
	want := 100 + tsoLoad*200
	if l := s.ownLoad([]uint64{kvapi.TSOGroup, p}); l.Load != want || l.Recent != 120+tsoLoad*200 {
		t.Errorf("leading the TSO: load %v, recent %v; want %v and %v", l.Load, l.Recent, want, 120+tsoLoad*200)
	}
}
