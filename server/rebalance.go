package server

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/brainkv/brain/raftgroup"
	"go.etcd.io/raft/v3/raftpb"
)

// Rebalancing.
//
// The placement of a partition is initialConf over the current members
// (sorted by ID), under the cluster's placement scheme: the same rule that placed it when the
// cluster was created, so a cluster whose members never changed never
// moves a replica. When members change (a node joins or is removed), the
// placement of some partitions changes, and each partition's leader moves
// its replicas there, one single-step conf change at a time (MoveReplica:
// add the new replica as a learner, promote it once caught up, remove the
// old one). Leadership then follows: balanceLeaders hands a partition to
// the first node of its placement. So a node that joins receives its share
// of replicas and leaderships, and the writes it leads, within a few
// rebalance intervals.
//
// Rebalancing waits while any member is down: the dead-node repair
// (repairGroup) owns the replicas then, and moving data onto or off a
// node that is about to come back would be wasted. A partition's leader
// acts only after two consecutive checks saw the same difference, so a
// manual move (brainnode move-replica) is visible for at least one
// interval before the placement restores it. Every node is the leader of
// some partitions and rebalances only those; moves of different
// partitions proceed in parallel, at most one per node at a time.

// placementVoters returns the voters the placement wants for partition id.
func (s *Server) placementVoters(id uint64, members []member) []uint64 {
	return initialConf(id, members, s.id.Replicas, s.id.placement()).Voters
}

// preferredLeaderOf returns the node that should lead group id: for a
// partition the first node of its placement over the current members; for
// the TSO and meta groups, whose voters never move, the initial one.
func (s *Server) preferredLeaderOf(id uint64) uint64 {
	if allMembersGroup(id) {
		return preferredLeader(id, s.id.Members)
	}
	return preferredLeader(id, s.clusterMembers())
}

// rebalanceReplicas runs the rebalancing loop until the node stops.
func (s *Server) rebalanceReplicas() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.RebalanceInterval)
	defer t.Stop()
	seen := map[uint64]string{} // group -> the difference seen last time
	for {
		select {
		case <-s.stopc:
			return
		case <-t.C:
		}
		members := s.clusterMembers()
		moving := s.countOffPlacement(members)
		s.offPlacement.Set(float64(moving))
		s.load.Lock()
		s.load.moving = moving
		s.load.Unlock()
		if !s.allMembersUp(members) {
			clear(seen)
			continue
		}
		for _, id := range s.groupIDs() {
			if allMembersGroup(id) {
				continue
			}
			g := s.host.Group(id)
			if g == nil {
				delete(seen, id)
				continue
			}
			st := g.Status()
			if !st.IsLeader || !st.LeaderReady {
				delete(seen, id)
				continue
			}
			from, to, ok := s.rebalanceStep(id, st, members)
			if !ok {
				delete(seen, id)
				continue
			}
			diff := formatID(from) + ">" + formatID(to)
			if seen[id] != diff {
				seen[id] = diff // act only if the next check sees it too
				continue
			}
			delete(seen, id)
			s.rebalance(g, st, from, to)
			break // one move per node and interval
		}
	}
}

// countOffPlacement returns how many of the partitions this node leads
// have voters other than their placement's, or learners.
func (s *Server) countOffPlacement(members []member) int {
	n := 0
	for _, id := range s.groupIDs() {
		if allMembersGroup(id) {
			continue
		}
		g := s.host.Group(id)
		if g == nil {
			continue
		}
		st := g.Status()
		if st.IsLeader && offPlacement(st, s.placementVoters(id, members)) {
			n++
		}
	}
	return n
}

// offPlacement reports whether a partition with status st is not at its
// placement want: other voters, or learners (a move under way).
func offPlacement(st raftgroup.Status, want []uint64) bool {
	return len(st.Learners) > 0 || len(st.Voters) != len(want) ||
		slices.ContainsFunc(st.Voters, func(v uint64) bool { return !slices.Contains(want, v) })
}

// allMembersUp reports whether every member is alive as far as gossip
// knows.
func (s *Server) allMembersUp(members []member) bool {
	for _, m := range members {
		if !s.alive(m.ID) || (s.membership != nil && s.membership.DownFor(m.ID) > 0) {
			return false
		}
	}
	return true
}

// rebalanceStep returns the next replica move of partition id toward its
// placement: from a voter outside the placement to a placement node that
// is not a voter (to is 0 when only the removal of from is left: a move
// was interrupted after the promotion, or from is a left-over learner).
// ok is false if the group is at its placement or is changing in a way
// repair owns (fewer voters than the replication factor, or a learner
// outside the placement on a removed node or next to a removed voter).
func (s *Server) rebalanceStep(id uint64, st raftgroup.Status, members []member) (from, to uint64, ok bool) {
	want := s.placementVoters(id, members)
	rf := len(want)
	isMember := func(n uint64) bool { return slices.ContainsFunc(members, func(m member) bool { return m.ID == n }) }
	for _, l := range st.Learners {
		if slices.Contains(want, l) {
			continue
		}
		// A member's learner outside the placement, while every voter is
		// a member (so repair has no voter to replace), is left over: a
		// move that stopped half way, or the learner a split's new
		// partition took over from a move of its parent. Nothing else
		// would ever remove it (a hot run's child kept one for minutes).
		if isMember(l) && !slices.ContainsFunc(st.Voters, func(v uint64) bool { return !isMember(v) }) {
			return l, 0, true
		}
		return 0, 0, false
	}
	outside := slices.DeleteFunc(slices.Clone(st.Voters), func(n uint64) bool { return slices.Contains(want, n) })
	if len(outside) == 0 {
		return 0, 0, false
	}
	// Move other nodes' replicas first: moving the leader's own hands the
	// leadership over.
	from = outside[0]
	if from == s.id.MemberID && len(outside) > 1 {
		from = outside[1]
	}
	switch {
	case len(st.Voters) > rf:
		return from, 0, true
	case len(st.Voters) < rf:
		return 0, 0, false
	}
	to = firstOf(want, func(n uint64) bool { return !slices.Contains(st.Voters, n) })
	return from, to, to != 0
}

// rebalance makes one step of a move of g's replica from node from to node
// to (to 0: only remove from).
func (s *Server) rebalance(g *raftgroup.Group, st raftgroup.Status, from, to uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if to == 0 {
		if from == s.id.MemberID {
			// Hand the leadership to a voter of the placement first; it
			// removes this replica.
			if n := firstOf(st.Voters, func(n uint64) bool { return n != from && slices.Contains(st.Active, n) }); n != 0 {
				s.transferLeadership(g, n, "rebalance")
			}
			return
		}
		s.log.Info("rebalancing: removing a replica outside the placement", "group", g.ID(), "node", formatID(from), "voters", formatIDs(st.Voters))
		err := g.ProposeConfChange(ctx, raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode, NodeID: from}}})
		if err != nil {
			s.log.Warn("rebalancing: removal failed; retrying later", "group", g.ID(), "err", err)
		}
		return
	}
	s.log.Info("rebalancing: moving a replica to its placement", "group", g.ID(), "from", formatID(from), "to", formatID(to), "voters", formatIDs(st.Voters))
	if err := s.MoveReplica(ctx, g.ID(), from, to); err != nil && !errors.Is(err, ErrMoveLeaderHandedOff) {
		s.log.Warn("rebalancing: move failed; retrying later", "group", g.ID(), "from", formatID(from), "to", formatID(to), "err", err)
	}
}
