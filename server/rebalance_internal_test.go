package server

import (
	"testing"

	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/raftgroup"
)

// TestRebalanceStep checks the moves toward the placement over the current
// members, for a partition led by node 1 of members 1..4 (rf 3).
func TestRebalanceStep(t *testing.T) {
	s := &Server{id: &identity{Replicas: 3, MemberID: 1}}
	members := []member{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}}
	// Partition ordinal 2 (group FirstPartition): placement 3, 4, 1.
	id := uint64(kvapi.FirstPartition)
	if got := s.placementVoters(id, members); len(got) != 3 || got[0] != 3 || got[1] != 4 || got[2] != 1 {
		t.Fatalf("placement %v, want [3 4 1]", got)
	}
	for _, tc := range []struct {
		name             string
		voters, learners []uint64
		from, to         uint64
		ok               bool
	}{
		{"at its placement", []uint64{1, 3, 4}, nil, 0, 0, false},
		{"a node joined: move 2's replica to 4", []uint64{1, 2, 3}, nil, 2, 4, true},
		{"the move's learner is there", []uint64{1, 2, 3}, []uint64{4}, 2, 4, true},
		{"promoted, removal left", []uint64{1, 2, 3, 4}, nil, 2, 0, true},
		{"others' replicas first", []uint64{1, 2, 4}, nil, 2, 3, true},
		{"a replica on a node outside", []uint64{2, 3, 4}, nil, 2, 1, true},
		{"the removal of a replica outside", []uint64{1, 3, 4, 2}, nil, 2, 0, true},
		{"repair owns a group short of voters", []uint64{2, 3}, nil, 0, 0, false},
		{"repair owns a foreign learner", []uint64{1, 2, 3}, []uint64{5}, 0, 0, false},
		{"repair owns a learner next to a removed voter", []uint64{1, 3, 5}, []uint64{2}, 0, 0, false},
		{"a member's left-over learner at the placement", []uint64{1, 3, 4}, []uint64{2}, 2, 0, true},
	} {
		st := raftgroup.Status{Voters: tc.voters, Learners: tc.learners}
		from, to, ok := s.rebalanceStep(id, st, members)
		if ok != tc.ok || (ok && (from != tc.from || to != tc.to)) {
			t.Errorf("%s: voters %v learners %v: got (%d, %d, %v), want (%d, %d, %v)", tc.name, tc.voters, tc.learners, from, to, ok, tc.from, tc.to, tc.ok)
		}
	}
	// Partition ordinal 5: placement 2, 3, 4, without the leader (node 1),
	// whose replica moves (it then hands the leadership over).
	pid := uint64(kvapi.FirstPartition + 3)
	if from, to, ok := s.rebalanceStep(pid, raftgroup.Status{Voters: []uint64{1, 2, 3}}, members); !ok || from != 1 || to != 4 {
		t.Errorf("leader outside the placement: got (%d, %d, %v), want (1, 4, true)", from, to, ok)
	}
	if from, to, ok := s.rebalanceStep(pid, raftgroup.Status{Voters: []uint64{1, 2, 3, 4}}, members); !ok || from != 1 || to != 0 {
		t.Errorf("leader outside the placement, promoted: got (%d, %d, %v), want (1, 0, true)", from, to, ok)
	}
	// A cluster whose members never changed is at its placement: nothing
	// moves.
	three := members[:3]
	for i := 0; i < 6; i++ {
		pid := uint64(kvapi.FirstPartition + i)
		cs := initialConf(pid, three, 3, PlacementRing)
		if _, _, ok := s.rebalanceStep(pid, raftgroup.Status{Voters: cs.Voters}, three); ok {
			t.Errorf("partition %d at its initial placement %v would move", pid, cs.Voters)
		}
	}
}
