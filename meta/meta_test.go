package meta

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
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

// TestCommandSurvivesLeaderMove: a meta write (an auth change, a lease
// grant, a member record) in flight when the leadership moves gets its
// result once the next leader commits it, not "leader changed": the old
// leader replicated the command, never learned it committed, and lost an
// election to a follower that had it. With a plain Propose the step-down
// failed it, though it applied.
func TestCommandSurvivesLeaderMove(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	tr := raftgroup.NewMemTransport()
	var metas []*Meta
	var groups []*raftgroup.Group
	for id := uint64(1); id <= 3; id++ {
		db, err := engine.Open(engine.Config{Dir: "db", FS: vfs.NewMem(), CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		m, err := New(Config{Logger: logger}, db, id)
		if err != nil {
			t.Fatal(err)
		}
		h, err := raftgroup.NewHost(raftgroup.Config{NodeID: id, TickInterval: 10 * time.Millisecond, Logger: logger}, db, tr.From(id))
		if err != nil {
			t.Fatal(err)
		}
		tr.Register(id, h)
		g, err := h.CreateGroup(2, []uint64{1, 2, 3}, m)
		if err != nil {
			t.Fatal(err)
		}
		m.Bind(g)
		h.Start()
		t.Cleanup(h.Stop)
		metas, groups = append(metas, m), append(groups, g)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	groups[0].Campaign()
	for !metas[0].IsLeader() {
		if ctx.Err() != nil {
			t.Fatal("node 1 never led")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Node 1 hears no append answers: it cannot commit what it proposes.
	// appended closes when node 2 has the command (its answer names an
	// index at or past it).
	var mu sync.Mutex
	var cmdIndex uint64
	sawAppend := false
	appended := make(chan struct{})
	tr.SetFilter(func(from, to uint64, m raftgroup.GroupMessage) bool {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case m.Msg.Type == raftpb.MsgApp && from == 1 && cmdIndex == 0:
			for _, e := range m.Msg.Entries {
				if bytes.Contains(e.Data, []byte(`"n9"`)) {
					cmdIndex = e.Index
				}
			}
		case m.Msg.Type == raftpb.MsgAppResp && to == 1:
			if from == 2 && cmdIndex != 0 && m.Msg.Index >= cmdIndex && !sawAppend {
				sawAppend = true
				close(appended)
			}
			return false
		}
		return true
	})
	errc := make(chan error, 1)
	go func() { errc <- metas[0].SetMember(ctx, Member{ID: 9, Name: "n9"}) }()
	select {
	case <-appended:
	case <-ctx.Done():
		t.Fatal("node 2 never got the command")
	}
	// Node 1 is cut off; node 2 (which has the command) or node 3 is
	// elected and commits it; then node 1 hears the new leader again.
	tr.SetFilter(func(from, to uint64, _ raftgroup.GroupMessage) bool { return from != 1 && to != 1 })
	groups[1].LeaderLost(1)
	groups[2].LeaderLost(1)
	groups[1].Campaign()
	for !metas[1].IsLeader() && !metas[2].IsLeader() {
		if ctx.Err() != nil {
			t.Fatal("nodes 2 and 3 elected no leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	tr.SetFilter(nil)
	if err := <-errc; err != nil {
		t.Fatalf("a command the next leader committed: %v, want its result", err)
	}
	for i, m := range metas[:1] { // the deposed leader applied it
		found := false
		for _, mem := range m.Members() {
			found = found || mem.ID == 9
		}
		if !found {
			t.Errorf("node %d has no member 9 after the command succeeded", i+1)
		}
	}
}
