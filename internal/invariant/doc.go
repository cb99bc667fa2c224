// Package invariant checks internal invariants. Built with the
// "invariants" tag (as tests and CI are), a violation panics so tests fail
// at the point of the bug; otherwise it is logged and counted, so a
// production node reports the bug without stopping.
package invariant
