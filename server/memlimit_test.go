package server_test

import (
	"errors"
	"math"
	"os"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/brainkv/brain/server"
)

// TestSetMemoryLimit: the soft limit is the ratio of the provider's limit;
// ratio 0 and a GOMEMLIMIT in the environment leave the limit alone; no
// limit (no cgroup limit) sets none; a failing provider is an error that
// leaves the limit as it was.
func TestSetMemoryLimit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	t.Setenv("AUTOMEMLIMIT", "") // restored after the test
	os.Unsetenv("AUTOMEMLIMIT")  // set, even empty, it would be a ratio
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	var gib uint64 = 1 << 30
	want := int64(float64(2*gib) * 0.9)

	got, err := server.SetMemoryLimit(0.9, memlimit.Limit(2*gib), nil)
	if err != nil || got != want || debug.SetMemoryLimit(-1) != got {
		t.Fatalf("2 GiB at 0.9: limit %d (runtime %d), %v; want %d", got, debug.SetMemoryLimit(-1), err, want)
	}
	if got, err := server.SetMemoryLimit(0, memlimit.Limit(gib), nil); err != nil || got != want {
		t.Fatalf("ratio 0 changed the limit to %d (%v)", got, err)
	}
	broken := func() (uint64, error) { return 0, errors.New("no cgroup") }
	if _, err := server.SetMemoryLimit(0.9, broken, nil); err == nil || debug.SetMemoryLimit(-1) != want {
		t.Fatalf("a failing provider: %v, limit %d; want an error and the limit unchanged", err, debug.SetMemoryLimit(-1))
	}
	none := func() (uint64, error) { return 0, memlimit.ErrNoLimit }
	if got, err := server.SetMemoryLimit(0.9, none, nil); err != nil || got != math.MaxInt64 {
		t.Fatalf("no limit: %d, %v; want none (MaxInt64)", got, err)
	}
	t.Setenv("GOMEMLIMIT", "1GiB")
	if got, err := server.SetMemoryLimit(0.9, memlimit.Limit(4*gib), nil); err != nil || got != math.MaxInt64 {
		t.Fatalf("with GOMEMLIMIT set: %d, %v; want the limit left alone", got, err)
	}
}
