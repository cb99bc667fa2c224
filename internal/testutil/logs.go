package testutil

import (
	"bytes"
	"log/slog"
	"os"
	"sync"
	"testing"
)

// keptLogLines is how many of a cluster's last log lines a failed test
// prints.
const keptLogLines = 400

// FailureLogger is a logger for a test's nodes that keeps their last
// keptLogLines lines (info and above) and prints them if the test fails,
// so a failure in CI comes with the nodes' view of it. With BRAIN_TEST_LOG
// set it is Quiet's logger (everything, to stderr).
func FailureLogger(t testing.TB) *slog.Logger {
	if os.Getenv("BRAIN_TEST_LOG") != "" {
		return Quiet()
	}
	r := &logRing{}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Logf("the nodes' last %d log lines (info and above):", len(r.lines))
		for _, l := range r.lines {
			t.Log(l)
		}
	})
	return slog.New(slog.NewTextHandler(r, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// logRing keeps the last keptLogLines lines written to it.
type logRing struct {
	mu    sync.Mutex
	lines []string
}

func (r *logRing) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		r.lines = append(r.lines, string(l))
	}
	if n := len(r.lines) - keptLogLines; n > 0 {
		r.lines = append(r.lines[:0:0], r.lines[n:]...)
	}
	return len(p), nil
}
