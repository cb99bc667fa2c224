package raftgroup

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// busyGroup is a second group of the hold tests, led by node 1 and kept
// busy so that node 1's raft messages reach the others all the time.
const busyGroup = 8

// startHoldTrio starts nodes 1-3 with replicas of testGroup and busyGroup,
// node 1 leading both; change adjusts node id's configuration. The hosts
// stop when the test ends.
func startHoldTrio(t *testing.T, tr *MemTransport, change func(id uint64, c *Config)) []*testNode {
	t.Helper()
	var nodes []*testNode
	for id := uint64(1); id <= 3; id++ {
		n := startNodeWith(t, tr, id, vfs.NewMem(), []uint64{1, 2, 3}, func(c *Config) { change(id, c) })
		if _, err := n.host.CreateGroup(busyGroup, []uint64{1, 2, 3}, &snapCounter{counterSM: newCounterSM(t, n.db, busyGroup), db: n.db}); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.host.Stop()
		}
	})
	for _, id := range []uint64{testGroup, busyGroup} {
		nodes[0].host.Group(id).Campaign()
		var gs []*Group
		for _, n := range nodes {
			gs = append(gs, n.host.Group(id))
		}
		if waitLeader(t, gs...) != nodes[0].host.Group(id) {
			t.Fatalf("node 1 campaigned for group %d but another leads", id)
		}
	}
	return nodes
}

// keepBusy proposes to node 1's busyGroup until the test ends.
func keepBusy(t *testing.T, n *testNode) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		g := n.host.Group(busyGroup)
		for ctx.Err() == nil {
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			_, _ = g.Propose(pctx, cmd(1))
			pcancel()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// TestLiveLeaderNodeHoldsElections: node 1 leads an idle group, but its
// ticks come at a sixth of its followers' pace (a node starved of CPU,
// whose ticker runs late), so its quiet heartbeats reach them further
// apart than their election timeout. Without holding (ElectionHold < 0)
// they elect another leader; holding, while node 1's messages for a busy
// group keep arriving, they do not.
func TestLiveLeaderNodeHoldsElections(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(map[bool]string{false: "without", true: "holding"}[hold], func(t *testing.T) {
			nodes := startHoldTrio(t, NewMemTransport(), func(id uint64, c *Config) {
				if id == 1 {
					c.TickInterval = 60 * time.Millisecond // quiet heartbeats 180 ms apart
				}
				if !hold {
					c.ElectionHold = -1
				}
			})
			keepBusy(t, nodes[0])
			g := nodes[0].host.Group(testGroup)
			term := g.Status().Term
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				if st := g.Status(); st.Term != term || !st.IsLeader {
					if hold {
						t.Fatalf("node 1's leadership of the idle group ended though its node was heard from: term %d -> %+v", term, st)
					}
					return // without holding: the election the test provokes
				}
				time.Sleep(10 * time.Millisecond)
			}
			if !hold {
				t.Fatal("no election in 3 s: the test does not provoke what holding prevents")
			}
			var held float64
			for _, n := range nodes[1:] {
				held += counterValue(n.host.metrics.ticksHeld)
			}
			if held == 0 {
				t.Fatal("the followers held no tick")
			}
		})
	}
}

// TestHeldElectionEnds: node 1 stays heard from (its busy group), but
// none of its messages for the idle group arrive any more (a leader whose
// node lives on without leading the group). The followers hold for
// ElectionHold after its last message, then elect one of them.
func TestHeldElectionEnds(t *testing.T) {
	const hold = 500 * time.Millisecond
	tr := NewMemTransport()
	nodes := startHoldTrio(t, tr, func(_ uint64, c *Config) { c.ElectionHold = hold })
	keepBusy(t, nodes[0])
	cut := time.Now()
	tr.SetFilter(func(from, _ uint64, m GroupMessage) bool { return from != 1 || m.Group != testGroup })
	g2, g3 := nodes[1].host.Group(testGroup), nodes[2].host.Group(testGroup)
	waitLeader(t, g2, g3)
	// The followers' last message from node 1 came at most a quiet
	// heartbeat interval (30 ms here) before the cut.
	if took := time.Since(cut); took < hold-50*time.Millisecond {
		t.Fatalf("a follower was elected %v after the leader's messages stopped, within the hold (%v)", took, hold)
	}
}

// TestSilentLeaderNodeHoldsNothing: with a hold far longer than the test,
// the followers still elect a leader once node 1 falls silent altogether
// (stopped, paused or cut off): no message of any group arrives from it.
func TestSilentLeaderNodeHoldsNothing(t *testing.T) {
	tr := NewMemTransport()
	nodes := startHoldTrio(t, tr, func(_ uint64, c *Config) { c.ElectionHold = time.Hour })
	tr.SetFilter(func(from, _ uint64, _ GroupMessage) bool { return from != 1 })
	waitLeader(t, nodes[1].host.Group(testGroup), nodes[2].host.Group(testGroup))
	waitLeader(t, nodes[1].host.Group(busyGroup), nodes[2].host.Group(busyGroup))
}
