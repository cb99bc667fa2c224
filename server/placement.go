package server

import (
	"context"
	"slices"
	"time"

	"github.com/brainkv/brain/raftgroup"

	"github.com/brainkv/brain/kvapi"
	"go.etcd.io/raft/v3/raftpb"
)

// Initial placement.
//
// Every node computes the same placement from the initial members (sorted
// by ID): group k (the TSO is 0, the meta group 1, partition i is 2+i) has
// the rf members starting at member k mod n as voters, and the first of them
// as its preferred leader, so leaders start spread over the nodes and every
// node takes writes. The TSO and meta groups also have every other member
// as a learner, so every node reads leases, the compaction revision and
// alarms locally.

// groupOrdinal is a group's position in the placement rotation.
func groupOrdinal(id uint64) int {
	switch id {
	case kvapi.TSOGroup:
		return 0
	case kvapi.MetaGroup:
		return 1
	}
	return 2 + int(id-kvapi.FirstPartition)
}

// initialConf returns group id's initial configuration.
func initialConf(id uint64, members []member, rf int) raftpb.ConfState {
	n := len(members)
	rf = min(rf, n)
	start := groupOrdinal(id) % n
	var cs raftpb.ConfState
	in := map[uint64]bool{}
	for i := 0; i < rf; i++ {
		m := members[(start+i)%n].ID
		cs.Voters = append(cs.Voters, m)
		in[m] = true
	}
	if id == kvapi.TSOGroup || id == kvapi.MetaGroup {
		for _, m := range members {
			if !in[m.ID] {
				cs.Learners = append(cs.Learners, m.ID)
			}
		}
	}
	return cs
}

// preferredLeader returns group id's preferred leader.
func preferredLeader(id uint64, members []member) uint64 {
	return members[groupOrdinal(id)%len(members)].ID
}

func hosts(cs raftpb.ConfState, node uint64) bool {
	for _, v := range append(append([]uint64(nil), cs.Voters...), cs.Learners...) {
		if v == node {
			return true
		}
	}
	return false
}

// balanceLeaders hands each group this node leads to its preferred leader
// when that node is alive and a voter, so leaders stay spread over the
// cluster after failovers.
func (s *Server) balanceLeaders() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.LeaderBalanceInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopc:
			return
		case <-t.C:
		}
		for _, id := range s.groupIDs() {
			g := s.host.Group(id)
			if g == nil {
				continue
			}
			st := g.Status()
			pref := preferredLeader(id, s.id.Members)
			if !st.IsLeader || !st.LeaderReady || pref == s.id.MemberID || !s.membership.Alive(pref) || !slices.Contains(s.memberIDs(), pref) {
				continue
			}
			// Gossip takes seconds to notice a dead node; raft knows within
			// an election timeout whether pref still answers. A transfer to
			// a dead node would pause the group's writes for nothing.
			if slices.Contains(st.Voters, pref) && slices.Contains(st.Active, pref) {
				s.transferLeadership(g, pref)
			}
		}
	}
}

// transferLeadership hands group g's leadership to node to. The TSO leader
// first stops issuing and shrinks its window, so a planned move skips no
// revisions; if the move does not happen, it issues again.
func (s *Server) transferLeadership(g *raftgroup.Group, to uint64) {
	s.log.Info("transferring leadership to the preferred node", "group", g.ID(), "to", formatID(to))
	// The leader first stops taking revisions and lets the ones it took
	// finish, so a planned transfer leaves no gap in the revisions and
	// fails no client's request.
	var d drainer = s.oracle
	if g.ID() != kvapi.TSOGroup {
		p := s.store.Local(g.ID())
		if p == nil {
			g.TransferLeadership(to)
			return
		}
		d = p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := d.PrepareTransfer(ctx); err != nil {
		s.log.Warn("not transferring leadership", "group", g.ID(), "err", err)
		return
	}
	g.TransferLeadership(to)
	// A transfer takes an election round; past that, serve again.
	deadline := time.Now().Add(s.cfg.ElectionTimeout)
	for time.Now().Before(deadline) && g.Status().IsLeader {
		time.Sleep(10 * time.Millisecond)
	}
	if st := g.Status(); st.IsLeader {
		s.log.Warn("leadership transfer did not happen; serving again", "group", g.ID(), "to", formatID(to))
		d.Resume()
	}
}

// drainer is a group's state machine that can ready a planned leadership
// transfer (the TSO and partitions).
type drainer interface {
	PrepareTransfer(ctx context.Context) error
	Resume()
}
