package server_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
)

// TestSecondNodeOnADataDirIsToldItIsLocked: a second node started on a
// running node's data directory, in the same process or in another one,
// fails with "locked" (not the lock call's "resource temporarily
// unavailable"), and its failure does not touch the running node's store.
func TestSecondNodeOnADataDirIsToldItIsLocked(t *testing.T) {
	dir := t.TempDir()
	s := testutil.StartBrain(t, server.Config{DataDir: dir})
	_, err := server.New(server.Config{DataDir: dir, ListenClientURLs: []string{"http://127.0.0.1:0"}, ListenPeerURLs: []string{"http://127.0.0.1:0"}, Logger: testutil.Quiet()})
	if err == nil || !strings.Contains(err.Error(), "locked") || !strings.Contains(err.Error(), "--data-dir") {
		t.Fatalf("second node on one data dir: %v, want a locked error naming --data-dir", err)
	}
	// Another process: the lock call itself fails.
	out, err := exec.Command(brainnodeBinary(t), "--data-dir", dir, "--listen-client-urls", fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t)),
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "locked by another process") {
		t.Fatalf("a second brainnode on one data dir: %v\n%s", err, out)
	}
	cl := testutil.Client(t, testutil.Endpoint(s))
	if _, err := cl.Put(t.Context(), "k", "v"); err != nil {
		t.Fatalf("the first node after the second failed: %v", err)
	}
}

// TestFailedStartOfANewStoreLeavesNoDataDir: a new store whose start fails
// (here: its client port is taken) leaves no data directory behind, or,
// if the directory existed empty (a mount point), leaves it empty; a
// failed start of an existing store keeps it.
func TestFailedStartOfANewStoreLeavesNoDataDir(t *testing.T) {
	busy := testutil.StartBrain(t, server.Config{})
	taken := "http://" + testutil.Endpoint(busy)
	cfgFor := func(dir string) server.Config {
		return server.Config{DataDir: dir, ListenClientURLs: []string{taken}, ListenPeerURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))}, Logger: testutil.Quiet()}
	}
	missing := filepath.Join(t.TempDir(), "new")
	if _, err := server.New(cfgFor(missing)); err == nil {
		t.Fatal("started on a taken port")
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Fatalf("a failed start left the new data dir: %v", err)
	}
	empty := t.TempDir()
	if _, err := server.New(cfgFor(empty)); err == nil {
		t.Fatal("started on a taken port")
	}
	if names, err := os.ReadDir(empty); err != nil || len(names) != 0 {
		t.Fatalf("a failed start in an empty data dir left %v (%v)", names, err)
	}
	// An existing store survives a failed start.
	existing := t.TempDir()
	s := testutil.StartBrain(t, server.Config{DataDir: existing})
	s.Stop()
	before, _ := os.ReadDir(existing)
	if _, err := server.New(cfgFor(existing)); err == nil {
		t.Fatal("started on a taken port")
	}
	after, err := os.ReadDir(existing)
	if err != nil || len(after) != len(before) || len(after) == 0 {
		t.Fatalf("a failed start of an existing store changed its data dir: %v -> %v (%v)", before, after, err)
	}
}

// TestJoinToNothingFailsFast: --join naming an address nothing listens on
// fails within seconds, saying so, and leaves no data directory.
func TestJoinToNothingFailsFast(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "joiner")
	peer := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePortPair(t))
	dead := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))
	start := time.Now()
	_, err := server.New(server.Config{Name: "joiner", DataDir: dir, ListenPeerURLs: []string{peer}, InitialAdvertisePeerURLs: []string{peer},
		ListenClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))}, Join: dead, Logger: testutil.Quiet()})
	if err == nil || !strings.Contains(err.Error(), "no member answers at "+dead) {
		t.Fatalf("join to nothing: %v", err)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("join to nothing failed after %v", took)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("a failed join left its data dir: %v", err)
	}
}
