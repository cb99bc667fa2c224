package raftgroup

import (
	"context"
	"errors"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

// fate is what a ProposeAsyncFate proposer learned.
type fate struct {
	res any
	err error
}

func proposeFate(g *Group) <-chan fate {
	ch := make(chan fate, 1)
	g.ProposeAsyncFate(cmd(1), func(res any, err error) { ch <- fate{res, err} })
	return ch
}

func awaitFate(t *testing.T, ch <-chan fate) fate {
	t.Helper()
	select {
	case f := <-ch:
		return f
	case <-time.After(15 * time.Second):
		t.Fatal("the proposer never learned its command's fate")
		return fate{}
	}
}

func notYet(t *testing.T, ch <-chan fate, when string) {
	t.Helper()
	select {
	case f := <-ch:
		t.Fatalf("the proposer was answered %s (%v, %v)", when, f.res, f.err)
	case <-time.After(50 * time.Millisecond):
	}
}

// others returns the groups of the nodes other than id.
func others(nodes []*testNode, id uint64) []*Group {
	var gs []*Group
	for _, n := range nodes {
		if n.id != id {
			gs = append(gs, n.host.Group(testGroup))
		}
	}
	return gs
}

// deposition is a trio whose first leader (old, on node oldID) applied 5
// commands, was cut off, proposed one more with ProposeAsyncFate (its fate
// arrives on ch) and was replaced by next.
type deposition struct {
	tr        *MemTransport
	nodes     []*testNode
	old, next *Group
	oldID     uint64
	ch        <-chan fate
}

// depose builds a deposition: keep(oldID, from, to) says which messages
// still pass once the leader is cut off; also, if set, runs right after the
// leader proposed.
func depose(t *testing.T, grace time.Duration, keep func(old, from, to uint64) bool, also func(leader *Group)) *deposition {
	t.Helper()
	d := &deposition{tr: NewMemTransport()}
	d.nodes, d.old, _ = startLedTrio(t, d.tr, func(c *Config) { c.FateGrace = grace })
	propose(t, d.old, 5)
	d.oldID = d.old.host.cfg.NodeID
	d.tr.SetFilter(func(from, to uint64, _ GroupMessage) bool { return keep(d.oldID, from, to) })
	d.ch = proposeFate(d.old)
	if also != nil {
		also(d.old)
	}
	d.next = waitLeader(t, others(d.nodes, d.oldID)...)
	return d
}

func deposed(g *Group, fate string) float64 {
	return promtest.ToFloat64(g.host.metrics.deposedProposals.WithLabelValues(fate))
}

// TestDeposedLeaderLearnsItsCommandApplied: a leader whose followers get
// its command but whose answers never reach it steps down (CheckQuorum);
// the next leader commits the command. The deposed leader's ProposeAsyncFate
// proposer must get the command's result once it applies there, not "leader
// changed", while a plain Propose still gets ErrLeaderChanged at the
// step-down.
func TestDeposedLeaderLearnsItsCommandApplied(t *testing.T) {
	plain := make(chan error, 1)
	d := depose(t, time.Minute, func(old, _, to uint64) bool { return to != old }, func(leader *Group) {
		go func() {
			_, err := leader.Propose(context.Background(), cmd(1))
			plain <- err
		}()
	})
	for _, n := range d.nodes {
		if n.id != d.oldID {
			waitCount(t, n, 7)
		}
	}
	select {
	case err := <-plain:
		if !errors.Is(err, ErrLeaderChanged) {
			t.Fatalf("plain Propose on the deposed leader: %v, want ErrLeaderChanged", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("plain Propose on the deposed leader never returned")
	}
	notYet(t, d.ch, "before the deposed leader could know the fate")
	d.tr.SetFilter(nil)
	f := awaitFate(t, d.ch)
	if f.err != nil {
		t.Fatalf("the command was committed by the next leader, but its proposer got %v", f.err)
	}
	if n, ok := f.res.(uint64); !ok || n < 6 || n > 7 {
		t.Fatalf("result %v, want the counter after the command (6 or 7)", f.res)
	}
	for _, n := range d.nodes {
		waitCount(t, n, 7)
	}
	if got := deposed(d.old, "applied"); got != 1 {
		t.Fatalf("deposed proposals applied = %v, want 1", got)
	}
	if lost, gained := counterValue(d.old.host.metrics.leadership[false]), counterValue(d.next.host.metrics.leadership[true]); lost != 1 || gained != 1 {
		t.Fatalf("leaderships lost by the deposed leader %v, gained by the next %v; want 1 and 1", lost, gained)
	}
}

// TestDeposedLeaderLearnsItsCommandDropped: a leader cut off from sending
// proposes a command nobody receives; the others elect a leader and commit
// entries of its term at that index. Once the deposed leader hears from
// them it applies those entries: its proposer must get ErrNotLeader (the
// command never applies, so it may be retried), and no replica applies it.
func TestDeposedLeaderLearnsItsCommandDropped(t *testing.T) {
	d := depose(t, time.Minute, func(old, from, _ uint64) bool { return from != old }, nil)
	propose(t, d.next, 3)
	notYet(t, d.ch, "before the deposed leader could know the fate")
	d.tr.SetFilter(nil)
	f := awaitFate(t, d.ch)
	if !errors.Is(f.err, ErrNotLeader) {
		t.Fatalf("the command was overwritten, but its proposer got (%v, %v), want ErrNotLeader", f.res, f.err)
	}
	propose(t, d.next, 1)
	for _, n := range d.nodes {
		waitCount(t, n, 9)
		if got, sum := readCounter(t, n.db, testGroup); got != 9 || sum != 9 {
			t.Fatalf("node %d applied %d commands (sum %d), want 9: the dropped command applied", n.id, got, sum)
		}
	}
	if got := deposed(d.old, "dropped"); got != 1 {
		t.Fatalf("deposed proposals dropped = %v, want 1", got)
	}
}

// TestDeposedLeaderSnapshotHidesFate: the next leader commits the deposed
// leader's command and truncates its log past it, so the deposed leader
// catches up by snapshot. The snapshot holds the command's effect but not
// which command it was: the proposer must get ErrLeaderChanged (it may have
// applied), not ErrNotLeader from the later-term entries after the
// snapshot.
func TestDeposedLeaderSnapshotHidesFate(t *testing.T) {
	d := depose(t, time.Minute, func(old, _, to uint64) bool { return to != old }, nil)
	propose(t, d.next, 300)
	if first := d.next.firstIndexForTest(); first < 100 {
		t.Fatalf("the new leader did not truncate its log (first index %d)", first)
	}
	notYet(t, d.ch, "before the deposed leader could know the fate")
	d.tr.SetFilter(nil)
	for _, n := range d.nodes {
		waitCount(t, n, 306)
	}
	propose(t, d.next, 2) // entries of the new term after the snapshot
	f := awaitFate(t, d.ch)
	if !errors.Is(f.err, ErrLeaderChanged) {
		t.Fatalf("a snapshot hid the command's fate, but its proposer got (%v, %v), want ErrLeaderChanged", f.res, f.err)
	}
	for _, n := range d.nodes {
		waitCount(t, n, 308)
	}
	if got := counterValue(d.next.host.metrics.snapshotsSent); got < 1 {
		t.Fatalf("no snapshot was sent (%v)", got)
	}
}

// TestDeposedLeaderCutOffGivesUp: a leader cut off for good cannot learn
// its command's fate; after FateGrace its proposer gets ErrLeaderChanged
// instead of waiting forever.
func TestDeposedLeaderCutOffGivesUp(t *testing.T) {
	d := depose(t, 300*time.Millisecond, func(old, from, to uint64) bool { return from != old && to != old }, nil)
	f := awaitFate(t, d.ch)
	if !errors.Is(f.err, ErrLeaderChanged) {
		t.Fatalf("cut-off leader's proposer got (%v, %v), want ErrLeaderChanged", f.res, f.err)
	}
	if got := deposed(d.old, "unknown"); got != 1 {
		t.Fatalf("deposed proposals unknown = %v, want 1", got)
	}
}

// TestOrphanBookkeeping drives a group's waiter bookkeeping by hand
// through the orders a round can produce, including a leader deposed by a
// snapshot in the same round as it applied (steppedDown runs after the
// round's snapshot and entries).
func TestOrphanBookkeeping(t *testing.T) {
	newGroup := func() *Group {
		g := &Group{host: &Host{metrics: newMetrics(nil)}}
		g.waiters.m = make(map[uint64]*waiter)
		return g
	}
	add := func(g *Group, id, term uint64, keep bool) *fate {
		got := &fate{err: errors.New("no answer")}
		g.waiters.m[id] = &waiter{fate: keep, term: term, cb: func(res any, err error) { got.res, got.err = res, err }}
		return got
	}
	finish := func(ds []delivery) {
		for _, d := range ds {
			d.w.finish(d.result, d.err)
		}
	}

	// Deposed at term 3: the plain waiter fails at once, the fate waiter
	// of a command raft accepted waits, the one raft has not seen is left
	// to be dropped when proposed.
	g := newGroup()
	g.appliedTerm = 3
	plain, kept, keptToo, unseen := add(g, 1, 3, false), add(g, 2, 3, true), add(g, 3, 3, true), add(g, 4, 0, true)
	g.steppedDown(time.Minute)
	if !errors.Is(plain.err, ErrLeaderChanged) {
		t.Fatalf("plain waiter: %v, want ErrLeaderChanged", plain.err)
	}
	if g.waiters.orphans != 2 || g.waiters.orphanTerm != 3 || len(g.waiters.m) != 3 {
		t.Fatalf("orphans %d (term %d), waiters %d; want 2 (3), 3", g.waiters.orphans, g.waiters.orphanTerm, len(g.waiters.m))
	}
	// A term-3 entry applies (committed by the next leader): its proposer
	// gets the result; a term-4 entry then proves the other dead.
	w, dead := g.takeApplied(2, 3)
	finish(taken(nil, w, "r", dead))
	if kept.err != nil || kept.res != "r" || len(dead) != 0 {
		t.Fatalf("applied orphan: (%v, %v), %d dead; want (r, nil), 0", kept.res, kept.err, len(dead))
	}
	w, dead = g.takeApplied(0, 4)
	finish(taken(nil, w, nil, dead))
	if !errors.Is(keptToo.err, ErrNotLeader) || g.waiters.orphans != 0 {
		t.Fatalf("orphan behind a later term's entry: %v (orphans left %d), want ErrNotLeader (0)", keptToo.err, g.waiters.orphans)
	}
	if unseen.err == nil || errors.Is(unseen.err, ErrNotLeader) || len(g.waiters.m) != 1 {
		t.Fatalf("the waiter raft never saw was answered (%v)", unseen.err)
	}

	// Deposed in a round that also applied the next leader's entries.
	g = newGroup()
	orphan := add(g, 1, 5, true)
	g.appliedTerm = 6
	g.steppedDown(time.Minute)
	if !errors.Is(orphan.err, ErrNotLeader) {
		t.Fatalf("deposed after a later term's entry applied: %v, want ErrNotLeader", orphan.err)
	}

	// Deposed by a snapshot in the same round: the snapshot hides the
	// fate, so the later term it carries must not pass for proof.
	g = newGroup()
	orphan = add(g, 1, 5, true)
	g.snapshotInstalled()
	g.appliedTerm = 6
	g.steppedDown(time.Minute)
	if !errors.Is(orphan.err, ErrLeaderChanged) {
		t.Fatalf("deposed by a snapshot: %v, want ErrLeaderChanged", orphan.err)
	}

	// Nothing heard before the deadline.
	g = newGroup()
	orphan = add(g, 1, 5, true)
	g.appliedTerm = 5
	g.steppedDown(time.Millisecond)
	g.expireOrphans() // not yet, probably; then surely after the deadline
	time.Sleep(5 * time.Millisecond)
	g.expireOrphans()
	if !errors.Is(orphan.err, ErrLeaderChanged) {
		t.Fatalf("expired orphan: %v, want ErrLeaderChanged", orphan.err)
	}
	for outcome, want := range map[string]float64{"applied": 0, "dropped": 0, "unknown": 1} {
		if got := deposed(g, outcome); got != want {
			t.Fatalf("%s = %v, want %v", outcome, got, want)
		}
	}
}
