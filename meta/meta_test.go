package meta

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
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
	// Two of the three voters never answer: this replica never leads.
	m, stop := startReplica(t, vfs.NewMem(), []uint64{1, 2, 3})
	defer stop()
	m.LeadershipChanged(true, 5)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, write := range map[string]func() error{
		"RecordSplits": func() error { return m.RecordSplits(ctx, []Split{{Parent: 100, Child: 101, Key: []byte("k")}}) },
		"AllocPartitionID": func() error {
			_, err := m.AllocPartitionID(ctx, 0, 0)
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

// TestAllocPartitionIDResidue: an allocation with a residue gets the
// lowest unused ID congruent to it, skips the IDs below it for good, and
// one without a residue goes on from there; the allocations survive a
// restart of the replica (the next ID is in the database).
func TestAllocPartitionIDResidue(t *testing.T) {
	for _, c := range []struct{ next, mod, rem, want uint64 }{
		{65536, 0, 0, 65536}, {65536, 1, 0, 65536}, {65536, 6, 4, 65536},
		{65536, 6, 5, 65537}, {65536, 6, 3, 65541}, {65536, 6, 9, 65541},
		{7, 3, 1, 7}, {8, 3, 1, 10},
	} {
		if got := nextCongruent(c.next, c.mod, c.rem); got != c.want || (c.mod > 1 && got%c.mod != c.rem%c.mod) {
			t.Errorf("nextCongruent(%d, %d, %d) = %d, want %d", c.next, c.mod, c.rem, got, c.want)
		}
	}

	fs := vfs.NewMem()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	run := func(allocs [][2]uint64) []uint64 {
		m, stop := startReplica(t, fs, []uint64{1})
		defer stop()
		var ids []uint64
		for _, a := range allocs {
			for {
				id, err := m.AllocPartitionID(ctx, a[0], a[1])
				if errors.Is(err, ErrNotLeader) && ctx.Err() == nil {
					time.Sleep(10 * time.Millisecond) // not elected yet
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
				break
			}
		}
		return ids
	}
	got := run([][2]uint64{{0, 0}, {6, 3}, {0, 0}, {6, 3}})
	want := []uint64{FirstAllocatedPartition, FirstAllocatedPartition + 5, FirstAllocatedPartition + 6, FirstAllocatedPartition + 11}
	if !slices.Equal(got, want) {
		t.Fatalf("allocated %v, want %v", got, want)
	}
	if got := run([][2]uint64{{0, 0}, {4, 0}}); !slices.Equal(got, []uint64{FirstAllocatedPartition + 12, FirstAllocatedPartition + 16}) {
		t.Fatalf("after a restart allocated %v, want %v", got, []uint64{FirstAllocatedPartition + 12, FirstAllocatedPartition + 16})
	}
}

// startReplica starts node 1's replica of a meta group with voters on a
// database in fs; stop stops it and closes the database.
func startReplica(t *testing.T, fs vfs.FS, voters []uint64) (m *Meta, stop func()) {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	db, err := engine.Open(engine.Config{Dir: "db", FS: fs, CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	m, err = New(Config{Logger: logger}, db, 1)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	h, err := raftgroup.NewHost(raftgroup.Config{NodeID: 1, TickInterval: 10 * time.Millisecond, Logger: logger}, db, nil)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	g, err := h.CreateGroup(2, voters, m)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	m.Bind(g)
	h.Start()
	return m, func() {
		h.Stop()
		db.Close()
	}
}
