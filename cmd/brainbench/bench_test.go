package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
)

// testConfig is a tiny run against endpoint.
func testConfig(endpoint string) Config {
	cfg := DefaultConfig()
	cfg.Endpoints = []string{endpoint}
	cfg.Clients, cfg.Conns = 4, 2
	cfg.Total = 200
	cfg.Keys = 100
	cfg.PageSize = 30
	cfg.ValueSize = 256
	cfg.OpTimeout = 10 * time.Second
	return cfg
}

// checkResult asserts that a bounded benchmark ran every operation
// without errors and measured something plausible.
func checkResult(t *testing.T, r Result, wantOps int64) {
	t.Helper()
	if r.Ops != wantOps || r.Errors != 0 || r.Failed() {
		t.Fatalf("%s: ops %d errors %d (first %q), want %d ops and no errors", r.Name, r.Ops, r.Errors, r.FirstError, wantOps)
	}
	if r.Throughput <= 0 || r.Seconds <= 0 {
		t.Fatalf("%s: throughput %v over %v s", r.Name, r.Throughput, r.Seconds)
	}
	if !(0 < r.P50 && r.P50 <= r.P90 && r.P90 <= r.P99 && r.P99 <= r.Max) {
		t.Fatalf("%s: percentiles not ordered: p50 %v p90 %v p99 %v max %v", r.Name, r.P50, r.P90, r.P99, r.Max)
	}
}

func TestBenchmarksAgainstEtcd(t *testing.T) {
	runAllBenchmarks(t, testutil.StartEtcd(t))
}

func TestBenchmarksAgainstBrain(t *testing.T) {
	runAllBenchmarks(t, testutil.Endpoint(testutil.StartBrain(t, server.Config{})))
}

