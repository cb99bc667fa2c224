package chaos

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildBrainnode builds ../cmd/brainnode with the given tags into a temp
// dir.
func buildBrainnode(t *testing.T, tags string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "brainnode")
	args := []string{"build", "-o", bin}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command("go", append(args, "../cmd/brainnode")...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestCheckersCatchInjectedBugs is the checkers' self-test: a brainnode
// built with the chaosbugs tag runs each known bug, and the run must
// report violations; the same binary without a bug chosen must not.
func TestCheckersCatchInjectedBugs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs clusters of real processes; skipped with -short")
	}
	bin := buildBrainnode(t, "chaosbugs")
	run := func(t *testing.T, bug string) *Result {
		cfg := Config{Bin: bin, Out: t.TempDir(), Duration: 12 * time.Second, Seed: 7,
			Faults: []string{"kill", "pause", "kill-tso-leader"}}
		if bug != "" {
			cfg.Env = []string{"BRAIN_INJECT_BUG=" + bug}
		}
		res, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Log(res.Summary())
		return res
	}
	t.Run("none", func(t *testing.T) {
		if res := run(t, ""); len(res.Violations) > 0 {
			t.Errorf("a run without a bug found violations: %s", strings.Join(res.Violations, "\n"))
		}
	})
	for _, bug := range []string{"skip-watch-event", "stale-read", "reuse-revision", "write-below-closed", "lease-keeps-key"} {
		t.Run(bug, func(t *testing.T) {
			res := run(t, bug)
			if len(res.Violations) == 0 {
				t.Fatalf("the checkers missed the injected bug %s", bug)
			}
			t.Logf("first violation: %s", res.Violations[0])
		})
	}
}

// TestReportDirectory checks a run's report: the one-line summary, the
// fault timeline, the history and the nodes' logs.
func TestReportDirectory(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster of real processes; skipped with -short")
	}
	out := t.TempDir()
	res, err := Run(context.Background(), Config{Bin: buildBrainnode(t, ""), Out: out, Duration: 5 * time.Second, Seed: 3,
		Faults: []string{"kill"}, Workloads: []string{"register"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Violations) > 0 {
		t.Errorf("violations: %v", res.Violations)
	}
	for _, name := range []string{"summary.txt", "timeline.txt", "history.json", "violations.txt", "n1.log"} {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil || len(b) == 0 {
			t.Errorf("report file %s: %v (%d bytes)", name, err, len(b))
		}
	}
	b, _ := os.ReadFile(filepath.Join(out, "summary.txt"))
	if !strings.Contains(string(b), "seed=3") || res.Ops == 0 || res.Faults == 0 {
		t.Errorf("summary %q, result %+v", b, res)
	}
	tl, _ := os.ReadFile(filepath.Join(out, "timeline.txt"))
	if !strings.Contains(string(tl), "kill") || !strings.Contains(string(tl), "heal") {
		t.Errorf("timeline without the fault: %s", tl)
	}
}

// TestDiskFaults runs the disk faults alone: a node whose syncs fail or
// whose disk is full must stop itself (fail-stop, not limp on), come back
// after a restart, and the history must stay clean; a stalled disk must
// not break anything either.
func TestDiskFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster of real processes; skipped with -short")
	}
	out := t.TempDir()
	res, err := Run(context.Background(), Config{Bin: buildBrainnode(t, ""), Out: out, Duration: 15 * time.Second, Seed: 11,
		Faults: []string{"disk-fail", "disk-full", "disk-stall"}, Workloads: []string{"register", "kube"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res.Summary())
	if len(res.Violations) > 0 {
		t.Errorf("violations: %s", strings.Join(res.Violations, "\n"))
	}
	tl, _ := os.ReadFile(filepath.Join(out, "timeline.txt"))
	t.Logf("timeline:\n%s", tl)
	for _, want := range []string{"disk-stall", "heal-disk", "it stopped itself"} {
		if !strings.Contains(string(tl), want) {
			t.Errorf("the timeline has no %q: the faults did not take effect", want)
		}
	}
}
