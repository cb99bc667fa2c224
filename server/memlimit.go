package server

import (
	"log/slog"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// DefaultMemoryLimitRatio is --memory-limit-ratio's default.
const DefaultMemoryLimitRatio = 0.9

// SetMemoryLimit sets the Go runtime's soft memory limit (GOMEMLIMIT) to
// ratio of the memory limit provider reports (brainnode: the node's
// cgroup's, as a container's --memory sets it), so that the garbage
// collector works harder as the node nears its limit instead of the
// kernel killing it. Without a soft limit Go lets the heap grow to twice
// what is live between collections: in a 0.10-CPU scaling benchmark
// round (2026-12-06), the node serving the watch held about 1 GiB
// resident in steady state, against 0.5 GiB for the others, and was
// killed by its 2 GiB limit during a spell of leader elections.
//
// A GOMEMLIMIT in the environment wins (AUTOMEMLIMIT=off, too); ratio 0
// leaves the limit alone; a provider without a limit (no cgroup limit)
// leaves none. It returns the limit in force; a provider's failure is an
// error, and the limit is left as it was.
func SetMemoryLimit(ratio float64, provider memlimit.Provider, log *slog.Logger) (int64, error) {
	if ratio <= 0 {
		return debug.SetMemoryLimit(-1), nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return memlimit.Set(memlimit.WithRatio(ratio), memlimit.WithProvider(provider), memlimit.WithLogger(log))
}

// CgroupMemoryLimit returns the memory limit of this process's cgroup
// (SetMemoryLimit's provider in brainnode).
func CgroupMemoryLimit() (uint64, error) { return memlimit.FromCgroup() }

// NewLogger returns brain's structured logger to stderr at level (debug,
// info, warn or error; others mean info) in format (text, json, or empty:
// text when stderr is a terminal, else json).
func NewLogger(level, format string) *slog.Logger { return newLogger(level, format) }
