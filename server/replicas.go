package server

import (
	"context"
	"slices"
	"time"

	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/raftgroup"
	"go.etcd.io/raft/v3/raftpb"
)

// This node's replicas over time.
//
// Raft is the truth for each group's replicas. A node opens the groups it
// has raft state for; on a new store it bootstraps those the initial
// placement gives it. A replica added to this node later is created when
// the group's leader first sends it a message (newReplica) and serves once
// a snapshot gave it its state. A replica this node no longer belongs to
// (it applied its own removal, or the leader says it is not a member) is
// removed and its state deleted.
//
// Leaders repair their groups (repairGroup): a voter whose node gossip has
// considered dead for longer than --dead-node-timeout is replaced, when an
// alive node without a replica exists, in single-step conf changes: add
// that node as a learner, promote it once it caught up, then drop the dead
// voter (partitions) or demote it to a learner (the TSO and meta groups,
// which every node follows). Members with no TSO or meta replica (a node
// that joined) get a learner. A group with fewer voters than
// min(--replicas, members) and no dead one (a single node that others
// joined) grows the same way: a learner is added, then promoted.

// removalGrace lets requests already reading a replica that is being
// removed finish before its state is deleted.
const removalGrace = 2 * time.Second

// bootConf returns group id's initial configuration if this node must
// bootstrap it (a new store whose initial placement includes it), else nil.
func (s *Server) bootConf(id uint64) *raftpb.ConfState {
	if s.id.Bootstrapped || id >= meta.FirstAllocatedPartition {
		return nil
	}
	cs := initialConf(id, s.id.Members, s.id.Replicas, s.id.placement())
	if !hosts(cs, s.id.MemberID) {
		return nil
	}
	return &cs
}

// newPartition creates this node's replica of partition id. A nil span
// means the persisted one, or none yet (a replica being added).
func (s *Server) newPartition(id uint64, start, end []byte) (*partition.Partition, error) {
	fc := &forwardCloser{id: id}
	if s.store != nil {
		fc.f = s.store.ForwardClose(id)
	} else {
		s.closeFwd = append(s.closeFwd, fc)
	}
	return partition.New(partition.Config{
		ID: id, Start: start, End: end,
		DB: s.db, Revisions: s.tso, Leases: s.meta, Metrics: s.pm, Logger: s.log,
		ForwardClose: fc.forward,
		OnSplit:      func(rec partition.SplitRecord) { s.onSplit(id, rec) },
		// A replica that leads has heard a leader: it serves now, not at
		// the next replica check (a leader that does not serve stalls the
		// partition's writes until then).
		OnLeader: func() { s.serveIfReady(id) },
		Overlaps: s.overlapsReplica,
	})
}

// isPartition reports whether id is one of the cluster's partitions.
func (s *Server) isPartition(id uint64) bool {
	if id < meta.FirstAllocatedPartition {
		return id >= kvapi.FirstPartition && id <= kvapi.FirstPartition+uint64(len(s.id.SplitPoints))
	}
	return true
}

// newReplica is the raftgroup factory for a replica a leader adds here.
// It runs under the host's lock.
func (s *Server) newReplica(group uint64) (raftgroup.StateMachine, error) {
	select {
	case <-s.stopc:
		return nil, nil
	default:
	}
	switch {
	case group == kvapi.TSOGroup:
		return s.oracle, nil
	case group == kvapi.MetaGroup:
		return s.meta, nil
	case !s.isPartition(group) || s.store == nil || !s.splitChildAllowed(group):
		return nil, nil
	}
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	if p := s.parts[group]; p != nil {
		return p, nil
	}
	p, err := s.newPartition(group, nil, nil)
	if err != nil {
		return nil, err
	}
	s.parts[group] = p
	s.log.Info("adding a replica to this node", "group", group)
	return p, nil
}

// servingPartitions returns this node's initialized partition replicas.
func (s *Server) servingPartitions() []*partition.Partition {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	var out []*partition.Partition
	for _, p := range s.parts {
		if p.Initialized() {
			out = append(out, p)
		}
	}
	return out
}

