package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/etcdcompat"
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

// TestMetricsListenerServesOnlyMetrics: --listen-metrics-urls serves
// /metrics and the health endpoints, as etcd's metrics listener does, and
// answers 404 for the admin API (status, the LSM view, splits, moves) and
// pprof, which the client URL serves (the metrics port skips client TLS and
// auth: an unauthenticated POST there split a partition).
func TestMetricsListenerServesOnlyMetrics(t *testing.T) {
	metrics := "http://127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	s := testutil.StartBrain(t, server.Config{ListenMetricsURLs: []string{metrics}, EnablePprof: true})
	client := s.ClientURLs()[0]
	code := func(method, url string) int {
		t.Helper()
		req, err := http.NewRequest(method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, p := range []string{"/metrics", "/health", "/livez", "/readyz"} {
		if c := code("GET", metrics+p); c != http.StatusOK {
			t.Errorf("metrics listener GET %s: %d, want 200", p, c)
		}
	}
	for _, r := range []struct{ method, path string }{
		{"GET", "/brain/v1/status"}, {"GET", "/brain/v1/lsm"},
		{"POST", "/brain/v1/split?key=/registry/pods/m"},
		{"POST", "/brain/v1/transfer-leader?group=1&to=1"},
		{"POST", "/brain/v1/move-replica?group=1&from=1&to=2"},
		{"GET", "/debug/pprof/"}, {"GET", "/debug/pprof/cmdline"},
	} {
		if c := code(r.method, metrics+r.path); c != http.StatusNotFound {
			t.Errorf("metrics listener %s %s: %d, want 404", r.method, r.path, c)
		}
	}
	// The client URL still serves them.
	for _, p := range []string{"/brain/v1/status", "/debug/pprof/cmdline"} {
		if c := code("GET", client+p); c != http.StatusOK {
			t.Errorf("client URL GET %s: %d, want 200", p, c)
		}
	}
}

// TestVersionEndpoint: the client URL serves etcd's /version, with the
// fields etcd's has (tools probe it to learn the API they talk to).
func TestVersionEndpoint(t *testing.T) {
	fields := func(url string) map[string]string {
		t.Helper()
		resp, err := http.Get(url + "/version")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]string
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s/version: %s %v", url, resp.Status, err)
		}
		return v
	}
	want := fields("http://" + testutil.StartEtcd(t))
	got := fields(testutil.StartBrain(t, server.Config{}).ClientURLs()[0])
	if len(got) != len(want) {
		t.Fatalf("/version: brain %v, etcd %v", got, want)
	}
	for k := range want {
		if got[k] == "" {
			t.Errorf("/version lacks etcd's %q: %v", k, got)
		}
	}
	if got["etcdserver"] != etcdcompat.Version || got["etcdcluster"] != want["etcdcluster"] {
		t.Errorf("/version: %v (etcd's: %v)", got, want)
	}
}
