package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/brainkv/brain/raftgroup"
	"go.etcd.io/raft/v3/raftpb"
)

// Manual replica moves (brainnode move-replica).

// ErrMoveLeaderHandedOff is MoveReplica's answer when the replica to move
// was the leader's own: it handed the leadership to the new replica, which
// finishes the move when asked again.
var ErrMoveLeaderHandedOff = errors.New("the leader was the replica to move: it handed leadership to the new replica; ask the new leader to finish")

// errNotGroupLeader: MoveReplica runs on the group's leader.
type errNotGroupLeader struct {
	group, leader uint64
}

func (e errNotGroupLeader) Error() string {
	return fmt.Sprintf("this node does not lead group %d (leader: %s)", e.group, formatID(e.leader))
}

// MoveReplica moves partition id's replica from node from to node to, in
// single-step conf changes on the group's leader (this node): to joins as
// a learner, is promoted once it has caught up, and from is removed (its
// node then deletes the replica). Raft keeps a quorum throughout, and
// reads, writes and watches go on. If from is this node, it first hands
// leadership to to and returns ErrMoveLeaderHandedOff; the move is
// idempotent, so asking the new leader finishes it.
func (s *Server) MoveReplica(ctx context.Context, id, from, to uint64) error {
	g := s.host.Group(id)
	if g == nil {
		return fmt.Errorf("group %d has no replica on this node", id)
	}
	st := g.Status()
	switch {
	case !st.IsLeader:
		return errNotGroupLeader{id, st.Lead}
	case allMembersGroup(id):
		return fmt.Errorf("group %d has a replica on every member; only partitions move", id)
	case from == to:
		return fmt.Errorf("from and to are the same node")
	case slices.Contains(st.Voters, to) && !slices.Contains(st.Voters, from) && !slices.Contains(st.Learners, from):
		return nil // done already
	case !slices.Contains(st.Voters, from):
		return fmt.Errorf("%s is not a voter of group %d (voters %s)", formatID(from), id, formatIDs(st.Voters))
	case !slices.Contains(s.memberIDs(), to):
		return fmt.Errorf("%s is not a member", formatID(to))
	case !s.alive(to):
		return fmt.Errorf("%s is not alive", formatID(to))
	}
	change := func(t raftpb.ConfChangeType, node uint64, why string) error {
		s.log.Info("moving a replica", "group", id, "change", t.String(), "node", formatID(node), "step", why)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err := g.ProposeConfChange(cctx, raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: t, NodeID: node}}})
		if errors.Is(err, raftgroup.ErrNotLeader) || errors.Is(err, raftgroup.ErrLeaderChanged) {
			// Leadership moved under the move (the leader balancer, an
			// election): the caller asks the new leader to go on.
			return errNotGroupLeader{id, g.Status().Lead}
		}
		return err
	}
	if !slices.Contains(st.Voters, to) {
		if !slices.Contains(st.Learners, to) {
			if err := change(raftpb.ConfChangeAddLearnerNode, to, "add the new replica as a learner"); err != nil {
				return err
			}
		}
		if err := s.waitCaughtUp(ctx, g, to); err != nil {
			return err
		}
		if err := change(raftpb.ConfChangeAddNode, to, "promote the caught-up learner"); err != nil {
			return err
		}
	}
	if from == s.id.MemberID {
		s.transferLeadership(g, to, "replica move")
		return ErrMoveLeaderHandedOff
	}
	return change(raftpb.ConfChangeRemoveNode, from, "remove the old replica")
}

// waitCaughtUp waits until learner n of g trails the commit index by at
// most caughtUpSlack entries (a snapshot brings a new replica most of the
// way), while this node leads g.
func (s *Server) waitCaughtUp(ctx context.Context, g *raftgroup.Group, n uint64) error {
	err := g.WaitCaughtUp(ctx, n, caughtUpSlack)
	switch {
	case errors.Is(err, raftgroup.ErrNotLeader):
		return errNotGroupLeader{g.ID(), g.Status().Lead}
	case err != nil:
		return fmt.Errorf("the new replica on %s did not catch up: %w", formatID(n), err)
	}
	return nil
}

func formatIDs(ids []uint64) string {
	out := "["
	for i, id := range ids {
		if i > 0 {
			out += " "
		}
		out += formatID(id)
	}
	return out + "]"
}
