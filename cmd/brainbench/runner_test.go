package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestMeasureLastCountsTheWindowOnly runs a fake operation of a fixed
// length and checks that --measure-last measures only the window's share
// of the operations, counts every other one as unmeasured, and marks the
// window's start.
func TestMeasureLastCountsTheWindowOnly(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Clients, cfg.Total, cfg.MaxErrors = 4, 0, 1<<40
	cfg.Duration, cfg.MeasureLast = time.Second, 500*time.Millisecond
	cfg.WindowFile = filepath.Join(t.TempDir(), "window")
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	var calls, failing atomic.Int64
	p := &pool{clients: []*clientv3.Client{nil}}
	start := time.Now()
	s := runLoad(context.Background(), "fake", cfg, p, func(ctx context.Context, _ *worker, seq int64) error {
		calls.Add(1)
		time.Sleep(5 * time.Millisecond)
		switch {
		case seq%10 == 0:
			failing.Add(1)
			return context.DeadlineExceeded
		case seq%10 == 5:
			failing.Add(1)
			return errFake
		}
		return nil
	}, nil)
	if s.elapsed != cfg.MeasureLast {
		t.Fatalf("measured %v, want the window's %v", s.elapsed, cfg.MeasureLast)
	}
	if got := s.ops + s.errors + s.unmeasured + s.unmeasuredErrors; got != calls.Load() {
		t.Fatalf("%d operations counted (%d+%d measured, %d+%d not), %d ran", got, s.ops, s.errors, s.unmeasured, s.unmeasuredErrors, calls.Load())
	}
	if s.errors+s.unmeasuredErrors != failing.Load() {
		t.Fatalf("%d+%d failures counted, %d failed", s.errors, s.unmeasuredErrors, failing.Load())
	}
	// Every failure is counted by its kind: about as many of each.
	k1, k2 := s.kinds[context.DeadlineExceeded.Error()], s.kinds[errFake.Error()]
	if len(s.kinds) != 2 || k1+k2 != failing.Load() || k1 < k2-1 || k1 > k2+1 {
		t.Fatalf("failures by kind %v, want %d in all, about half %q and half %q", s.kinds, failing.Load(), context.DeadlineExceeded, errFake)
	}
	// The window is half the run: about half the operations end in it.
	if share := float64(s.ops+s.errors) / float64(calls.Load()); share < 0.25 || share > 0.75 {
		t.Fatalf("%.2f of the operations measured, want about 0.5 (%d of %d)", share, s.ops+s.errors, calls.Load())
	}
	if int64(s.hist.Count()) != s.ops {
		t.Fatalf("histogram holds %d latencies, %d operations measured", s.hist.Count(), s.ops)
	}
	fi, err := os.Stat(cfg.WindowFile)
	if err != nil {
		t.Fatalf("window file: %v", err)
	}
	// File times can be coarser than the clock: allow a little.
	if at := fi.ModTime().Sub(start); at < cfg.Duration-cfg.MeasureLast-50*time.Millisecond {
		t.Fatalf("window file made %v into the run, before its window began at %v", at, cfg.Duration-cfg.MeasureLast)
	}
}

var errFake = errors.New("fake failure")

func TestMeasureLastValidation(t *testing.T) {
	for _, c := range []struct {
		total     int64
		dur, last time.Duration
		file      string
		ok        bool
	}{
		{0, 2 * time.Second, time.Second, "w", true},
		{0, 2 * time.Second, 0, "", true},
		{100, 2 * time.Second, time.Second, "", false}, // a total could end it before the window
		{0, time.Second, time.Second, "", false},       // no ramp
		{0, 0, time.Second, "", false},
		{0, time.Second, -time.Second, "", false},
		{0, time.Second, 0, "w", false}, // no window to mark
	} {
		cfg := DefaultConfig()
		cfg.Total, cfg.Duration, cfg.MeasureLast, cfg.WindowFile = c.total, c.dur, c.last, c.file
		if err := cfg.validate(); (err == nil) != c.ok {
			t.Errorf("total %d duration %v measure-last %v window-file %q: err %v, want ok=%v", c.total, c.dur, c.last, c.file, err, c.ok)
		}
	}
}
