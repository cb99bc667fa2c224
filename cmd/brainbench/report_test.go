package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

func TestJSONRoundTripAndComparison(t *testing.T) {
	a := []Result{
		{Name: "put", Unit: "ops/s", Ops: 100, Throughput: 2000, P99: 5},
		{Name: "watch", Unit: "events/s", Ops: 10, Throughput: 100, P99: 3, Watch: &WatchStats{Verified: false}},
	}
	b := []Result{
		{Name: "put", Unit: "ops/s", Ops: 100, Throughput: 1000, P99: 10},
		{Name: "watch", Unit: "events/s", Ops: 10, Throughput: 100, P99: 2, Watch: &WatchStats{Verified: true}},
	}
	dir := t.TempDir()
	pa, pb := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	if err := appendJSON(pa, a); err != nil {
		t.Fatal(err)
	}
	if err := appendJSON(pb, b); err != nil {
		t.Fatal(err)
	}
	ra, err := readResults(pa)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := readResults(pb)
	if err != nil {
		t.Fatal(err)
	}
	if len(ra) != 2 || ra[1].Watch == nil || ra[0].Throughput != 2000 {
		t.Fatalf("round trip: %+v", ra)
	}
	var out bytes.Buffer
	printComparison(&out, "brain", "etcd", ra, rb)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("comparison has %d lines:\n%s", len(lines), out.String())
	}
	if f := strings.Fields(lines[1]); f[0] != "put" || f[4] != "2.00x" || f[7] != "0.50x" {
		t.Errorf("put row %q: want throughput ratio 2.00x and p99 ratio 0.50x", lines[1])
	}
	if !strings.Contains(lines[2], "brain watch verification FAILED") {
		t.Errorf("watch row %q does not flag the failed verification", lines[2])
	}
}

// TestErrorKindsPrinted checks the details list every kind of failure
// with its count, most frequent first.
func TestErrorKindsPrinted(t *testing.T) {
	r := Result{Name: "create", Errors: 10, FirstError: "op 7: etcdserver: leader changed",
		ErrorKinds: map[string]int64{"etcdserver: leader changed": 2, "etcdserver: request timed out": 7, "etcdserver: no leader": 1}}
	var out bytes.Buffer
	printDetails(&out, &r)
	want := "create: 10 errors, first: op 7: etcdserver: leader changed\n" +
		"create: 7 failed with: etcdserver: request timed out\n" +
		"create: 2 failed with: etcdserver: leader changed\n" +
		"create: 1 failed with: etcdserver: no leader\n"
	if out.String() != want {
		t.Errorf("details:\n%s\nwant:\n%s", out.String(), want)
	}
}
