package meta

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestProposalRaftRefusesIsNotLeader: a replica that believes it leads
// (its leadership was lost, or is being handed over, and the news has not
// reached it) proposes; raft refuses the proposal. Every meta write must
// then fail with ErrNotLeader, the error its callers retry on the leader:
// the command did not execute. Raft's own error escaped before; the
// gateway read it as the not-leader answer of whatever group the caller
// was working on, and a split whose recording in the partition map failed
// this way was tried again, and refused, as its key was a boundary by then.
func TestProposalRaftRefusesIsNotLeader(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	db, err := engine.Open(engine.Config{Dir: "db", FS: vfs.NewMem(), CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m, err := New(Config{Logger: logger}, db, 1)
	if err != nil {
		t.Fatal(err)
	}
	h, err := raftgroup.NewHost(raftgroup.Config{NodeID: 1, TickInterval: 10 * time.Millisecond, Logger: logger}, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Two of the three voters never answer: this replica never leads.
	g, err := h.CreateGroup(2, []uint64{1, 2, 3}, m)
	if err != nil {
		t.Fatal(err)
	}
	m.Bind(g)
	h.Start()
	defer h.Stop()
	m.LeadershipChanged(true, 5)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, write := range map[string]func() error{
		"RecordSplits": func() error { return m.RecordSplits(ctx, []Split{{Parent: 100, Child: 101, Key: []byte("k")}}) },
		"AllocPartitionID": func() error {
			_, err := m.AllocPartitionID(ctx)
			return err
		},
		"SetMember": func() error { return m.SetMember(ctx, Member{ID: 9, Name: "n9"}) },
		"Revoke":    func() error { return m.propose(ctx, cmdRevokeStart, 7) },
	} {
		if err := write(); !errors.Is(err, ErrNotLeader) {
			t.Errorf("%s through a replica raft does not let lead: %v, want %v", name, err, ErrNotLeader)
		}
	}
}
