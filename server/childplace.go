package server

import (
	"cmp"
	"math"
	"slices"

	"github.com/brainkv/brain/cluster"
	"github.com/brainkv/brain/kvapi"
)

// Placing the partitions a load split makes.
//
// A partition's placement is a function of its ID (placeVoters over the
// group's ordinal), and a split's new partition gets the next ID the meta
// group hands out, so without a choice the halves of a hot range land
// wherever the IDs fall. With copysets that decides which copyset carries
// each half, and a leadership moves only among a partition's voters: at 6
// nodes the load of one hot prefix split 57/43 between the two copysets
// (2026-11-28, a bench/scaling.sh hot run), so the busier copyset's
// three nodes capped the cluster while the other's idled.
//
// So the leader of a partition that splits by load picks the new
// partition's placement: the position among the members whose voters
// (the copyset, or the ring's run) carry the least leader load once the
// child's share (half the parent's rate) leaves the parent's leader,
// counting the position's own node (the child's preferred leader) twice,
// as a leader does more for a write than a follower; among equals, the
// parent's own voters (no replica moves), then the less loaded preferred
// leader. Only leader loads are gossiped, and a copyset's voters lead all
// of its partitions, so with copysets the sum is the copyset's load. It asks the meta group for
// an ID whose ordinal falls on that position (AllocPartitionID's
// residue). The rebalancer then moves the child's replicas there and the
// leader balancer its leadership, as for any partition off its
// placement. Splits by size and manual ones take the next ID as before.

// placeChild returns the position (in members, sorted by ID) whose
// placement the new partition of a load split of a partition with voters
// parentVoters should get, given the nodes' leader loads (the parent's
// rate counted at node parentAt) and the new partition's expected rate.
// ok is false when there is no choice to make: one member, or no load
// known anywhere.
func placeChild(members []uint64, loads map[uint64]float64, parentAt uint64, parentVoters []uint64, childRate float64, rf int, scheme string) (pos int, ok bool) {
	n := len(members)
	if n < 2 {
		return 0, false
	}
	adj := make([]float64, n)
	var total float64
	for i, id := range members {
		adj[i] = loads[id]
		if id == parentAt {
			adj[i] = max(0, adj[i]-childRate)
		}
		total += loads[id]
	}
	if total <= 0 {
		return 0, false
	}
	type cand struct {
		pos          int
		score, lead  float64
		parentVoters bool
	}
	var best cand
	for t := range n {
		c := cand{pos: t, score: adj[t], lead: adj[t], parentVoters: true}
		for _, v := range placeVoters(t, n, rf, scheme) {
			c.score += adj[v]
			if !slices.Contains(parentVoters, members[v]) {
				c.parentVoters = false
			}
		}
		if t == 0 || better(c.score, best.score, c.parentVoters, best.parentVoters, c.lead, best.lead) {
			best = c
		}
	}
	return best.pos, true
}

// better orders placeChild's candidates: the lower score (voter load
// plus leader load), then the parent's voters, then the lower leader load
// (earlier positions win ties).
func better(score, bestScore float64, parent, bestParent bool, lead, bestLead float64) bool {
	if score != bestScore {
		return score < bestScore
	}
	if parent != bestParent {
		return parent
	}
	return lead < bestLead
}

// idResidue returns the residue modulo n of the partition IDs whose
// ordinal falls on position pos of n members (groupOrdinal(id) % n ==
// pos), for AllocPartitionID.
func idResidue(pos, n int) (mod, rem uint64) {
	// groupOrdinal(id) = 2 + id - FirstPartition, so id = pos - 2 +
	// FirstPartition modulo n.
	r := (pos - 2 + kvapi.FirstPartition) % n
	if r < 0 {
		r += n
	}
	return uint64(n), uint64(r)
}

