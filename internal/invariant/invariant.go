package invariant

import (
	"fmt"
	"log/slog"
	"sync/atomic"
)

var violations atomic.Int64

// Violations returns how many violations were reported (without the
// invariants tag).
func Violations() int64 { return violations.Load() }

// Check reports a violation if cond is false.
func Check(cond bool, format string, args ...any) {
	if cond {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if Enabled {
		panic("invariant violated: " + msg)
	}
	violations.Add(1)
	slog.Error("invariant violated", "msg", msg)
}
