package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/etcdcompat"
	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func runCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := rootCmd()
	cmd.SetOut(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// TestStatusAndTransferLeader runs "status" against a 3-node cluster (every
// member, every group with its leader, range, closed lag and size), then
// moves a partition's leadership with "transfer-leader" and sees status
// report the new leader. The balancer, which would move leaderships to
// their preferred nodes at any time (under the test's feet), is off.
func TestStatusAndTransferLeader(t *testing.T) {
	c := testutil.StartCluster(t, 3, server.Config{InitialSplitPoints: []string{"m"}, LeaderBalanceInterval: time.Hour})
	var eps []string
	for i := range c.Nodes {
		eps = append(eps, "http://"+c.Endpoint(i))
	}
	cl := testutil.Client(t, c.Endpoint(0))
	leaderOf := func(group uint64) string {
		t.Helper()
		out, err := runCmd(t, "status", "-w", "json", "--endpoints", strings.Join(eps, ","))
		if err != nil {
			t.Fatal(err)
		}
		var views []server.NodeStatus
		if err := json.Unmarshal([]byte(out), &views); err != nil {
			t.Fatalf("status -w json: %v\n%s", err, out)
		}
		for _, v := range views {
			for _, g := range v.Groups {
				if g.Group == group && g.Role == "leader" {
					return v.Name
				}
			}
		}
		return ""
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := cl.Put(t.Context(), "a", "1")
		if err == nil && leaderOf(100) != "" && leaderOf(101) != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not serving with partition leaders: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, err := runCmd(t, "status", "--endpoints", strings.Join(eps, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("status:\n%s", out)
	for _, want := range []string{"3 of 3 queried nodes answered", "n1", "n2", "n3", "tso", "meta", `["", "m")`, `["m", ∞)`, "CLOSED LAG"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status lacks %q:\n%s", want, out)
		}
	}
	from := leaderOf(100)
	to := "n1"
	if from == "n1" {
		to = "n2"
	}
	if _, err := runCmd(t, "transfer-leader", "--endpoints", strings.Join(eps, ","), "--group", "100", "--to", to); err != nil {
		t.Fatalf("transfer-leader of group 100 from %s to %s: %v", from, to, err)
	}
	if got := leaderOf(100); got != to {
		t.Fatalf("after transfer-leader to %s, status shows %q leading group 100", to, got)
	}
	if _, err := runCmd(t, "transfer-leader", "--endpoints", strings.Join(eps, ","), "--group", "100", "--to", "nobody"); err == nil {
		t.Fatal("transfer-leader to an unknown member succeeded")
	}
}

// TestMoveReplica moves a partition's replica with "move-replica" on a
// 4-node cluster, once from a follower and once from the leader (which
// hands leadership over first), while a client writes to the partition and
// a watch follows it: no write fails, the watch sees every acknowledged
// write once and in order, and status shows the new voters.
func TestMoveReplica(t *testing.T) {
	c := testutil.StartCluster(t, 4, server.Config{InitialSplitPoints: []string{"m"}})
	var eps []string
	for i := range c.Nodes {
		eps = append(eps, "http://"+c.Endpoint(i))
	}
	all := strings.Join(eps, ",")
	cl := testutil.Client(t, c.Endpoint(0))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// group reports partition 100 as its leader sees it. A leadership
	// transfer by the balancer leaves a moment in which no node reports
	// itself leader, so group asks again for a while before giving up.
	group := func() server.GroupStatus {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, err := runCmd(t, "status", "-w", "json", "--endpoints", all)
			if err != nil {
				t.Fatal(err)
			}
			var views []server.NodeStatus
			if err := json.Unmarshal([]byte(out), &views); err != nil {
				t.Fatal(err)
			}
			for _, v := range views {
				for _, g := range v.Groups {
					if g.Group == 100 && g.Role == "leader" {
						return g
					}
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("no node reports itself leader of partition 100")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var start int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := cl.Put(ctx, "a-start", "v")
		if err == nil {
			group() // status shows the partition's leader
			start = p.Header.Revision
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not serving: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	wch := cl.Watch(ctx, "a", clientv3.WithPrefix(), clientv3.WithRev(start+1))
	stop := make(chan struct{})
	var acked []int64
	var werr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p, err := cl.Put(ctx, fmt.Sprintf("a%05d", i), "v")
			if err != nil {
				werr = err
				return
			}
			acked = append(acked, p.Header.Revision)
		}
	}()
	name := map[string]string{}
	out, _ := runCmd(t, "status", "-w", "json", "--endpoints", all)
	var views []server.NodeStatus
	_ = json.Unmarshal([]byte(out), &views)
	for _, m := range views[0].Members {
		name[m.ID] = m.Name
	}
	move := func(fromLeader bool) {
		t.Helper()
		g := group()
		var from, to string
		for id := range name {
			switch {
			case !slices.Contains(g.Voters, id):
				to = id
			case (id == g.Leader) == fromLeader:
				from = id
			}
		}
		if from == "" || to == "" {
			t.Fatalf("no replica to move: voters %v, leader %s, members %v", g.Voters, g.Leader, name)
		}
		if out, err := runCmd(t, "move-replica", "--endpoints", all, "--group", "100", "--from", name[from], "--to", name[to]); err != nil {
			t.Fatalf("move-replica from %s to %s: %v (%s)", name[from], name[to], err, out)
		}
		after := group()
		if !slices.Contains(after.Voters, to) || slices.Contains(after.Voters, from) || len(after.Voters) != 3 {
			t.Fatalf("after moving from %s to %s, voters %v", from, to, after.Voters)
		}
	}
	time.Sleep(300 * time.Millisecond)
	move(false)
	time.Sleep(300 * time.Millisecond)
	move(true)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	<-done
	if werr != nil {
		t.Fatalf("a write failed during the moves: %v", werr)
	}
	if len(acked) == 0 {
		t.Fatal("no write was acknowledged during the moves")
	}
	last := acked[len(acked)-1]
	var seen []int64
	for wr := range wch {
		if err := wr.Err(); err != nil {
			t.Fatal(err)
		}
		for _, ev := range wr.Events {
			seen = append(seen, ev.Kv.ModRevision)
		}
		if len(seen) > 0 && seen[len(seen)-1] >= last {
			break
		}
	}
	if fmt.Sprint(seen) != fmt.Sprint(acked) {
		t.Fatalf("the watch saw %d events, %d writes were acknowledged (first difference matters):\nwatch %v\nacked %v", len(seen), len(acked), seen, acked)
	}
	t.Logf("%d writes acknowledged and watched across two replica moves", len(acked))
}

// TestSplitCommand splits a partition with "split" and sees "status"
// report both halves; a split at an existing boundary is refused.
func TestSplitCommand(t *testing.T) {
	s := testutil.StartBrain(t, server.Config{InitialSplitPoints: []string{"m"}})
	ep := "http://" + testutil.Endpoint(s)
	cl := testutil.Client(t, testutil.Endpoint(s))
	for _, k := range []string{"a", "f", "p"} {
		if _, err := cl.Put(t.Context(), k, k); err != nil {
			t.Fatal(err)
		}
	}
	out, err := runCmd(t, "split", "--endpoints", ep, "d")
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	if !strings.Contains(out, `split at "d"`) {
		t.Fatalf("split printed %q", out)
	}
	if _, err := runCmd(t, "split", "--endpoints", ep, "m"); err == nil || !strings.Contains(err.Error(), "already starts a partition") {
		t.Fatalf("split at a boundary: %v", err)
	}
	out, err = runCmd(t, "status", "-w", "json", "--endpoints", ep)
	if err != nil {
		t.Fatal(err)
	}
	var views []server.NodeStatus
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		t.Fatalf("status -w json: %v\n%s", err, out)
	}
	var spans []string
	for _, g := range views[0].Groups {
		if g.Kind == "partition" {
			spans = append(spans, fmt.Sprintf("[%s,%s)", g.Start, g.End))
		}
	}
	slices.Sort(spans)
	if want := []string{"[,d)", "[d,m)", "[m,)"}; !slices.Equal(spans, want) {
		t.Fatalf("partitions after the split: %v, want %v", spans, want)
	}
	g, err := cl.Get(t.Context(), "", clientv3.WithFromKey())
	if err != nil || g.Count != 3 {
		t.Fatalf("keys after the split: %v %v", g, err)
	}
}

// TestAdminNeedsRoot: with auth on, the operator API serves only the root
// role: status and split without --user are refused with etcd's "user
// name is empty", a user without the root role with "permission denied",
// and root is served.
func TestAdminNeedsRoot(t *testing.T) {
	s := testutil.StartBrain(t, server.Config{InitialSplitPoints: []string{"m"}, BcryptCost: 4})
	ep := "http://" + testutil.Endpoint(s)
	cl := testutil.Client(t, testutil.Endpoint(s))
	ctx := t.Context()
	for _, step := range []func() error{
		func() error { _, err := cl.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := cl.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cl.UserAdd(ctx, "alice", "alicepw"); return err },
		func() error { _, err := cl.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	out, err := runCmd(t, "status", "--endpoints", ep)
	if err == nil || !strings.Contains(out+err.Error(), "user name is empty") {
		t.Fatalf("status without a user: %v\n%s", err, out)
	}
	if _, err := runCmd(t, "split", "--endpoints", ep, "--user", "alice:alicepw", "d"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("split as alice: %v", err)
	}
	if _, err := runCmd(t, "split", "--endpoints", ep, "--user", "root:wrong", "d"); err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("split with a wrong password: %v", err)
	}
	if out, err := runCmd(t, "status", "--endpoints", ep, "--user", "root:rootpw"); err != nil || !strings.Contains(out, "1 of 1 queried nodes answered") {
		t.Fatalf("status as root: %v\n%s", err, out)
	}
	if out, err := runCmd(t, "split", "--endpoints", ep, "--user", "root:rootpw", "d"); err != nil || !strings.Contains(out, `split at "d"`) {
		t.Fatalf("split as root: %v\n%s", err, out)
	}
}

// TestVersionFlag: --version and the version command print the build and
// the etcd API version.
func TestVersionFlag(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out, err := runCmd(t, args...)
		if err != nil || !strings.HasPrefix(out, "brainnode ") || !strings.Contains(out, "etcd API "+etcdcompat.Version) || !strings.Contains(out, "go1.") {
			t.Fatalf("brainnode %v: %v %q", args, err, out)
		}
	}
}