// childPlacement returns the ID residue (mod, rem) for the new partition
// of a load split of partition id, which took rate writes/s over the last
// window, with the position it stands for; mod 0 leaves the ID to the
// meta group's sequence (pos -1).
//
// The loads it places by are where the leaderships will be once the
// replica moves under way end, not where they are: a partition split off
// moments ago is still led, unmeasured, by its parent's leader until the
// rebalancer moves it to its placement. Choosing by the gossiped loads
// alone put every child of one hot range on the same idle node (the one
// no child had reached yet), and, once this node counted its own children
// where they were going, other nodes still sent theirs to the copyset
// whose load was on its way. So every node gossips the load it leads that
// is about to leave it, by destination (leadPlan, NodeInfo.Away), and the
// loads here are the gossiped ones with those moves made; this node's own
// from its partitions' rates, with the ones it split this window at their
// expected rates (splitRates).
func (s *Server) childPlacement(id uint64, rate float64) (mod, rem uint64, pos int) {
	members := s.clusterMembers()
	g := s.host.Group(id)
	if len(members) < 2 || g == nil || s.membership == nil {
		return 0, 0, -1
	}
	ids := make([]uint64, len(members))
	for i, m := range members {
		ids[i] = m.ID
	}
	self := s.id.MemberID
	led := s.Leading()
	loads := s.nodeLoads(led).loads
	for node, away := range s.membership.Aways() {
		if node == self {
			continue
		}
		for _, a := range away {
			loads[node] -= a.Rate
			loads[a.Node] += a.Rate
		}
	}
	for node, l := range loads {
		loads[node] = max(0, l)
	}
	loads[self] = 0
	rates, at := s.leadPlan(members, led)
	for p, r := range rates {
		loads[at[p]] += r
	}
	parentAt, ok := at[id]
	if !ok {
		parentAt = self
	}
	pos, ok = placeChild(ids, loads, parentAt, g.Status().Voters, rate/2, s.id.Replicas, s.id.placement())
	if !ok {
		return 0, 0, -1
	}
	mod, rem = idResidue(pos, len(members))
	return mod, rem, pos
}

// leadPlan returns the write rate of each partition among led (this
// node's leaderships) - the last window's, or the rate expected after a
// split this window (splitRates) - and the node that will lead it once
// the replica moves under way end: this one, or for a partition whose
// voters are off its placement its preferred node.
func (s *Server) leadPlan(members []member, led []uint64) (rates map[uint64]float64, at map[uint64]uint64) {
	rates, at = map[uint64]float64{}, map[uint64]uint64{}
	s.load.Lock()
	for _, id := range led {
		if !s.isPartition(id) {
			continue
		}
		r, ok := s.load.splitRates[id]
		if !ok {
			r = s.load.rates[id]
		}
		rates[id] = r
	}
	s.load.Unlock()
	for id := range rates {
		at[id] = s.id.MemberID
		g := s.host.Group(id)
		if g == nil || len(members) == 0 {
			continue
		}
		if offPlacement(g.Status(), s.placementVoters(id, members)) {
			at[id] = preferredLeader(id, members)
		}
	}
	return rates, at
}

// awayLoad returns the load this node leads that will move to other nodes
// (leadPlan), by destination, for gossip.
func (s *Server) awayLoad(led []uint64) []cluster.Away {
	members := s.clusterMembers()
	rates, at := s.leadPlan(members, led)
	by := map[uint64]float64{}
	for id, r := range rates {
		if to := at[id]; to != s.id.MemberID && r > 0 {
			by[to] += r
		}
	}
	out := make([]cluster.Away, 0, len(by))
	for n, r := range by {
		out = append(out, cluster.Away{Node: n, Rate: math.Round(r)})
	}
	slices.SortFunc(out, func(a, b cluster.Away) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// noteSplit records, until the next window's rates replace them, the
// rates a load split of parent (which took rate writes/s) leaves it and
// its new partition child: half each.
func (s *Server) noteSplit(parent, child uint64, rate float64) {
	s.load.Lock()
	defer s.load.Unlock()
	if s.load.splitRates == nil {
		s.load.splitRates = make(map[uint64]float64)
	}
	s.load.splitRates[parent] = rate / 2
	s.load.splitRates[child] = rate / 2
}
