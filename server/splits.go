package server

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/raftgroup"
)

// The partition map and splits on a node.
//
// The map is the initial partitions (the cluster's split points) with the
// split records replayed over them: the meta group's (every node has a
// meta replica) and those of this node's own partition replicas, which
// may be ahead of the meta group's (a partition's leader records its
// splits there right after it split, or later: reportSplits). Records of
// one parent come in the parent's order in both; a record waits until
// its parent is in the map.
//
// A split applies on every replica of the parent; each creates the
// child's replica from the state the split wrote (createSplitChild). A
// node whose replica of the parent has not applied the split yet refuses
// to create the child from the child's raft messages (newReplica): the
// parent's replica would later apply writes to the child's keys below
// what the child's snapshot brought.

// initialRoutes returns the partitions as the cluster was created, by ID.
func (s *Server) initialRoutes() map[uint64]*kvapi.Route {
	bounds := append([]string{""}, s.id.SplitPoints...)
	routes := make(map[uint64]*kvapi.Route)
	for i, start := range bounds {
		rt := &kvapi.Route{ID: uint64(kvapi.FirstPartition + i), Start: []byte(start)}
		if i+1 < len(bounds) {
			rt.End = []byte(bounds[i+1])
		}
		routes[rt.ID] = rt
	}
	return routes
}

// partitionMap computes the partition map.
func (s *Server) partitionMap() []kvapi.Route {
	routes := s.initialRoutes()
	pending := s.meta.Splits()
	s.partsMu.Lock()
	for _, p := range s.parts {
		if !p.Initialized() {
			continue
		}
		for _, r := range p.Splits() {
			pending = append(pending, meta.Split{Parent: p.ID(), Child: r.Child, Key: r.Key})
		}
	}
	s.partsMu.Unlock()
	for progress := true; progress; {
		progress = false
		rest := pending[:0]
		for _, sp := range pending {
			if routes[sp.Child] != nil {
				continue // applied (a record appears in meta and locally)
			}
			parent := routes[sp.Parent]
			if parent == nil {
				rest = append(rest, sp) // its parent is a later record's child
				continue
			}
			if bytes.Compare(sp.Key, parent.Start) <= 0 || len(parent.End) != 0 && bytes.Compare(sp.Key, parent.End) >= 0 {
				s.log.Error("split record outside its parent's span; ignored", "parent", sp.Parent, "child", sp.Child, "key", fmt.Sprintf("%q", sp.Key))
				continue
			}
			routes[sp.Child] = &kvapi.Route{ID: sp.Child, Start: sp.Key, End: parent.End}
			parent.End = sp.Key
			progress = true
		}
		pending = rest
	}
	out := make([]kvapi.Route, 0, len(routes))
	for _, rt := range routes {
		out = append(out, *rt)
	}
	return out
}

// kickRoutes asks the route refresher to recompute the map.
func (s *Server) kickRoutes() {
	select {
	case s.routesKick <- struct{}{}:
	default:
	}
}

// refreshRoutes recomputes the partition map when kicked (and now and
// then) and installs it in the store until the node stops.
func (s *Server) refreshRoutes() {
	s.every(time.Second, s.routesKick, s.installRoutes)
}

func (s *Server) installRoutes() {
	s.routesMu.Lock()
	defer s.routesMu.Unlock()
	routes := s.partitionMap()
	if sameRoutes(routes, s.store.Routes()) {
		return
	}
	if err := s.store.SetRoutes(routes); err != nil {
		s.log.Error("partition map does not cover the keyspace; keeping the previous one", "err", err)
		return
	}
	s.log.Info("partition map changed", "partitions", len(routes))
}

func sameRoutes(a, b []kvapi.Route) bool {
	if len(a) != len(b) {
		return false
	}
	m := make(map[uint64]kvapi.Route, len(a))
	for _, r := range a {
		m[r.ID] = r
	}
	for _, r := range b {
		x, ok := m[r.ID]
		if !ok || !bytes.Equal(x.Start, r.Start) || !bytes.Equal(x.End, r.End) {
			return false
		}
	}
	return true
}

