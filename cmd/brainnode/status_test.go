package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
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
// report the new leader.
func TestStatusAndTransferLeader(t *testing.T) {
	c := testutil.StartCluster(t, 3, server.Config{InitialSplitPoints: []string{"m"}})
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
