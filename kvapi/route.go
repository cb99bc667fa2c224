package kvapi

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/brainkv/brain/partition"
)

// Raft group IDs.
const (
	// TSOGroup is the revision oracle's group.
	TSOGroup = 1
	// MetaGroup is the meta group's.
	MetaGroup = 2
	// FirstPartition is the first partition's; partition i is FirstPartition+i.
	FirstPartition = 100
)

// attemptTimeout bounds one attempt of a quick idempotent call (quickOp),
// so a call to a node that stopped answering is retried at the group's new
// leader; longer calls rely on their deadlines and on keepalive (see
// rpccodec.PeerKeepaliveTime) to break such connections.
const attemptTimeout = time.Second

func quickOp(op Op) bool {
	switch op {
	case OpTSONext, OpTSOCurrent, OpRequestClose, OpMetaReadIndex, OpMetaRenew, OpMetaTimeToLive:
		return true
	}
	return false
}

// requestTimeout bounds how long a request waits for a group to have a
// reachable leader (an election takes about a second).
const requestTimeout = 7 * time.Second

// ErrNoLeader: no leader could be reached in time.
var ErrNoLeader = errors.New("kvapi: no leader reachable")

// hints remembers the leaders other nodes named in NotLeader answers.
type hints struct {
	mu sync.Mutex
	m  map[uint64]uint64 // group -> node; protected by mu
}

func (h *hints) get(group uint64) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.m[group]
}

func (h *hints) set(group, node uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[uint64]uint64)
	}
	if node == 0 {
		delete(h.m, group)
	} else {
		h.m[group] = node
	}
}

// leaderOf returns the node to send group's leader-only requests to.
func (s *Store) leaderOf(group uint64) uint64 {
	if l := s.hints.get(group); l != 0 {
		return l
	}
	if s.leaderHint != nil {
		return s.leaderHint(group)
	}
	return 0
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func isNotLeader(err error) bool {
	code, _ := toCode(err)
	return code == codeNotLeader
}

// call runs a leader-only operation on group: locally when local (may be
// nil) reports it can serve, otherwise on the leader's node. Only answers
// that prove the request was not executed (NotLeader, or a node that could
// not be reached when idempotent is set) are retried.
func (s *Store) call(ctx context.Context, group uint64, op Op, idempotent bool, local func() (bool, error), args func() ([]byte, error), decode func([]byte) error) error {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var enc []byte
	// Why the last attempt was retried, for the log line of a call that
	// gives up: the node it went to (0: none known) and its answer.
	var lastNode uint64
	lastWhy := "no leader known"
	start := time.Now()
	giveUp := func() error {
		if err := parent.Err(); err != nil {
			// The caller stopped waiting (its deadline passed, perhaps
			// while this node was paused): answer that, etcd's "request
			// timed out", not "no leader", which says the cluster has
			// none.
			s.log.Debug("a call's caller stopped waiting", "group", group, "op", op,
				"waited", time.Since(start).Round(time.Millisecond), "last_node", strconv.FormatUint(lastNode, 16), "last_answer", lastWhy)
			return err
		}
		s.log.Warn("no leader reachable for a call; giving up", "group", group, "op", op,
			"waited", time.Since(start).Round(time.Millisecond), "last_node", strconv.FormatUint(lastNode, 16), "last_answer", lastWhy)
		return ErrNoLeader
	}
	// refused is the node that last said (at refusedAt) it does not lead
	// group without naming another leader: the hints may still name it
	// (gossip outlives a step-down), so the call asks the group's
	// replicas instead, and tries it again only if a probe that started
	// after its refusal names it.
	var refused uint64
	var refusedAt time.Time
	refuse := func(node uint64) { refused, refusedAt = node, time.Now() }
	for {
		if local != nil {
			served, err := local()
			if served {
				return err
			}
		}
		leader := s.leaderOf(group)
		if leader != 0 && leader == refused {
			leader = 0
		}
		if leader == 0 && s.rpc != nil {
			var asked time.Time
			leader, asked = s.probeLeader(ctx, group)
			if leader != 0 && leader == refused && asked.Before(refusedAt) {
				leader = 0 // the probe's answer predates the refusal
			}
		}
		lastNode = leader
		if s.rpc == nil || leader == 0 {
			lastWhy = "no leader known"
			if err := sleep(ctx, retryBackoff); err != nil {
				return giveUp()
			}
			s.hints.set(group, 0)
			continue
		}
		if enc == nil {
			var err error
			if enc, err = args(); err != nil {
				return err
			}
		}
		if leader == s.self {
			// This node became the leader while the call was under way (or
			// the caller has no local path): serve it as another node's
			// call would be served here.
			res, err := s.HandleCall(ctx, &CallRequest{Op: op, Group: group, Args: enc})
			if err != nil && (errors.Is(err, ErrNoReplica) || isNotLeader(err)) {
				lastWhy = err.Error()
				refuse(s.self)
				s.hints.set(group, 0)
				if err := sleep(ctx, retryBackoff); err != nil {
					return giveUp()
				}
				continue
			}
			if err == nil && decode != nil {
				return decode(res)
			}
			return err
		}
		actx, acancel := ctx, context.CancelFunc(func() {})
		if quickOp(op) {
			actx, acancel = context.WithTimeout(ctx, attemptTimeout)
		}
		res, err := s.rpc.Call(actx, leader, &CallRequest{Op: op, Group: group, Args: enc})
		acancel()
		var nl *NotLeaderError
		var un *unavailableError
		switch {
		case errors.As(err, &nl):
			lastWhy = err.Error()
			if nl.Leader == leader {
				nl.Leader = 0
			}
			s.hints.set(group, nl.Leader)
			if nl.Leader == 0 {
				refuse(leader)
				if err := sleep(ctx, retryBackoff); err != nil {
					return giveUp()
				}
			}
			continue
		case errors.Is(err, ErrNoReplica):
			// The leader's node does not serve its replica yet (it just
			// started or was added), or no longer has one: the call did
			// not execute.
			lastWhy = err.Error()
			refuse(leader)
			s.hints.set(group, 0)
			if err := sleep(ctx, retryBackoff); err != nil {
				return giveUp()
			}
			continue
		case errors.As(err, &un):
			s.hints.set(group, 0)
			lastWhy = err.Error()
			if !idempotent && !un.notSent {
				// It may have executed: before the connection broke, or
				// after the caller stopped waiting. Never "no leader",
				// which etcd clients retry by themselves, as etcd says it
				// only of writes it did not execute.
				if err := ctx.Err(); err != nil {
					return err // etcd's "request timed out"
				}
				return partition.ErrLeaderChanged
			}
			if ctx.Err() != nil {
				return giveUp()
			}
			if err := sleep(ctx, retryBackoff); err != nil {
				return giveUp()
			}
			continue
		case err != nil:
			return err
		}
		if decode != nil {
			return decode(res)
		}
		return nil
	}
}

// probeInterval spaces a group's findLeader rounds: a group without a
// leader (an election) is asked about again only this often, however
// many calls wait for it.
const probeInterval = 250 * time.Millisecond

// probes shares findLeader rounds between the calls for a group: a call
// that finds a round under way, or one that ended less than probeInterval
// ago, takes its answer instead of asking every peer itself. Without it,
// each of many calls for a group no node has gossiped (a fresh split
// child) would ask every peer every probeInterval.
type probes struct {
	mu sync.Mutex
	m  map[uint64]*probe // group -> its latest round; protected by mu
}

// probe is one findLeader round. leader and at are set before done is
// closed.
type probe struct {
	done    chan struct{}
	started time.Time
	leader  uint64    // the leader named, 0: none
	at      time.Time // when the round ended
}

// probeLeader returns the leader of group that the latest findLeader
// round named (0: none) and when that round started, starting a round if
// none is under way or the last ended probeInterval ago or more. It waits for the round until ctx
// ends; the round itself is not bound to ctx, as other calls may wait
// for it (findLeader bounds it by attemptTimeout, and it ends when the
// store stops).
func (s *Store) probeLeader(ctx context.Context, group uint64) (uint64, time.Time) {
	s.probes.mu.Lock()
	p := s.probes.m[group]
	if p == nil || p.ended() && time.Since(p.at) >= probeInterval {
		if s.probes.m == nil {
			s.probes.m = make(map[uint64]*probe)
		}
		if len(s.probes.m) >= maxProbes {
			for g, q := range s.probes.m {
				if q.ended() && time.Since(q.at) >= probeInterval {
					delete(s.probes.m, g)
				}
			}
		}
		p = &probe{done: make(chan struct{}), started: time.Now()}
		s.probes.m[group] = p
		go func() {
			pctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-s.stopc: // the store stops: end the round now
				case <-pctx.Done():
				}
				cancel()
			}()
			leader := s.findLeader(pctx, group)
			cancel()
			if leader != 0 {
				s.hints.set(group, leader)
			}
			s.probes.mu.Lock()
			p.leader, p.at = leader, time.Now()
			close(p.done)
			s.probes.mu.Unlock()
		}()
	}
	s.probes.mu.Unlock()
	select {
	case <-p.done:
		return p.leader, p.started
	case <-ctx.Done():
		return 0, p.started
	}
}