// onSplit runs on the raft worker after partition parent split here.
func (s *Server) onSplit(parent uint64, rec partition.SplitRecord) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.createSplitChild(parent, rec.Child)
		s.kickRoutes()
	}()
}

// createSplitChild opens the replica of child that parent's split created
// here.
func (s *Server) createSplitChild(parent, child uint64) {
	select {
	case <-s.stopc:
		return
	default:
	}
	s.partsMu.Lock()
	if s.parts[child] != nil {
		s.partsMu.Unlock()
		return // created from a message first (newReplica)
	}
	p, err := s.newPartition(child, nil, nil)
	if err != nil {
		s.partsMu.Unlock()
		s.log.Error("opening a split's new partition", "parent", parent, "child", child, "err", err)
		return
	}
	s.parts[child] = p
	s.partsMu.Unlock()
	// Not under partsMu: newReplica takes it under the host's lock. If a
	// message created the group meanwhile, newReplica gave it this p.
	g, err := s.host.CreateGroupConf(child, nil, p)
	if err == nil {
		p.Bind(g)
	} else if g = s.host.Group(child); g == nil {
		s.log.Error("creating a split's new group", "parent", parent, "child", child, "err", err)
		return
	}
	s.store.SetLocal(child, p)
	// The parent's leader leads the child first, to spare the child an
	// election timeout. Its first campaigns may find followers that have
	// not applied the split yet (they drop the child's messages): try
	// again until the child has a leader.
	if pg := s.host.Group(parent); pg != nil && pg.Status().IsLeader {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for i := 0; i < 40 && g.Status().Lead == 0; i++ {
				g.Campaign()
				select {
				case <-s.stopc:
					return
				case <-time.After(25 * time.Millisecond):
				}
			}
		}()
	}
	s.log.Info("split created a partition", "parent", parent, "child", child)
}

// splitChildAllowed reports whether a replica of partition id may be
// created here from a raft message (under the host's lock): if the split
// that made it left its state here, or if the partition map knows it and
// no replica here overlaps it or lacks its span yet (see the file
// comment).
func (s *Server) splitChildAllowed(id uint64) bool {
	if id < meta.FirstAllocatedPartition {
		return true // an initial partition
	}
	if has, err := raftgroup.HasState(s.db, id); err == nil && has {
		return true
	}
	var rt *kvapi.Route
	for _, r := range s.partitionMap() {
		if r.ID == id {
			rt = &r
			break
		}
	}
	if rt == nil {
		return false
	}
	s.partsMu.Lock()
	for _, p := range s.parts {
		if !p.Initialized() {
			s.partsMu.Unlock()
			return false
		}
	}
	s.partsMu.Unlock()
	return !s.overlapsReplica(id, rt.Start, rt.End)
}

// overlapsReplica reports whether an initialized replica here other than
// partition id's overlaps [start, end) (end empty: unbounded).
func (s *Server) overlapsReplica(id uint64, start, end []byte) bool {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	for pid, p := range s.parts {
		if pid == id || !p.Initialized() {
			continue
		}
		ps, pe := p.Span()
		if (len(end) == 0 || bytes.Compare(ps, end) < 0) && (len(pe) == 0 || bytes.Compare(start, pe) < 0) {
			return true
		}
	}
	return false
}

// reportSplits records the splits of the partitions this node leads that
// the meta group lacks, until the node stops.
func (s *Server) reportSplits() {
	s.every(time.Second, nil, func() {
		for _, p := range s.servingPartitions() {
			if len(p.Splits()) == 0 || !p.IsLeader() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.store.ReportSplits(ctx, p); err != nil {
				s.log.Warn("recording splits in the partition map failed; will retry", "partition", p.ID(), "err", err)
			}
			cancel()
		}
	})
}

// minLoadSplitKeys is the fewest keys a partition splits by load with:
// the load of fewer is too concentrated to spread by splitting.
const minLoadSplitKeys = 64

