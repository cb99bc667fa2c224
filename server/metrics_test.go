package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestMetricsAndDashboard scrapes a node's /metrics after some traffic:
// the metrics operators need are there (per-RPC requests and latency, raft,
// TSO, closed-revision lag, watches, Pebble), and every metric the Grafana
// dashboard (deploy/grafana/brain-dashboard.json) queries exists, so the
// dashboard cannot silently drift from the code.
func TestMetricsAndDashboard(t *testing.T) {
	s := testutil.StartBrain(t, server.Config{})
	cli := testutil.Client(t, testutil.Endpoint(s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wch := cli.Watch(ctx, "/registry/pods/", clientv3.WithPrefix())
	for i := 0; i < 5; i++ {
		if _, err := cli.Put(ctx, "/registry/pods/m"+string(rune('a'+i)), "v"); err != nil {
			t.Fatal(err)
		}
	}
	<-wch
	if _, err := cli.Get(ctx, "/registry/pods/ma"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(s.ClientURLs()[0] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	have := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		have[name] = true
	}
	for _, want := range []string{
		"grpc_server_handled_total", "grpc_server_handling_seconds_bucket",
		"brain_raft_proposals_total", "brain_raft_applied_entries_total", "brain_raft_is_leader",
		"brain_raft_batch_transit_seconds_bucket", "brain_raft_send_queue_seconds_bucket", "brain_raft_inbox_wait_seconds_bucket", "go_sched_latencies_seconds_bucket",
		"brain_tso_confirm_batch_size_bucket", "brain_partition_closed_revision_lag",
		"brain_watchers", "brain_watch_delivery_lag_seconds_bucket",
		"brain_leader_write_rate", "brain_leader_load", "brain_pebble_disk_usage_bytes", "brain_watch_slow_cancellations_total", "brain_requests_shed_total", "brain_inflight_writes", "brain_pebble_l0_sublevels", "brain_pebble_compaction_debt_bytes",
	} {
		if !have[want] {
			t.Errorf("/metrics has no %s", want)
		}
	}
	if !strings.Contains(string(body), `grpc_method="Put"`) {
		t.Error("no per-RPC series for Put")
	}

	// The LSM view: Pebble's level table, with a row per level.
	resp, err = http.Get(s.ClientURLs()[0] + "/brain/v1/lsm")
	if err != nil {
		t.Fatal(err)
	}
	lsm, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(lsm), "level") || !strings.Contains(string(lsm), "total") {
		t.Errorf("/brain/v1/lsm: %s\n%s", resp.Status, lsm)
	}

	b, err := os.ReadFile("../deploy/grafana/brain-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not valid JSON: %v", err)
	}
	metric := regexp.MustCompile(`([a-z_][a-z0-9_]*)\{`)
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range metric.FindAllStringSubmatch(tg.Expr, -1) {
				n++
				if !have[m[1]] {
					t.Errorf("dashboard panel %q queries %s, which /metrics does not export", p.Title, m[1])
				}
			}
		}
	}
	if n < 10 {
		t.Errorf("the dashboard queries only %d metrics", n)
	}
}