// manageReplicas runs the replica lifecycle until the node stops.
func (s *Server) manageReplicas() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ReplicaCheckInterval)
	defer t.Stop()
	leaderless := map[uint64]time.Time{}
	learnerChecked := map[uint64]time.Time{}
	named := s.id.JoinedAt == 0
	for {
		select {
		case <-s.stopc:
			return
		case <-t.C:
		}
		if !named {
			named = s.recordName()
		}
		if s.removedSelf() {
			s.markRemoved()
		}
		for _, id := range s.groupIDs() {
			g := s.host.Group(id)
			if g == nil {
				delete(leaderless, id)
				continue
			}
			st := g.Status()
			if st.Lead != 0 {
				s.serveIfReady(id)
			}
			initialized := len(st.Voters) > 0
			if initialized && !slices.Contains(st.Voters, s.id.MemberID) && !slices.Contains(st.Learners, s.id.MemberID) {
				s.removeReplica(id, "this node applied its removal from the group")
				continue
			}
			if slices.Contains(st.Learners, s.id.MemberID) {
				// A learner never campaigns, so one dropped from its group
				// may keep naming its old leader: ask now and then.
				if since, ok := learnerChecked[id]; !ok || time.Since(since) > 5*s.cfg.ElectionTimeout {
					learnerChecked[id] = time.Now()
					if ok {
						s.checkMembership(id)
					}
				}
			}
			if st.Lead != 0 {
				delete(leaderless, id)
			} else if since, ok := leaderless[id]; !ok {
				leaderless[id] = time.Now()
			} else if time.Since(since) > 3*s.cfg.ElectionTimeout {
				leaderless[id] = time.Now()
				s.checkMembership(id)
			}
			if st.IsLeader && st.LeaderReady {
				s.repairGroup(g, st)
			}
		}
	}
}