// defaultLocalSplitKeys is the most keys a partition that splits by load or size
// may hold for its new half to be placed anywhere (childPlacement, by the
// counts of split partitions per node). A larger one's half keeps the
// parent's voters, and only its leadership moves: a half placed on other
// nodes moves there one replica at a time, each a snapshot of its whole
// state. In a 6-node run of the one-prefix benchmark, two partitions of
// about 10000 keys split by load in the measured window and their halves
// went to the other copyset: six 13 MB snapshots took 20 s, and the
// cluster's rate fell from about 1500 creates/s to 581-753 while they
// ran. Small partitions (the first splits of a hot range) still spread
// over the copysets by count, where a move is cheap; later the busiest
// node evens out the copysets' loads by a split across placements
// (splitAcross), which moves one half, measured by load, at a time. Tests
// set another (Config.TestingLocalSplitKeys).
const defaultLocalSplitKeys = 4096

// keepVoters returns the voters a split of p (by load or size) should
// give its new half: p's, if p holds more than defaultLocalSplitKeys keys
// (or Config.TestingLocalSplitKeys); nil (anywhere) otherwise.
func (s *Server) keepVoters(p *partition.Partition) []uint64 {
	if p.Keys() <= s.cfg.TestingLocalSplitKeys {
		return nil
	}
	g := s.host.Group(p.ID())
	if g == nil {
		return nil
	}
	return g.Status().Voters
}

// splitDriver splits the partitions this node led through the last
// window that grew past --split-keys or took more than --split-write-rate
// writes per second over it, until the node stops.
//
// It also measures each led partition's write rate over the window for
// the leader balancer (loadbalance.go).
func (s *Server) splitDriver() {
	// The partitions this node led at the end of the last window: only
	// those it led through a whole window have a rate. One it got
	// during the window counted its writes since then only, and that
	// low rate made the node a load move had just reached hand the
	// partition straight back (see pickLeader); it is unmeasured
	// (ownLoad) until the next window.
	ledBefore := map[uint64]bool{}
	s.every(s.cfg.SplitWindow, nil, func() {
		var led []ledWindow
		rates := map[uint64]float64{}
		ledNow := map[uint64]bool{}
		for _, p := range s.servingPartitions() {
			// Every replica's window restarts, so a follower that leads
			// again later does not count writes of an earlier leadership.
			writes, hot := p.TakeLoad()
			if p.IsLeader() {
				ledNow[p.ID()] = true
				if ledBefore[p.ID()] {
					led = append(led, ledWindow{p, writes, hot})
					rates[p.ID()] = float64(writes) / s.cfg.SplitWindow.Seconds()
				}
			}
		}
		ledBefore = ledNow
		s.setLeaderRates(rates)
		unsplittable := true
		for _, w := range led {
			if w.splittable() && rates[w.p.ID()] >= s.cfg.SplitWriteRate/4 {
				unsplittable = false
			}
		}
		s.load.Lock()
		s.load.unsplittable = unsplittable
		s.load.Unlock()
		split := false
		for _, w := range led {
			p, writes, hot := w.p, w.writes, w.hot
			var key []byte
			var reason string
			switch rate := rates[p.ID()]; {
			case s.cfg.SplitKeys > 0 && p.Keys() > s.cfg.SplitKeys:
				key, reason = p.MedianKey(), "size"
			case s.cfg.SplitWriteRate > 0 && rate > s.cfg.SplitWriteRate && p.Keys() >= minLoadSplitKeys:
				key, reason = hot, "load"
			}
			if key == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			parent, child, err := s.store.SplitPlaced(ctx, key, s.childPlacement(0, s.keepVoters(p)))
			cancel()
			if err != nil {
				s.log.Warn("automatic split failed", "partition", p.ID(), "reason", reason, "key", fmt.Sprintf("%q", key), "err", err)
				continue
			}
			split = true
			s.load.Lock()
			s.load.lastSplit = time.Now()
			s.load.Unlock()
			s.splits.WithLabelValues(reason).Inc()
			s.log.Info("automatic split", "partition", parent, "child", child, "reason", reason, "key", fmt.Sprintf("%q", key), "writes", writes, "keys", p.Keys())
		}
		if split {
			s.load.confirmBalanceSplit(0, 0, 0, 0, 0)
			return
		}
		s.splitForBalanceOnce(led)
	})
}

