package server

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/raftgroup"
	"go.etcd.io/raft/v3/raftpb"
)

// Initial placement.
//
// Every node computes the same placement from the initial members (sorted
// by ID): group k (the TSO is 0, the meta group 1, partition i is 2+i) is
// led by member k mod n (its preferred leader), so leaders start spread
// over the nodes and every node takes writes. Its other voters depend on
// the cluster's placement scheme (fixed when the cluster is created):
//
//   - ring: the rf-1 members after the leader, wrapping around. Each node
//     shares groups with 2(rf-1) others.
//   - copysets (the default): the members are cut into copysets, runs of
//     rf consecutive members (the last run also takes the n mod rf left
//     over, so it has rf to 2rf-1), and a group's voters are the leader
//     and the rf-1 members after it within the leader's copyset. With n a
//     multiple of rf every group's voters are exactly one copyset, so a
//     node shares groups, and exchanges raft messages, with rf-1 others
//     however large the cluster is: a 6-node cluster's raft traffic is
//     that of two 3-node clusters. A node that sends every round's
//     appends, answers and heartbeats to 4 peers instead of 2 pays for
//     twice the messages, each carrying half the groups (the cost that
//     grew the most from 3 to 6 nodes in the scaling benchmark). The
//     scheme is from Cidon et al., "Copysets: Reducing the Frequency of
//     Data Loss in Cloud Storage" (USENIX ATC 2013): losing rf nodes at
//     once loses quorum of some group only if they share a copyset. Below
//     2rf members there is one copyset, which is the ring.
//
// Every node leads and holds the same number of groups either way (up to
// the rounding of k mod n). The TSO and meta groups also have every other
// member as a learner, so every node reads leases, the compaction revision
// and alarms locally.

// Placement schemes (Config.Placement).
const (
	PlacementCopysets = "copysets"
	PlacementRing     = "ring"
)

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

// placeVoters returns the positions (in the sorted members) of the voters
// of the group with ordinal ord over n members, the preferred leader
// first.
func placeVoters(ord, n, rf int, scheme string) []int {
	rf = min(rf, n)
	lead := ord % n
	lo, size := 0, n // the leader's copyset: positions lo..lo+size-1
	if scheme == PlacementCopysets && rf > 0 && n >= 2*rf {
		sets := n / rf
		c := min(lead/rf, sets-1)
		lo, size = c*rf, rf
		if c == sets-1 {
			size = n - lo
		}
	}
	out := make([]int, rf)
	for i := range out {
		out[i] = lo + (lead-lo+i)%size
	}
	return out
}

// initialConf returns group id's configuration over members (sorted by
// ID) under the placement scheme.
func initialConf(id uint64, members []member, rf int, scheme string) raftpb.ConfState {
	var cs raftpb.ConfState
	in := map[uint64]bool{}
	for _, i := range placeVoters(groupOrdinal(id), len(members), rf, scheme) {
		cs.Voters = append(cs.Voters, members[i].ID)
		in[members[i].ID] = true
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
// (preferredLeaderOf) when that node is alive and a voter, so leaders stay
// spread over the cluster after failovers and reach nodes that joined;
// partitions' leaderships also move by load (loadbalance.go).
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
		s.balanceLeadersOnce()
	}
}

