package server

import (
	"time"

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
			if !st.IsLeader || !st.LeaderReady || pref == s.id.MemberID || !s.membership.Alive(pref) {
				continue
			}
			for _, v := range st.Voters {
				if v == pref {
					s.log.Info("transferring leadership to the preferred node", "group", id, "to", formatID(pref))
					g.TransferLeadership(pref)
					break
				}
			}
		}
	}
}