// splitForBalanceOnce is one window's split for balance (loadbalance.go),
// given the partitions this node led through it and their sampled keys.
func (s *Server) splitForBalanceOnce(led []ledWindow) {
	if s.cfg.SplitWriteRate <= 0 || s.membership == nil {
		// Off, or a single node: no other node to move a half to.
		return
	}
	s.load.Lock()
	cooldown := balanceSplitCooldown * s.cfg.SplitWindow
	recentMove := time.Since(s.load.lastMove) < cooldown || time.Since(s.load.lastSplit) < cooldown
	s.load.Unlock()
	view := s.nodeLoads(s.Leading())
	if recentMove || view.unsettled[s.id.MemberID] {
		// The loads do not show the last move yet.
		s.load.confirmBalanceSplit(0, 0, 0, 0, 0)
		return
	}
	members := s.memberIDs()
	var parts []ledPartition
	hot := map[uint64][]byte{}
	for _, w := range led {
		g := s.host.Group(w.p.ID())
		if g == nil || !w.splittable() {
			continue
		}
		st := g.Status()
		cands, ok := s.leaderCandidates(w.p.ID(), st, members)
		if !st.IsLeader || !ok {
			continue
		}
		var far []uint64
		for _, m := range members {
			if !slices.Contains(st.Voters, m) && s.alive(m) {
				far = append(far, m)
			}
		}
		parts = append(parts, ledPartition{id: w.p.ID(), rate: float64(w.writes) / s.cfg.SplitWindow.Seconds(), candidates: cands, far: far})
		hot[w.p.ID()] = w.hot
	}
	self := s.id.MemberID
	id, to := splitForBalance(self, parts, view, s.cfg.SplitWriteRate/4)
	if !s.load.confirmBalanceSplit(id, to, view.windows[self], view.windows[to], view.loads[self]) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	parent, child, err := s.store.SplitPlaced(ctx, hot[id], s.childPlacement(to, nil))
	cancel()
	if err != nil {
		s.log.Warn("split for balance failed", "partition", id, "key", fmt.Sprintf("%q", hot[id]), "err", err)
		return
	}
	s.load.Lock()
	s.load.lastSplit = time.Now()
	s.load.Unlock()
	reason := "balance"
	if i := slices.IndexFunc(parts, func(p ledPartition) bool { return p.id == id }); i >= 0 && slices.Contains(parts[i].far, to) {
		reason = "across" // the half goes to another placement
	}
	s.splits.WithLabelValues(reason).Inc()
	s.log.Info("automatic split", "partition", parent, "child", child, "reason", reason, "key", fmt.Sprintf("%q", hot[id]),
		"to", to, "load", view.loads[s.id.MemberID], "loads", view.loads)
}

// ledWindow is a partition this node led through a whole split window: the
// writes its leader evaluated and the middle of the keys they wrote.
type ledWindow struct {
	p      *partition.Partition
	writes int64
	hot    []byte
}

// splittable reports whether a split for balance could split w's
// partition: its writes left a middle key, and it has enough keys.
func (w ledWindow) splittable() bool { return w.hot != nil && w.p.Keys() >= minLoadSplitKeys }

// Split splits the partition holding key at key (see kvapi.Store.Split).
func (s *Server) Split(ctx context.Context, key []byte) (parent, child uint64, err error) {
	parent, child, err = s.store.SplitPlaced(ctx, key, s.childPlacement(0, nil))
	if err == nil {
		s.splits.WithLabelValues("manual").Inc()
	}
	return parent, child, err
}