// balanceLeadersOnce is one round of balanceLeaders.
func (s *Server) balanceLeadersOnce() {
	view := s.nodeLoads(s.Leading())
	s.load.nextRound()
	s.load.Lock()
	byLoad := time.Since(s.load.lastMove) > 2*s.cfg.SplitWindow
	s.load.Unlock()
	// The busiest partitions first: the first load move is the largest
	// one that evens the loads out.
	ids := s.groupIDs()
	rates := make(map[uint64]float64, len(ids))
	measured := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		rates[id], measured[id] = s.leaderRate(id)
	}
	slices.SortStableFunc(ids, func(a, b uint64) int { return cmp.Compare(rates[b], rates[a]) })
	members := s.memberIDs()
	for _, id := range ids {
		g := s.host.Group(id)
		if g == nil {
			continue
		}
		st := g.Status()
		if !st.IsLeader || !st.LeaderReady {
			continue
		}
		candidates, ok := s.leaderCandidates(id, st, members)
		if !ok {
			continue
		}
		pref := s.preferredLeaderOf(id)
		if allMembersGroup(id) {
			// No partition writes: only the preferred node counts.
			if pref != s.id.MemberID && slices.Contains(candidates, pref) {
				s.balanceTransfers.WithLabelValues("preferred").Inc()
				s.transferLeadership(g, pref, "preferred")
			}
			continue
		}
		to, forLoad := s.load.decide(s.id.MemberID, id, pref, rates[id], measured[id], view, candidates, byLoad)
		if to == 0 {
			continue
		}
		why := "preferred"
		if forLoad {
			why = "load"
			s.log.Info("moving a partition's leadership for load", "group", id, "to", formatID(to),
				"writes_per_second", rates[id], "load", view.loads[s.id.MemberID], "target_load", view.loads[to])
			byLoad = false
			s.load.Lock()
			s.load.lastMove = time.Now()
			s.load.Unlock()
		} else {
			s.log.Info("handing a partition's leadership to its preferred node", "group", id, "to", formatID(to),
				"writes_per_second", rates[id], "load", view.loads[s.id.MemberID], "target_load", view.loads[to],
				"recent", view.recentOf(s.id.MemberID), "target_recent", view.recentOf(to))
		}
		s.balanceTransfers.WithLabelValues(why).Inc()
		s.transferLeadership(g, to, why)
		if !g.Status().IsLeader {
			view.moved(s.id.MemberID, to, rates[id], s.load.remembered(id, rates[id]))
		}
	}
}

// leaderCandidates returns the voters that group id's leadership, which
// this node holds (status st), can move to, of the current members; false
// if it stays for now: a group whose replicas are changing (a move or
// repair: more voters than the replication factor, or partition learners)
// keeps its leader, which may have been handed over so that the preferred
// node's replica can be removed.
func (s *Server) leaderCandidates(id uint64, st raftgroup.Status, members []uint64) ([]uint64, bool) {
	if len(st.Voters) > min(s.id.Replicas, len(members)) || (len(st.Learners) > 0 && !allMembersGroup(id)) {
		return nil, false
	}
	// Gossip takes seconds to notice a dead node; raft knows within an
	// election timeout whether a voter still answers. A transfer to a
	// dead node would pause the group's writes for nothing.
	var candidates []uint64
	for _, v := range st.Voters {
		if v != s.id.MemberID && slices.Contains(st.Active, v) && s.membership.Alive(v) && slices.Contains(members, v) {
			candidates = append(candidates, v)
		}
	}
	return candidates, true
}

