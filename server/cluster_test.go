package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestClusterServesFromEveryNode writes through every node of a 3-node
// cluster and reads and watches through every node.
func TestClusterServesFromEveryNode(t *testing.T) {
	c := testutil.StartCluster(t, 3, server.Config{InitialSplitPoints: []string{"c", "m", "t"}})
	var clients []*clientv3.Client
	for i := range c.Nodes {
		clients = append(clients, testutil.Client(t, c.Endpoint(i)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Wait for the cluster to serve.
	for {
		if _, err := clients[0].Put(ctx, "warm", "up"); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	start, _ := clients[2].Get(ctx, "x")
	wch := clients[2].Watch(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(start.Header.Revision+1), clientv3.WithPrevKV())
	var last int64
	keys := []string{"a", "d", "n", "u"}
	for i := 0; i < 60; i++ {
		k := keys[i%len(keys)]
		p, err := clients[i%3].Put(ctx, k, fmt.Sprint(i))
		if err != nil {
			t.Fatalf("put %d via node %d: %v", i, i%3, err)
		}
		if p.Header.Revision <= last {
			t.Fatalf("revision %d after %d", p.Header.Revision, last)
		}
		last = p.Header.Revision
		// Every node reads its own and others' writes (linearizable reads).
		for j, cl := range clients {
			g, err := cl.Get(ctx, k)
			if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != fmt.Sprint(i) {
				t.Fatalf("read %s via node %d after write %d: %v %v", k, j, i, g, err)
			}
			if g.Header.Revision < last {
				t.Fatalf("node %d read header %d below acknowledged %d", j, g.Header.Revision, last)
			}
		}
	}
	seen := 0
	for seen < 60 {
		select {
		case wr := <-wch:
			seen += len(wr.Events)
		case <-ctx.Done():
			t.Fatalf("watch on node 3 saw %d of 60 events", seen)
		}
	}
	// Leaders end up spread: every node leads something.
	deadline := time.Now().Add(15 * time.Second)
	for {
		leads := map[string]int{}
		for i, s := range c.Nodes {
			leads[fmt.Sprint(i)] = len(s.Leading())
		}
		if leads["0"] > 0 && leads["1"] > 0 && leads["2"] > 0 {
			t.Logf("leaderships per node: %v", leads)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leaders not spread: %v", leads)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
