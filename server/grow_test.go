package server_test

import (
	"context"
	"fmt"
	"io"
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

	waitVoters(t, c, 3)

	// The data written on the single node is served by every node, and a
	// write through a joined node is read through the first.
	everyNodeReads(t, ctx, c, "before")
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

// waitVoters waits until every group of c's first node has n voters.
func waitVoters(t *testing.T, c *testutil.Cluster, n int) {
	t.Helper()
	eventually(t, time.Minute, fmt.Sprintf("every group has %d voters", n), func() (bool, string) {
		var state []string
		ok := true
		for _, g := range c.Nodes[0].GroupIDs() {
			leader := -1
			for i, node := range c.Nodes {
				if node == nil {
					continue
				}
				if st, found := node.GroupStatus(g); found && st.IsLeader {
					leader = i
				}
			}
			if leader < 0 {
				ok = false
				state = append(state, fmt.Sprintf("group %d: no leader", g))
				continue
			}
			st, _ := c.Nodes[leader].GroupStatus(g)
			if len(st.Voters) != n {
				ok = false
			}
			state = append(state, fmt.Sprintf("group %d: voters %d learners %d", g, len(st.Voters), len(st.Learners)))
		}
		return ok, strings.Join(state, "; ")
	})
}

// TestRestoredStoreGrowsIntoCluster: a store restored from a backup (or
// migrated from etcd, which restores) is a single node that, started with
// --allow-join, grows into a replicated cluster like any other: every group
// reaches three voters and the backup's data is on every node.
func TestRestoredStoreGrowsIntoCluster(t *testing.T) {
	c := testutil.StartCluster(t, 1, server.Config{InitialSplitPoints: memberSplits, ReplicaCheckInterval: 200 * time.Millisecond, RebalanceInterval: 500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := testutil.Client(t, c.Endpoint(0))
	for _, k := range memberKeys {
		if _, err := cl.Put(ctx, k, "backed up"); err != nil {
			t.Fatal(err)
		}
	}
	rc, err := cl.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(backup)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	f.Close()
	cl.Close()
	c.Stop(0)
	if err := os.RemoveAll(c.Configs[0].DataDir); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Restore(server.RestoreConfig{SnapshotPath: backup, DataDir: c.Configs[0].DataDir, Name: c.Configs[0].Name,
		InitialAdvertisePeerURLs: c.Configs[0].InitialAdvertisePeerURLs}); err != nil {
		t.Fatal(err)
	}
	c.Configs[0].AllowJoin = true
	c.Start(0)
	waitServing(t, ctx, testutil.Client(t, c.Endpoint(0)))
	c.Join(0, server.Config{})
	c.Join(0, server.Config{})
	waitVoters(t, c, 3)
	everyNodeReads(t, ctx, c, "backed up")
}

// everyNodeReads checks that every node of c reads value at each of
// memberKeys.
func everyNodeReads(t *testing.T, ctx context.Context, c *testutil.Cluster, value string) {
	t.Helper()
	for i := range c.Nodes {
		ci := testutil.Client(t, c.Endpoint(i))
		for _, k := range memberKeys {
			r, err := ci.Get(ctx, k)
			if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != value {
				t.Fatalf("node %d get %s: %v %v, want %q", i, k, r, err, value)
			}
		}
	}
}
