package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
)

// TestCostTableChargesComponents checks each sample is charged to the
// highest-ranked component its stack matches (a TSO call inside a client
// write is TSO, a client write's own frames are client API), and µs per
// op follow from the rate and the profile's duration.
func TestCostTableChargesComponents(t *testing.T) {
	fns := map[string]*profile.Function{}
	var locs []*profile.Location
	loc := func(name string) *profile.Location {
		if fns[name] == nil {
			fns[name] = &profile.Function{ID: uint64(len(fns) + 1), Name: name}
		}
		l := &profile.Location{ID: uint64(len(locs) + 1), Line: []profile.Line{{Function: fns[name]}}}
		locs = append(locs, l)
		return l
	}
	sample := func(ns int64, leafFirst ...string) *profile.Sample {
		s := &profile.Sample{Value: []int64{ns / 1e7, ns}}
		for _, f := range leafFirst {
			s.Location = append(s.Location, loc(f))
		}
		return s
	}
	p := &profile.Profile{
		SampleType:    []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		DurationNanos: 2e9, // at 500 ops/s: 1000 ops
		Sample: []*profile.Sample{
			sample(30e6, "github.com/brainkv/brain/tso.(*Client).Next", "github.com/brainkv/brain/kvapi.(*callMux).call", "github.com/brainkv/brain/partition.(*Partition).Txn", "github.com/brainkv/brain/etcdcompat.(*kvServer).Txn"),
			sample(20e6, "runtime.mallocgc", "github.com/brainkv/brain/etcdcompat.(*kvServer).Txn"),
			sample(10e6, "syscall.write", "google.golang.org/grpc/internal/transport.(*bufWriter).Flush", "google.golang.org/grpc/internal/transport.(*loopyWriter).run"),
			sample(10e6, "runtime.gcDrain", "runtime.gcBgMarkWorker"),
			sample(5e6, "main.somethingElse"),
		},
		Function: nil,
	}
	for _, f := range fns {
		p.Function = append(p.Function, f)
	}
	p.Location = locs
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "node.pprof")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	col, err := readCostColumn(path, 500)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"TSO":                             30,
		"client API (etcd gRPC handlers)": 20,
		"gRPC send (HTTP/2 writer)":       10,
		"GC":                              10,
		costOther:                         5,
	}
	for name, us := range want {
		if got := col.us[name]; got != us {
			t.Errorf("%s: %v µs per op, want %v", name, got, us)
		}
	}
	if col.total != 75 || len(col.us) != len(want) {
		t.Errorf("total %v µs per op in %d components, want 75 in %d: %v", col.total, len(col.us), len(want), col.us)
	}
	var out bytes.Buffer
	printCostTable(&out, []costColumn{col})
	if !strings.Contains(out.String(), "node") || !strings.Contains(out.String(), "75") {
		t.Errorf("table lacks the column or its total:\n%s", out.String())
	}
}