// runAllBenchmarks runs every benchmark with tiny totals against endpoint.
func runAllBenchmarks(t *testing.T, endpoint string) {
	ctx := context.Background()
	cfg := testConfig(endpoint)

	t.Run("create", func(t *testing.T) {
		r, err := RunCreate(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		checkResult(t, r, cfg.Total)
	})
	t.Run("create with resource watches", func(t *testing.T) {
		c := cfg
		c.Resources, c.ResourceWatchers = []string{"pods", "events"}, 2
		r, err := RunCreate(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		checkResult(t, r, c.Total)
		w := r.ResourceWatches
		if w == nil || w.Watches != 4 || w.Want != 2*c.Total || w.Events != w.Want || w.FirstError != "" {
			t.Fatalf("resource watches %+v, want 4 watches receiving %d events without error", w, 2*c.Total)
		}
	})
	t.Run("update", func(t *testing.T) {
		r, err := RunUpdate(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		checkResult(t, r, cfg.Total)
	})
	t.Run("put", func(t *testing.T) {
		r, err := RunPut(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		checkResult(t, r, cfg.Total)
	})
	t.Run("get", func(t *testing.T) {
		r, err := RunGet(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		checkResult(t, r, cfg.Total)
	})
	t.Run("put at a fixed rate with CPU per op", func(t *testing.T) {
		// 100 puts/s offered for 2 s, the last second measured, after
		// 300 ms of idle CPU: about 100 puts in the window, each with
		// the node's (here: this process's) CPU spread over them.
		c := cfg
		c.Total, c.Duration, c.MeasureLast = 0, 2*time.Second, time.Second
		c.OpRate, c.CPU, c.CPUIdle = 100, true, 300*time.Millisecond
		r, err := RunPut(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if r.Errors != 0 || r.Ops < 80 || r.Ops > 120 || r.OfferedRate != 100 {
			t.Fatalf("put at 100/s for a 1 s window: %d ops, %d errors (offered %d/s)", r.Ops, r.Errors, r.OfferedRate)
		}
		cpu := r.CPU
		if cpu == nil || len(cpu.Nodes) != 1 || cpu.Nodes[0].Seconds <= 0 || cpu.TotalUsPerOp <= 0 ||
			cpu.BusiestUsPerOp != cpu.TotalUsPerOp || cpu.IdleSeconds < 0.3 {
			t.Fatalf("CPU stats %+v", cpu)
		}
		n := cpu.Nodes[0]
		if want := n.Seconds * 1e6 / float64(r.Ops); n.UsPerOp != want {
			t.Fatalf("µs per op %v, want cpu seconds %v × 1e6 / %d ops = %v", n.UsPerOp, n.Seconds, r.Ops, want)
		}
		var out bytes.Buffer
		printTable(&out, []Result{r})
		if !bytes.Contains(out.Bytes(), []byte("CPU per op (offered 100/s")) {
			t.Fatalf("report lacks the CPU line:\n%s", out.String())
		}
	})
	t.Run("list", func(t *testing.T) {
		c := cfg
		c.Total = 20
		r, err := RunList(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		checkResult(t, r, c.Total)
		if r.KeysPerList != int64(c.Keys) || r.Pages != 4 {
			t.Fatalf("list: %d keys in %d pages, want %d keys in 4 pages", r.KeysPerList, r.Pages, c.Keys)
		}
	})
	t.Run("watch", func(t *testing.T) {
		c := cfg
		c.Watchers, c.Rate, c.Duration, c.Total, c.Keys = 10, 200, time.Second, 0, 50
		r, err := RunWatch(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if r.Watch == nil || !r.Watch.Verified {
			t.Fatalf("watch verification failed: %+v", r.Watch)
		}
		if r.Watch.Writes != 200 || r.Watch.WriteErrors != 0 {
			t.Fatalf("watch: %d writes, %d failed, want 200 and 0", r.Watch.Writes, r.Watch.WriteErrors)
		}
		checkResult(t, r, 200*10)
	})
	t.Run("duration-bound", func(t *testing.T) {
		c := cfg
		c.Total, c.Duration = 0, 300*time.Millisecond
		r, err := RunPut(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if r.Ops == 0 || r.Errors != 0 || r.Seconds < 0.3 || r.Seconds > 5 {
			t.Fatalf("put for 300ms: %d ops, %d errors in %.2fs", r.Ops, r.Errors, r.Seconds)
		}
	})
	t.Run("create, last second measured", func(t *testing.T) {
		c := cfg
		c.KeyPrefix = "/registry/steady/"
		c.Total, c.Duration, c.MeasureLast = 0, 2*time.Second, time.Second
		c.WindowFile = filepath.Join(t.TempDir(), "window")
		r, err := RunCreate(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if r.Ops == 0 || r.UnmeasuredOps == 0 || r.Errors+r.UnmeasuredErrors != 0 || r.Seconds != 1 {
			t.Fatalf("create for 2s measuring the last 1s: %d ops measured, %d not, %d+%d errors, over %.3fs", r.Ops, r.UnmeasuredOps, r.Errors, r.UnmeasuredErrors, r.Seconds)
		}
		if _, err := os.Stat(c.WindowFile); err != nil {
			t.Fatalf("window file: %v", err)
		}
		// Every create the store holds was counted once, in the window or
		// outside it.
		cli := testutil.Client(t, endpoint)
		resp, err := cli.Get(ctx, c.KeyPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count != r.Ops+r.UnmeasuredOps {
			t.Fatalf("the store holds %d created keys, the result counts %d measured + %d not", resp.Count, r.Ops, r.UnmeasuredOps)
		}
	})
	t.Run("update, last second measured", func(t *testing.T) {
		// The populate phase has no Duration: it must fill every key
		// whatever --measure-last says.
		c := cfg
		c.KeyPrefix = "/registry/steady-update/"
		c.Total, c.Duration, c.MeasureLast = 0, 2*time.Second, time.Second
		r, err := RunUpdate(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if r.Ops == 0 || r.UnmeasuredOps == 0 || r.Errors+r.UnmeasuredErrors != 0 {
			t.Fatalf("update for 2s measuring the last 1s: %d ops measured, %d not, %d+%d errors", r.Ops, r.UnmeasuredOps, r.Errors, r.UnmeasuredErrors)
		}
		cli := testutil.Client(t, endpoint)
		resp, err := cli.Get(ctx, groupPrefix(c.KeyPrefix, groupUpdate), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count != int64(c.Keys) {
			t.Fatalf("the populate phase left %d keys, want %d", resp.Count, c.Keys)
		}
	})
	t.Run("all", func(t *testing.T) {
		var progress bytes.Buffer
		c := cfg
		c.Progress = &progress
		rs, err := RunAll(ctx, c, 10)
		if err != nil {
			t.Fatal(err)
		}
		names := []string{"create", "update", "put", "list"}
		if len(rs) != len(names) {
			t.Fatalf("all ran %d benchmarks, want %d", len(rs), len(names))
		}
		for i, r := range rs {
			if r.Name != names[i] {
				t.Fatalf("benchmark %d is %s, want %s", i, r.Name, names[i])
			}
			checkResult(t, r, map[bool]int64{true: 10, false: c.Total}[r.Name == "list"])
		}
	})
}
