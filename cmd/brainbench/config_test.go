package main

import (
	"bufio"
	"strings"
	"testing"
)

func TestWriteKeySpreadsOverResources(t *testing.T) {
	c := DefaultConfig()
	if got := c.writeKey("put", 7); got != "/registry/configmaps/bench/put-00000007" {
		t.Fatalf("without resources: %q", got)
	}
	c.Resources = []string{"pods", "events"}
	for i, want := range []string{"/registry/pods/bench/put-00000000", "/registry/events/bench/put-00000001", "/registry/pods/bench/put-00000002"} {
		if got := c.writeKey("put", int64(i)); got != want {
			t.Fatalf("key %d: %q, want %q", i, got, want)
		}
	}
}

func TestHashedNamesSpreadEveryGroup(t *testing.T) {
	c := &Config{KeyPrefix: "/registry/pods/", HashedNames: true}
	a, b := c.writeKey("create-x", 1), c.writeKey("create-x", 2)
	if a == b || a[:len("/registry/pods/")] != "/registry/pods/" || a[len(a)-len("-create-x"):] != "-create-x" {
		t.Fatalf("hashed names %q %q", a, b)
	}
	// Consecutive numbers are far apart, whatever the group.
	if a[15] == b[15] && a[16] == b[16] {
		t.Fatalf("consecutive keys %q and %q share their first scrambled characters", a, b)
	}
}

func TestParseCPUSeconds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n", 12.5, true},
		{"process_cpu_seconds_total_other 3\nprocess_cpu_seconds_total{x=\"y\"} 7\n", 7, true},
		{"go_goroutines 12\n", 0, false},
	} {
		v, ok, err := parseCPUSeconds(bufio.NewScanner(strings.NewReader(tc.in)))
		if err != nil || ok != tc.ok || v != tc.want {
			t.Errorf("parse %q: %v %v %v, want %v %v", tc.in, v, ok, err, tc.want, tc.ok)
		}
	}
}