// recordName puts the name of a node that joined into its member record
// (MemberAdd knows only its peer URLs), as etcd does when a member starts.
func (s *Server) recordName() bool {
	for _, m := range s.meta.Members() {
		if m.ID == s.id.MemberID && m.Name == s.id.Name {
			return true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.store.SetMember(ctx, meta.Member{ID: s.id.MemberID, Name: s.id.Name, PeerURLs: s.id.PeerURLs})
	return err == nil
}

// serveIfReady makes a partition replica serve once it has its state (an
// added replica) and has heard a leader since this node started (a replica
// may have been replaced while the node was down).
func (s *Server) serveIfReady(id uint64) {
	// Under partsMu, so a replica removeReplica took out of parts is not
	// made to serve again.
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	p := s.parts[id]
	if p != nil && p.Initialized() && s.store.Local(id) == nil {
		s.store.SetLocal(id, p)
		s.log.Info("added replica serves", "group", id, "closed", p.Closed())
	}
}

// checkMembership asks group id's leader whether this node still belongs
// to the group (a replica that hears no leader may have been removed while
// its node was down), and removes the replica if not.
func (s *Server) checkMembership(id uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := s.store.GroupInfo(ctx, id)
	if err != nil || info.Leader == s.id.MemberID {
		return
	}
	if !slices.Contains(info.Voters, s.id.MemberID) && !slices.Contains(info.Learners, s.id.MemberID) {
		s.removeReplica(id, "the group's leader does not list this node")
	}
}

// markRemoved closes Removed: this member was removed from the cluster.
func (s *Server) markRemoved() {
	s.removedOnce.Do(func() {
		s.log.Warn("this member was removed from the cluster; stopping")
		// Recorded, so that a restart on this store does not come back
		// as the member (its meta replica, which says so, is deleted).
		id := *s.id // s.id is read without locks: saved as a copy
		id.Removed = true
		if err := s.persistIdentity(&id); err != nil {
			s.log.Error("could not record the removal in the store", "err", err)
		}
		close(s.removed)
	})
}

// removeReplica stops serving group id here and deletes its state.
func (s *Server) removeReplica(id uint64, why string) {
	s.log.Info("removing this node's replica", "group", id, "reason", why)
	if id == kvapi.MetaGroup {
		// Only a removed member loses its meta replica; it may be dropped
		// before it applied its own removal record.
		s.markRemoved()
	}
	s.partsMu.Lock()
	p := s.parts[id]
	delete(s.parts, id)
	s.partsMu.Unlock()
	grace := time.Duration(0)
	if p != nil {
		s.store.SetLocal(id, nil)
		p.Close()
		grace = removalGrace
	}
	// The replica's raft stops at once; its state goes after the grace.
	if err := s.host.RemoveGroupAfter(id, grace, s.stopc); err != nil {
		s.log.Error("removing a replica", "group", id, "err", err)
	}
}

// allMembersGroup reports whether every member has a replica of group id
// (voter or learner).
func allMembersGroup(id uint64) bool { return id == kvapi.TSOGroup || id == kvapi.MetaGroup }

// caughtUpSlack is how far (in log entries) a learner may trail the commit
// index and still be promoted.
const caughtUpSlack = 256

// repairGroup, on group g's ready leader, makes at most one conf change
// toward the wanted configuration (see the file comment).
func (s *Server) repairGroup(g *raftgroup.Group, st raftgroup.Status) {
	members := s.memberIDs()
	dead := func(n uint64) bool {
		return n != s.id.MemberID && (!slices.Contains(members, n) || s.membership.DownFor(n) > s.cfg.DeadNodeTimeout)
	}
	alive := func(n uint64) bool { return n == s.id.MemberID || s.membership.Alive(n) }
	isReplica := func(n uint64) bool { return slices.Contains(st.Voters, n) || slices.Contains(st.Learners, n) }
	rf := min(s.id.Replicas, len(members))
	if !slices.Contains(members, s.id.MemberID) {
		// This node was removed: a member's replica must lead (and drop
		// this one).
		if to := firstOf(st.Voters, func(n uint64) bool { return slices.Contains(members, n) && alive(n) }); to != 0 {
			s.transferLeadership(g, to, "removed member")
		}
		return
	}

	var change raftpb.ConfChangeSingle
	var why string
	deadVoters := slices.DeleteFunc(slices.Clone(st.Voters), func(n uint64) bool { return !dead(n) })
	switch {
	case allMembersGroup(g.ID()) && firstOf(members, func(n uint64) bool { return !isReplica(n) && alive(n) }) != 0:
		n := firstOf(members, func(n uint64) bool { return !isReplica(n) && alive(n) })
		change, why = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: n}, "member has no replica"
	case len(st.Voters) > rf && len(deadVoters) > 0:
		if allMembersGroup(g.ID()) && slices.Contains(members, deadVoters[0]) {
			change, why = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: deadVoters[0]}, "demote the dead voter it replaced"
		} else {
			change, why = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: deadVoters[0]}, "remove the dead voter it replaced"
		}
	case len(deadVoters) > 0:
		// A caught-up learner on an alive node replaces a dead voter.
		if l := firstOf(st.Learners, func(n uint64) bool {
			return !dead(n) && alive(n) && st.CaughtUp(n, caughtUpSlack)
		}); l != 0 {
			change, why = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddNode, NodeID: l}, "promote a caught-up learner to replace a dead voter"
			break
		}
		if firstOf(st.Learners, func(n uint64) bool { return !dead(n) && alive(n) }) != 0 {
			return // a learner is catching up
		}
		if n := s.pickNewReplica(g.ID(), members, isReplica, alive); n != 0 {
			change, why = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: n}, "add a learner to replace a dead voter"
		}
	case len(st.Voters) < rf:
		// Fewer voters than the replication factor and none dead: the
		// cluster grew past the members the group was created on (a
		// single node joined by others) or a removed member's voter was
		// dropped. A caught-up learner becomes a voter; else a partition
		// gets a learner (the TSO and meta groups have one on every
		// member already).
		if l := firstOf(st.Learners, func(n uint64) bool {
			return slices.Contains(members, n) && alive(n) && st.CaughtUp(n, caughtUpSlack)
		}); l != 0 {
			change, why = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddNode, NodeID: l}, "promote a caught-up learner: fewer voters than replicas"
			break
		}
		if allMembersGroup(g.ID()) || firstOf(st.Learners, func(n uint64) bool { return !dead(n) && alive(n) }) != 0 {
			return // a learner is catching up
		}
		if n := s.pickNewReplica(g.ID(), members, isReplica, alive); n != 0 {
			change, why = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: n}, "add a learner: fewer voters than replicas"
		}
	case !allMembersGroup(g.ID()):
		// Learners of partitions exist only while replacing a voter.
		if l := firstOf(st.Learners, dead); l != 0 {
			change, why = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: l}, "remove a dead learner"
		}
	default:
		// The TSO and meta groups keep a learner on every member, and on
		// no removed one.
		if l := firstOf(st.Learners, func(n uint64) bool { return !slices.Contains(members, n) }); l != 0 {
			change, why = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: l}, "remove a removed member's learner"
		}
	}
	if why == "" {
		return
	}
	s.log.Info("changing a group's replicas", "group", g.ID(), "change", change.Type.String(), "node", formatID(change.NodeID), "reason", why,
		"voters", st.Voters, "learners", st.Learners)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.ProposeConfChange(ctx, raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{change}}); err != nil {
		s.log.Warn("conf change failed; retrying later", "group", g.ID(), "err", err)
	}
}

// pickNewReplica chooses the alive member without a replica of group id
// that the group's placement over the current members includes (so
// rebalancing has nothing to undo), else the one that hosts the fewest
// replicas known to this node, or 0.
func (s *Server) pickNewReplica(id uint64, members []uint64, isReplica, alive func(uint64) bool) uint64 {
	usable := func(n uint64) bool { return !isReplica(n) && alive(n) && s.membership.DownFor(n) == 0 }
	if !allMembersGroup(id) {
		if n := firstOf(s.placementVoters(id, s.clusterMembers()), usable); n != 0 {
			return n
		}
	}
	load := map[uint64]int{}
	for _, id := range s.groupIDs() {
		if g := s.host.Group(id); g != nil {
			st := g.Status()
			for _, v := range st.Voters {
				load[v]++
			}
		}
	}
	best := uint64(0)
	for _, n := range members {
		if !usable(n) {
			continue
		}
		if best == 0 || load[n] < load[best] {
			best = n
		}
	}
	return best
}

func firstOf(ns []uint64, f func(uint64) bool) uint64 {
	for _, n := range ns {
		if f(n) {
			return n
		}
	}
	return 0
}
