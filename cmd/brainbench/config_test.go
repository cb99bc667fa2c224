package main

import "testing"

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
