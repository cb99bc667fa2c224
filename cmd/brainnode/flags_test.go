package main

import (
	"testing"
	"time"
)

// TestEtcdStyleDurations: the duration flags take etcd's plain numbers
// (milliseconds for the raft timings, seconds for --auth-token-ttl) and Go
// durations.
func TestEtcdStyleDurations(t *testing.T) {
	for _, tc := range []struct {
		unit time.Duration
		in   string
		want time.Duration
	}{
		{0, "100", 100 * time.Millisecond},
		{0, "2s", 2 * time.Second},
		{time.Second, "300", 300 * time.Second},
		{time.Second, "5m", 5 * time.Minute},
	} {
		var d time.Duration
		if err := (msDuration{d: &d, unit: tc.unit}).Set(tc.in); err != nil || d != tc.want {
			t.Errorf("unit %v, %q: %v, %v; want %v", tc.unit, tc.in, d, err, tc.want)
		}
	}
	var d time.Duration
	if err := (msDuration{d: &d}).Set("soon"); err == nil {
		t.Error("\"soon\" parsed as a duration")
	}
}