// transferLeadership hands group g's leadership to node to, for the reason
// why (logged: operator, preferred, load, rebalance, replica move, removed
// member). The TSO leader
// first stops issuing and shrinks its window, so a planned move skips no
// revisions; if the move does not happen, it issues again. The error says
// why the leadership stayed here; nil means this replica no longer leads
// (the leadership moved, or was lost meanwhile).
func (s *Server) transferLeadership(g *raftgroup.Group, to uint64, why string) error {
	// One transfer of a group at a time on this node (the balancer, the
	// replica repair and operators may ask at once): a second one's Resume
	// would let the group take revisions while the first is still moving.
	mu := s.transferLock(g.ID())
	mu.Lock()
	defer mu.Unlock()
	if !g.Status().IsLeader {
		return nil
	}
	// Raft hands leadership only to a target with the leader's whole
	// log; it catches a lagging one up first, the group's writes paused
	// (drained, below) all that time, and gives up after an election
	// timeout if the target does not answer: a starved node did not, and
	// a hot partition's writes stopped for 1.4 s for nothing (twice at
	// once in one scaling benchmark run). So the target must have the log
	// up to the commit index before the writes stop; else the leadership
	// stays (the balancer asks again next round).
	cctx, ccancel := context.WithTimeout(context.Background(), s.cfg.ElectionTimeout)
	err := g.WaitCaughtUp(cctx, to, 0)
	ccancel()
	if err != nil {
		s.log.Warn("not transferring leadership: the target trails the log", "group", g.ID(), "to", formatID(to), "err", err)
		if errors.Is(err, raftgroup.ErrNotLeader) {
			return nil
		}
		return fmt.Errorf("%w: the target did not catch up with the log in %v", errTransferNotDone, s.cfg.ElectionTimeout)
	}
	s.log.Info("transferring leadership", "group", g.ID(), "to", formatID(to), "why", why)
	// The leader first stops taking revisions and lets the ones it took
	// finish, so a planned transfer leaves no gap in the revisions and
	// fails no client's request. The meta group, and a partition replica
	// that does not serve here yet, take no revisions: nothing to drain.
	var d drainer
	term := g.Status().Term
	if g.ID() == kvapi.TSOGroup {
		d = s.oracle
	} else if p := s.store.Local(g.ID()); p != nil {
		d = p
	}
	if d != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if term, err = d.PrepareTransfer(ctx); err != nil {
			s.log.Warn("not transferring leadership", "group", g.ID(), "err", err)
			return fmt.Errorf("%w: draining the leader: %v", errTransferNotDone, err)
		}
	}
	// Only the leadership of the term that was readied moves: a replica
	// that lost it meanwhile must not have raft forward the transfer to a
	// leader that took revisions. Serve again only once raft has refused
	// the transfer or given it up (it aborts after an election timeout),
	// never while raft may still start or run it: a leader serving while
	// its transfer is pending has its proposals dropped, and a write's
	// revision with them. Callers (transfer-leader) learn the outcome from
	// the group's status once this returns.
	wait := 10 * s.cfg.ElectionTimeout
	tctx, tcancel := context.WithTimeout(context.Background(), wait)
	started, err := g.StartTransfer(tctx, to, term)
	tcancel()
	if err != nil {
		s.log.Warn("leadership transfer not started in time", "group", g.ID(), "to", formatID(to), "err", err)
	}
	for start, seen := time.Now(), false; started; {
		st := g.Status()
		if !st.IsLeader || st.Term != term {
			return nil
		}
		// The status published before raft started the transfer shows
		// none: only one that showed it and no longer does is an abort.
		if st.LeadTransferee != 0 {
			seen = true
		} else if seen {
			break
		}
		if time.Since(start) > wait {
			s.log.Warn("leadership transfer still pending; serving again", "group", g.ID(), "to", formatID(to))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := g.Status(); !st.IsLeader || st.Term != term {
		return nil
	}
	s.log.Warn("leadership transfer did not happen; serving again", "group", g.ID(), "to", formatID(to))
	if d != nil {
		d.Resume()
	}
	if !started {
		return fmt.Errorf("%w: raft did not start it", errTransferNotDone)
	}
	return fmt.Errorf("%w: raft gave it up (the target did not answer in time)", errTransferNotDone)
}

// errTransferNotDone is transferLeadership's error: the leadership stayed.
var errTransferNotDone = errors.New("the leadership transfer did not happen")

// transferLock returns the lock that serializes group id's transfers.
func (s *Server) transferLock(id uint64) *sync.Mutex {
	s.transfers.Lock()
	defer s.transfers.Unlock()
	if s.transfers.m == nil {
		s.transfers.m = make(map[uint64]*sync.Mutex)
	}
	mu := s.transfers.m[id]
	if mu == nil {
		mu = &sync.Mutex{}
		s.transfers.m[id] = mu
	}
	return mu
}

// drainer is a group's state machine that can ready a planned leadership
// transfer (the TSO and partitions).
type drainer interface {
	PrepareTransfer(ctx context.Context) (term uint64, err error)
	Resume()
}

// childPlacement is how a split chooses its new partition's ID, and with
// it the partition's placement and preferred leader (placeVoters): IDs
// handed out in sequence gave consecutive halves of a hot range runs of
// the same copyset (rf at a time), and at 6 nodes the one-prefix
// benchmark's split partitions fell 7 to 5 or 7 to 4 on the two copysets,
// which no leadership move can even out. The new partition prefers, in
// order:
//
//   - prefer, if not 0 (the node a split for balance hands the half to);
//   - a live node;
//   - if keep is not empty, a placement whose voters are all in keep
//     (the parent's voters: see keepVoters);
//   - the node fewest split partitions prefer, so they spread over the
//     nodes by count;
//   - the placement whose nodes hold the fewest replicas of split
//     partitions (with copysets, the copyset with the fewest);
//   - a placement with the parent's preferred node among its voters (with
//     copysets, the parent's copyset: its replicas need not move).
//
// Split partitions are those a split created and those that split (and
// parent): the busy or large ones, since splits happen by load and by
// size. The initial partitions that never split are spread by the
// placement rotation already, and counting them as the same weight as a
// hot range's halves would put halves of one range on the same node.
func (s *Server) childPlacement(prefer uint64, keep []uint64) kvapi.ChildRank {
	return func(parent uint64) (func(uint64) int, int) {
		members := s.clusterMembers()
		return childRanks(members, s.id.Replicas, s.id.placement(), s.splitPartitions(parent), parent, prefer, keep, s.alive)
	}
}

// splitPartitions returns parent and the partitions that a split
// created or that split, each once, read from this node's routes: they
// have every split this node made (Split returns once they do), where the
// local meta replica may not have applied the records of the last ones
// yet (missing them put two halves of a range on the same node). A
// partition split if a split created it (it is not an initial one) or its
// range ends before its initial one did.
func (s *Server) splitPartitions(parent uint64) []uint64 {
	initial := s.initialRoutes()
	ids := []uint64{parent}
	for _, rt := range s.store.Routes() {
		if rt.ID == parent {
			continue
		}
		if in := initial[rt.ID]; in == nil || !bytes.Equal(rt.End, in.End) {
			ids = append(ids, rt.ID)
		}
	}
	return ids
}

// childRanks ranks candidate IDs for a new partition of a split of
// parent (see childPlacement), given the members (sorted by ID), the
// replication factor and placement scheme, the partitions to spread it
// among (split partitions: see childPlacement), the preferred node (0:
// none), the nodes the new partition's voters should be among (nil: any)
// and which nodes are up (nil: all). It returns the ranking (lower is
// better) and the best rank.
func childRanks(members []member, rf int, scheme string, partitions []uint64, parent, prefer uint64, keep []uint64, alive func(uint64) bool) (func(uint64) int, int) {
	n := len(members)
	if n < 2 {
		return func(uint64) int { return 0 }, 0
	}
	leads := make([]int, n)    // partitions preferring each position
	replicas := make([]int, n) // partitions placed on each position
	for _, id := range partitions {
		if allMembersGroup(id) {
			continue
		}
		ord := groupOrdinal(id)
		leads[ord%n]++
		for _, v := range placeVoters(ord, n, rf, scheme) {
			replicas[v]++
		}
	}
	parentLead := groupOrdinal(parent) % n
	// Every criterion's weight exceeds the sum of all below it, so ranks
	// compare the criteria in order.
	const wParent = 1
	wReplicas := 2 * wParent
	wLead := wReplicas * (rf*len(partitions) + 1)
	wKeep := wLead * (len(partitions) + 1)
	wAlive := 2 * wKeep
	wPrefer := 2 * wAlive
	ranks := make([]int, n)
	best := -1
	for pos, m := range members {
		voters := placeVoters(pos, n, rf, scheme)
		r := wLead * leads[pos]
		for _, v := range voters {
			r += wReplicas * replicas[v]
		}
		if !slices.Contains(voters, parentLead) {
			r += wParent
		}
		if len(keep) > 0 && slices.ContainsFunc(voters, func(v int) bool { return !slices.Contains(keep, members[v].ID) }) {
			r += wKeep
		}
		if alive != nil && !alive(m.ID) {
			r += wAlive
		}
		if prefer != 0 && m.ID != prefer {
			r += wPrefer
		}
		ranks[pos] = r
		if best < 0 || r < best {
			best = r
		}
	}
	return func(id uint64) int { return ranks[groupOrdinal(id)%n] }, best
}