// maxProbes is how many groups' rounds probes keeps before it drops the
// ones that ended probeInterval ago or more.
const maxProbes = 1024

func (p *probe) ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// findLeader asks every peer which node leads group, and returns the
// first leader named (0: none within attemptTimeout). The replicas
// answer from their raft state: the leader with its group's info, a
// follower with NotLeader naming its leader; other nodes have no
// replica. Only a call that no hint routes runs it (through
// probeLeader).
func (s *Store) findLeader(ctx context.Context, group uint64) uint64 {
	if s.peers == nil {
		return 0
	}
	peers := s.peers()
	if len(peers) == 0 {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	found := make(chan uint64, len(peers))
	for _, n := range peers {
		go func() {
			res, err := s.rpc.Call(ctx, n, &CallRequest{Op: OpGroupInfo, Group: group})
			var nl *NotLeaderError
			switch {
			case err == nil:
				info, derr := decodeGroupInfo(res)
				if derr == nil && info.Leader != 0 {
					found <- info.Leader
					return
				}
			case errors.As(err, &nl) && nl.Leader != 0 && nl.Leader != n:
				found <- nl.Leader
				return
			}
			found <- 0
		}()
	}
	for range peers {
		if l := <-found; l != 0 {
			return l
		}
	}
	return 0
}

// SetLocal installs (or, with nil, removes) this node's replica of
// partition id: a replica added here serves once it has its state, and a
// removed one stops serving before its state is deleted. It reports
// whether id is a partition.
func (s *Store) SetLocal(id uint64, p *partition.Partition) bool {
	if id < FirstPartition {
		return false
	}
	s.slot(id).localp.Store(p)
	return true
}

// Local returns this node's serving replica of partition id, or nil.
func (s *Store) Local(id uint64) *partition.Partition {
	if id < FirstPartition {
		return nil
	}
	return s.slot(id).local()
}
