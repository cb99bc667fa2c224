package server_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/server"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLeadersMoveForLoad: two busy partitions whose preferred leader (the
// placement rotation's) is the same node get leaders on different nodes
// once they take writes, and keep them; the writes, and a watch of them,
// run through the moves, and the watch sees every acknowledged write
// once, in order, with its previous value.
func TestLeadersMoveForLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	// Partitions 100+i; the rotation gives 101 and 104 the same
	// preferred leader on 3 nodes. The writes' keys, /registry/pods/k000
	// to k999, fall in 101 (k0-k4: half of them), 102 (k5: a tenth) and
	// 104 (k6-k9: two fifths); 103 takes none.
	const busyA, busyB = kvapi.FirstPartition + 1, kvapi.FirstPartition + 4
	c := testutil.StartCluster(t, 3, server.Config{
		InitialSplitPoints: []string{"/registry/pods/", "/registry/pods/k5", "/registry/pods/k5a", "/registry/pods/k5b"},
		SplitWindow:        500 * time.Millisecond,
	})
	ctx := context.Background()
	leaderOf := func(id uint64) uint64 {
		for _, n := range c.Nodes {
			if st, ok := n.GroupStatus(id); ok && st.IsLeader && st.LeaderReady {
				return n.MemberID()
			}
		}
		return 0
	}
	// Idle, the rotation puts both on their preferred node (and keeps
	// them there: 2s is four balancer rounds).
	var together time.Time
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		a, b := leaderOf(busyA), leaderOf(busyB)
		if a == 0 || a != b {
			together = time.Time{}
		} else if together.IsZero() {
			together = time.Now()
		} else if time.Since(together) > 2*time.Second {
			t.Logf("idle: partitions %d and %d led by %x", busyA, busyB, a)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle, partitions %d and %d are led by %x and %x: want their common preferred node", busyA, busyB, a, b)
		}
	}

	clients := make([]*clientv3.Client, len(c.Nodes))
	for i := range c.Nodes {
		clients[i] = testutil.Client(t, c.Endpoint(i))
	}
	start, err := clients[0].Get(ctx, "/registry/pods/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	from := start.Header.Revision + 1
	load := &splitLoad{failed: map[string]bool{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go load.run(ctx, clients[w%len(clients)], w, stop, &wg)
	}
	stopWriters := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopWriters()

	// Under load, one of them moves, and then neither moves again.
	const steady = 3 * time.Second
	var apart time.Time
	var moves int
	lastA, lastB := leaderOf(busyA), leaderOf(busyB)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		a, b := leaderOf(busyA), leaderOf(busyB)
		if a == 0 || b == 0 {
			continue // an election or a transfer in progress
		}
		if a != lastA || b != lastB {
			moves++
			t.Logf("partitions %d and %d led by %x and %x", busyA, busyB, a, b)
			lastA, lastB = a, b
			apart = time.Time{}
		}
		if a != b && apart.IsZero() {
			apart = time.Now()
		}
		if !apart.IsZero() && time.Since(apart) > steady {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s of writes partitions %d and %d are led by %x and %x (%d leader changes): want two nodes, steady for %v", busyA, busyB, a, b, moves, steady)
		}
	}
	if moves > 3 {
		t.Errorf("%d leader changes of the two busy partitions: the balancer trades them back and forth", moves)
	}
	stopWriters()

	load.mu.Lock()
	defer load.mu.Unlock()
	for _, err := range load.errs {
		t.Errorf("write error: %v", err)
	}
	if len(load.acked) < 50 {
		t.Fatalf("only %d writes acknowledged", len(load.acked))
	}
	end, err := clients[1].Get(ctx, "/registry/pods/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	evs := watchAll(t, clients[2], from, end.Header.Revision)
	checkSplitHistory(t, "watch through load moves", evs, load, from, end.Header.Revision)
	t.Logf("%d writes acknowledged, %d of unknown outcome", len(load.acked), len(load.failed))
}
