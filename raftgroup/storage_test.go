package raftgroup

import (
	"testing"

	"github.com/brainkv/brain/engine"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// TestLoadAfterSnapshotWithoutHardState: a replica killed after installing
// a snapshot but before saving the hard state that came with it holds a
// commit index (and term) below the snapshot's. Loading must lift them to
// the snapshot (it is committed by definition); raft refuses to start
// otherwise ("state.commit is out of range", seen in a chaos run).
func TestLoadAfterSnapshotWithoutHardState(t *testing.T) {
	db, err := engine.Open(engine.Config{Dir: "db", FS: vfs.NewMem(), CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const group = 7
	b := db.NewBatch()
	if err := writeBootstrap(b, group, raftpb.ConfState{Voters: []uint64{1, 2, 3}}); err != nil {
		t.Fatal(err)
	}
	// What installing a snapshot at index 100, term 4 persists, with the
	// hard state still from before it.
	if err := setProto(b, raftKey(group, kindHardState), &raftpb.HardState{Term: 2, Vote: 3, Commit: 40}); err != nil {
		t.Fatal(err)
	}
	if err := setTruncated(b, group, 100, 4); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(nil); err != nil {
		t.Fatal(err)
	}
	st, err := loadState(db, group)
	if err != nil {
		t.Fatal(err)
	}
	if st.hard.Commit != 100 || st.hard.Term != 4 || st.hard.Vote != 0 {
		t.Fatalf("loaded hard state %+v, want commit 100, term 4, no vote", st.hard)
	}
	ms, err := newMemoryStorage(st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: ms, MaxInflightMsgs: 16, Applied: st.applied}); err != nil {
		t.Fatal(err)
	}
}
