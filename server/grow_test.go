package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
)

// TestSingleNodeGrowsIntoCluster follows the path of a user who started one
// node and later wants three: a node started without --allow-join refuses
// member add with a message that says how to grow it, and the refused join
// leaves neither a member nor a data directory behind; restarted with
// --allow-join, the same store takes two --join nodes, keeps its data, and
// every group (TSO, meta, partitions) grows to three voters.
func TestSingleNodeGrowsIntoCluster(t *testing.T) {
	c := testutil.StartCluster(t, 1, server.Config{InitialSplitPoints: memberSplits, ReplicaCheckInterval: 200 * time.Millisecond, RebalanceInterval: 500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := testutil.Client(t, c.Endpoint(0))
	for _, k := range memberKeys {
		if _, err := cl.Put(ctx, k, "before"); err != nil {
			t.Fatal(err)
		}
	}

	// etcdctl member add, and a --join, against a single node.
	_, err := cl.MemberAdd(ctx, []string{"http://127.0.0.1:1"})
	if err == nil || !strings.Contains(err.Error(), "--allow-join") {
		t.Fatalf("member add on a single node: %v, want a refusal naming --allow-join", err)
	}
	joinDir := filepath.Join(t.TempDir(), "joiner")
	peer := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePortPair(t))
	jcfg := server.Config{
		Name: "joiner", DataDir: joinDir, ListenPeerURLs: []string{peer}, InitialAdvertisePeerURLs: []string{peer},
		ListenClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))},
		InitialCluster:   "joiner=" + peer, Join: "http://" + c.Endpoint(0), FastGossip: true, Logger: testutil.Quiet(),
	}
	if s, err := server.New(jcfg); err == nil {
		s.Stop()
		t.Fatal("a join against a single node started")
	} else if !strings.Contains(err.Error(), "--allow-join") {
		t.Fatalf("join against a single node: %v, want a refusal naming --allow-join", err)
	}
	if _, err := os.Stat(joinDir); !os.IsNotExist(err) {
		t.Fatalf("the refused join left its data directory: %v", err)
	}
	ml, err := cl.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ml.Members) != 1 {
		t.Fatalf("after refused adds the single node lists %d members, want 1: %v", len(ml.Members), ml.Members)
	}
	cl.Close()

	// Restarted with --allow-join, the store takes members.
	c.Stop(0)
	c.Configs[0].AllowJoin = true
	c.Start(0)
	cl = testutil.Client(t, c.Endpoint(0))
	waitServing(t, ctx, cl)
	// Later starts keep it without the flag.
	c.Stop(0)
	c.Configs[0].AllowJoin = false
	c.Start(0)
	cl = testutil.Client(t, c.Endpoint(0))
	waitServing(t, ctx, cl)
	c.Join(0, server.Config{})
	c.Join(0, server.Config{})

	eventually(t, time.Minute, "every group has 3 voters", func() (bool, string) {
		var state []string
		ok := true
		for _, g := range c.Nodes[0].GroupIDs() {
			leader := -1
			for i, n := range c.Nodes {
				if st, found := n.GroupStatus(g); found && st.IsLeader {
					leader = i
				}
			}
			if leader < 0 {
				ok = false
				state = append(state, fmt.Sprintf("group %d: no leader", g))
				continue
			}
			st, _ := c.Nodes[leader].GroupStatus(g)
			if len(st.Voters) != 3 {
				ok = false
			}
			state = append(state, fmt.Sprintf("group %d: voters %d learners %d", g, len(st.Voters), len(st.Learners)))
		}
		return ok, strings.Join(state, "; ")
	})

	// The data written on the single node is served by every node, and a
	// write through a joined node is read through the first.
	for i := range c.Nodes {
		ci := testutil.Client(t, c.Endpoint(i))
		for _, k := range memberKeys {
			r, err := ci.Get(ctx, k)
			if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "before" {
				t.Fatalf("node %d get %s: %v %v", i, k, r, err)
			}
		}
	}
	c3 := testutil.Client(t, c.Endpoint(2))
	if _, err := c3.Put(ctx, "after", "3"); err != nil {
		t.Fatal(err)
	}
	r, err := cl.Get(ctx, "after")
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("get after: %v %v", r, err)
	}
	ml, err = cl.MemberList(ctx)
	if err != nil || len(ml.Members) != 3 {
		t.Fatalf("member list: %v %v", ml, err)
	}
	// With three voters everywhere, losing the first node keeps the
	// cluster writable.
	c.Stop(0)
	eventually(t, 30*time.Second, "writes after the first node stopped", func() (bool, string) {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		defer pcancel()
		for _, k := range memberKeys {
			if _, err := c3.Put(pctx, k, "without n1"); err != nil {
				return false, err.Error()
			}
		}
		return true, ""
	})
}
