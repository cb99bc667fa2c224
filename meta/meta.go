package meta

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2"
	"github.com/gogo/protobuf/proto"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
)

// Errors.
var (
	ErrLeaseNotFound    = errors.New("meta: lease not found")
	ErrLeaseExists      = errors.New("meta: lease already exists")
	ErrLeaseTTLTooLarge = errors.New("meta: lease TTL too large")
	ErrNotLeader        = errors.New("meta: not leader")
	ErrStaleTerm        = errors.New("meta: command from a stale leader term")
	// ErrNoReplica: this node has no meta replica yet (it joined and is
	// being added).
	ErrNoReplica = errors.New("meta: no replica on this node yet")
)

// MaxLeaseTTL is etcd's largest lease TTL in seconds.
const MaxLeaseTTL = 9000000000

// Config configures the meta state machine.
type Config struct {
	// MinLeaseTTL is the smallest TTL granted, in seconds; smaller requests
	// are raised to it. etcd derives it from its election timeout
	// (ceil(1.5 * election timeout)); default 2, etcd's with its defaults.
	MinLeaseTTL int64
	Logger      *slog.Logger
	// Now is the clock (tests inject one); default time.Now.
	Now func() time.Time
	// Auth applies etcd's auth changes (users, roles, auth enable,
	// authenticate) the group's log carries; nil: they are refused.
	Auth AuthApplier
}

// AuthApplier applies the auth changes of the meta group's log (package
// auth): their state lives in the group's key range, written into the
// entry's batch.
type AuthApplier interface {
	Apply(b *pebble.Batch, index uint64, r *pb.InternalRaftRequest) (proto.Message, error)
	// Reload rereads the state after a snapshot replaced it.
	Reload() error
}

type lease struct {
	ttl      int64
	revoking bool
	expiry   time.Time // leader only
}

// Meta is the meta group's state machine.
type Meta struct {
	cfg   Config
	id    uint64
	db    *pebble.DB
	group atomic.Pointer[raftgroup.Group] // nil until this node has a replica
	log   *slog.Logger

	onSplits func()

	// leaderIndex returns the meta group's commit index, confirmed by its
	// leader (set with SetLeaderIndex; nil: this replica's own ReadIndex).
	leaderIndex func(ctx context.Context) (uint64, error)

	mu struct {
		sync.RWMutex
		leases  map[int64]*lease // protected by mu
		compact int64            // -1 until the first compaction; protected by mu
		alarms  map[alarmKey]bool
		members map[uint64]Member // members added after the cluster started
		// splits are the partition map's split records (splits.go);
		// children indexes them by child, nextPart is the next partition
		// ID to allocate.
		splits   []Split
		children map[uint64]bool
		nextPart uint64
		leader   bool
		term     uint64
	}
}

type alarmKey struct {
	member uint64
	alarm  pb.AlarmType
}

// New loads the meta state of raft group id.
func New(cfg Config, db *pebble.DB, id uint64) (*Meta, error) {
	if cfg.MinLeaseTTL == 0 {
		cfg.MinLeaseTTL = 2
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := &Meta{cfg: cfg, id: id, db: db, log: cfg.Logger.With("component", "meta")}
	m.mu.leases = make(map[int64]*lease)
	m.mu.alarms = make(map[alarmKey]bool)
	m.mu.members = make(map[uint64]Member)
	// As in etcd, a store never compacted has compaction revision -1, so
	// compacting at revision 0 or 1 is allowed once.
	m.mu.compact = -1
	if err := m.load(); err != nil {
		return nil, err
	}
	return m, nil
}

// Bind attaches the state machine to its raft group.
func (m *Meta) Bind(g *raftgroup.Group) { m.group.Store(g) }

// SetLeaderIndex sets how to learn the meta group's confirmed commit index
// when this replica does not lead (a call to the leader's node).
func (m *Meta) SetLeaderIndex(f func(ctx context.Context) (uint64, error)) { m.leaderIndex = f }

// ReadIndex returns the meta group's commit index, confirmed by this
// replica as leader.
func (m *Meta) ReadIndex(ctx context.Context) (uint64, error) {
	g := m.group.Load()
	if g == nil {
		return 0, ErrNotLeader
	}
	return g.ReadIndex(ctx)
}

// Refresh implements partition.Leases: it waits until this replica has
// applied every meta change committed before the call.
func (m *Meta) Refresh(ctx context.Context) error {
	g := m.group.Load()
	if g == nil {
		return ErrNoReplica
	}
	var idx uint64
	var err error
	if m.IsLeader() || m.leaderIndex == nil {
		idx, err = g.ReadIndex(ctx)
	} else {
		idx, err = m.leaderIndex(ctx)
	}
	if err != nil {
		return err
	}
	for g.AppliedIndex() < idx {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// Keys: GroupKey(id, "L"+BE64(lease)) -> ttl, revoking;
// GroupKey(id, "compact") -> rev; GroupKey(id, "A"+BE64(member)+BE32(alarm)).
func (m *Meta) leaseKey(id int64) []byte {
	return engine.PutUint64(engine.GroupKey(m.id, "L"), uint64(id))
}
func (m *Meta) compactKey() []byte { return engine.GroupKey(m.id, "compact") }
func (m *Meta) alarmKey(k alarmKey) []byte {
	b := engine.PutUint64(engine.GroupKey(m.id, "A"), k.member)
	return binary.BigEndian.AppendUint32(b, uint32(k.alarm))
}

func (m *Meta) load() error { return m.loadLocked() }

// loadLocked reads the state from the DB (mu held, or not yet shared).
func (m *Meta) loadLocked() error {
	prefix := engine.GroupKey(m.id, "L")
	it, err := m.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: engine.PrefixEnd(prefix)})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		k, v := it.Key(), it.Value()
		if len(v) != 9 {
			it.Close()
			return fmt.Errorf("meta: corrupt lease record")
		}
		id := int64(binary.BigEndian.Uint64(k[len(prefix):]))
		m.mu.leases[id] = &lease{ttl: int64(binary.BigEndian.Uint64(v)), revoking: v[8] == 1}
	}
	if err := it.Close(); err != nil {
		return err
	}
	if v, closer, err := m.db.Get(m.compactKey()); err == nil {
		m.mu.compact = int64(binary.BigEndian.Uint64(v))
		closer.Close()
	} else if err != pebble.ErrNotFound {
		return err
	}
	prefix = engine.GroupKey(m.id, "A")
	it, err = m.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: engine.PrefixEnd(prefix)})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()[len(prefix):]
		m.mu.alarms[alarmKey{binary.BigEndian.Uint64(k), pb.AlarmType(binary.BigEndian.Uint32(k[8:]))}] = true
	}
	if err := it.Close(); err != nil {
		return err
	}
	if err := m.loadSplitsLocked(); err != nil {
		return err
	}
	return m.loadMembersLocked()
}

// Commands.
const (
	cmdGrant       byte = 1
	cmdRevokeStart byte = 2
	cmdRevokeDone  byte = 3
	cmdCompact     byte = 4
	cmdAlarm       byte = 5
	cmdMember      byte = 6 // payload: a JSON Member (members.go)
	// payload: a JSON []Split (splits.go)
	cmdSplits byte = 7
	// no payload; the result is the ID (splits.go)
	cmdAllocPartition byte = 8
	// payload: an etcd InternalRaftRequest with one auth change (auth.go)
	cmdAuth byte = 9
)

type result struct {
	err  error
	id   uint64        // cmdAllocPartition
	resp proto.Message // cmdAuth
}

func (m *Meta) propose(ctx context.Context, kind byte, args ...uint64) error {
	var payload []byte
	for _, a := range args {
		payload = binary.BigEndian.AppendUint64(payload, a)
	}
	_, err := m.proposePayload(ctx, kind, payload)
	return err
}

// Apply implements raftgroup.StateMachine.
func (m *Meta) Apply(ac *raftgroup.ApplyContext, e *raftpb.Entry, cmd []byte) any {
	if len(cmd) >= 9 && cmd[0] == cmdMember {
		return m.applyMember(ac, e, cmd)
	}
	if len(cmd) >= 9 && (cmd[0] == cmdSplits || cmd[0] == cmdAllocPartition) {
		return m.applyPayload(ac, e, cmd)
	}
	if len(cmd) >= 9 && cmd[0] == cmdAuth {
		return m.applyAuth(ac, e, cmd)
	}
	if len(cmd) < 9 || (len(cmd)-9)%8 != 0 {
		m.log.Error("malformed meta command; rejected", "index", e.Index)
		return result{err: errors.New("meta: malformed command")}
	}
	kind, term := cmd[0], binary.BigEndian.Uint64(cmd[1:9])
	if term != e.Term {
		return result{err: ErrStaleTerm}
	}
	args := make([]uint64, (len(cmd)-9)/8)
	for i := range args {
		args[i] = binary.BigEndian.Uint64(cmd[9+8*i:])
	}
	b := ac.Batch
	m.mu.Lock()
	defer m.mu.Unlock()
	switch kind {
	case cmdGrant:
		id, ttl := int64(args[0]), int64(args[1])
		if _, ok := m.mu.leases[id]; ok {
			return result{err: ErrLeaseExists}
		}
		l := &lease{ttl: ttl, expiry: m.cfg.Now().Add(time.Duration(ttl) * time.Second)}
		m.mu.leases[id] = l
		m.saveLease(b, id, l)
	case cmdRevokeStart:
		id := int64(args[0])
		l, ok := m.mu.leases[id]
		if !ok {
			return result{err: ErrLeaseNotFound}
		}
		l.revoking = true
		m.saveLease(b, id, l)
	case cmdRevokeDone:
		id := int64(args[0])
		if _, ok := m.mu.leases[id]; !ok {
			return result{err: ErrLeaseNotFound}
		}
		delete(m.mu.leases, id)
		must(b.Delete(m.leaseKey(id), nil))
	case cmdCompact:
		if rev := int64(args[0]); rev > m.mu.compact {
			m.mu.compact = rev
			must(b.Set(m.compactKey(), engine.PutUint64(nil, uint64(rev)), nil))
		}
	case cmdAlarm:
		k := alarmKey{args[1], pb.AlarmType(args[2])}
		if args[0] == 1 {
			m.mu.alarms[k] = true
			must(b.Set(m.alarmKey(k), nil, nil))
		} else {
			delete(m.mu.alarms, k)
			must(b.Delete(m.alarmKey(k), nil))
		}
	default:
		return result{err: fmt.Errorf("meta: unknown command %d", kind)}
	}
	return result{}
}

func must(err error) {
	if err != nil {
		panic(fmt.Errorf("meta: batch write: %w", err))
	}
}

func (m *Meta) saveLease(b *pebble.Batch, id int64, l *lease) {
	v := engine.PutUint64(nil, uint64(l.ttl))
	if l.revoking {
		v = append(v, 1)
	} else {
		v = append(v, 0)
	}
	must(b.Set(m.leaseKey(id), v, nil))
}

// LeadershipChanged implements raftgroup.LeadershipObserver. A new leader
// gives every lease a full TTL, as etcd's lessor Promote does.
func (m *Meta) LeadershipChanged(leader bool, term uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.leader, m.mu.term = leader, term
	if leader {
		now := m.cfg.Now()
		for _, l := range m.mu.leases {
			l.expiry = now.Add(time.Duration(l.ttl) * time.Second)
		}
	}
}

// IsLeader reports whether this replica is the serving meta leader.
func (m *Meta) IsLeader() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.mu.leader
}

// NewLeaseID returns id, or a fresh random positive ID if id is 0 (as etcd
// picks one).
func NewLeaseID(id int64) int64 {
	for id == 0 {
		id = int64(rand.Uint64() & (1<<63 - 1))
	}
	return id
}

// Grant creates a lease. id 0 picks a fresh positive ID. The TTL is raised
// to MinLeaseTTL. It returns the lease's ID and TTL.
func (m *Meta) Grant(ctx context.Context, id, ttl int64) (int64, int64, error) {
	if ttl > MaxLeaseTTL {
		return 0, 0, ErrLeaseTTLTooLarge
	}
	if ttl < m.cfg.MinLeaseTTL {
		ttl = m.cfg.MinLeaseTTL
	}
	id = NewLeaseID(id)
	if err := m.propose(ctx, cmdGrant, uint64(id), uint64(ttl)); err != nil {
		return 0, 0, err
	}
	return id, ttl, nil
}

// StartRevoke marks lease id revoking.
func (m *Meta) StartRevoke(ctx context.Context, id int64) error {
	return m.propose(ctx, cmdRevokeStart, uint64(id))
}

// FinishRevoke removes lease id.
func (m *Meta) FinishRevoke(ctx context.Context, id int64) error {
	return m.propose(ctx, cmdRevokeDone, uint64(id))
}

// LeaseUsable reports whether lease id exists and is not being revoked.
func (m *Meta) LeaseUsable(id int64) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	l, ok := m.mu.leases[id]
	return ok && !l.revoking
}

// Renew refreshes lease id's expiry (leader only) and returns its TTL.
func (m *Meta) Renew(id int64) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.mu.leader {
		return 0, ErrNotLeader
	}
	l, ok := m.mu.leases[id]
	if !ok || l.revoking || !m.cfg.Now().Before(l.expiry) {
		return 0, ErrLeaseNotFound
	}
	l.expiry = m.cfg.Now().Add(time.Duration(l.ttl) * time.Second)
	return l.ttl, nil
}

// TimeToLive returns lease id's remaining and granted TTL in seconds.
func (m *Meta) TimeToLive(id int64) (remaining, granted int64, err error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if !m.mu.leader {
		return 0, 0, ErrNotLeader
	}
	l, ok := m.mu.leases[id]
	if !ok || l.revoking {
		// A lease being revoked is gone for clients, as etcd's revocation
		// (one atomic step there) makes it.
		return 0, 0, ErrLeaseNotFound
	}
	return int64(l.expiry.Sub(m.cfg.Now()).Seconds()), l.ttl, nil
}

// Leases returns the IDs of all leases, ascending.
func (m *Meta) Leases() []int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	ids := make([]int64, 0, len(m.mu.leases))
	for id := range m.mu.leases {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// Expired returns (on the leader) the leases past their expiry, and those
// left revoking, which the caller must revoke.
func (m *Meta) Expired() []int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if !m.mu.leader {
		return nil
	}
	now := m.cfg.Now()
	var ids []int64
	for id, l := range m.mu.leases {
		if l.revoking || !now.Before(l.expiry) {
			ids = append(ids, id)
		}
	}
	return ids
}

// CompactRevision returns the cluster's compaction revision.
func (m *Meta) CompactRevision() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.mu.compact
}

// SetCompact records compaction at rev.
func (m *Meta) SetCompact(ctx context.Context, rev int64) error {
	return m.propose(ctx, cmdCompact, uint64(rev))
}

// Alarms returns the active alarms.
func (m *Meta) Alarms() []*pb.AlarmMember {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]*pb.AlarmMember, 0, len(m.mu.alarms))
	for k := range m.mu.alarms {
		out = append(out, &pb.AlarmMember{MemberID: k.member, Alarm: k.alarm})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].MemberID != out[j].MemberID {
			return out[i].MemberID < out[j].MemberID
		}
		return out[i].Alarm < out[j].Alarm
	})
	return out
}

// HasAlarm reports whether alarm a is active on any member.
func (m *Meta) HasAlarm(a pb.AlarmType) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for k := range m.mu.alarms {
		if k.alarm == a {
			return true
		}
	}
	return false
}

// SetAlarm activates or deactivates an alarm for a member.
func (m *Meta) SetAlarm(ctx context.Context, activate bool, member uint64, a pb.AlarmType) error {
	var act uint64
	if activate {
		act = 1
	}
	return m.propose(ctx, cmdAlarm, act, member, uint64(a))
}

// Lease is a lease as backups carry it.
type Lease struct {
	ID  int64
	TTL int64
}

// LeaseList returns every lease that is not being revoked.
func (m *Meta) LeaseList() []Lease {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]Lease, 0, len(m.mu.leases))
	for id, l := range m.mu.leases {
		if !l.revoking {
			out = append(out, Lease{ID: id, TTL: l.ttl})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// WriteRestoredState writes the meta state restored from a backup.
func WriteRestoredState(b *pebble.Batch, groupID uint64, leases []Lease, compact int64) error {
	m := &Meta{id: groupID}
	for _, l := range leases {
		m.saveLease(b, l.ID, &lease{ttl: l.TTL})
	}
	return b.Set(m.compactKey(), engine.PutUint64(nil, uint64(compact)), nil)
}

func (m *Meta) groupBounds() (lo, hi []byte) {
	lo = engine.GroupKey(m.id, "")
	return lo, engine.PrefixEnd(lo)
}

// WriteSnapshot implements raftgroup.Snapshotter.
func (m *Meta) WriteSnapshot(r pebble.Reader, emit func(k, v []byte) error) error {
	lo, hi := m.groupBounds()
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		if err := emit(it.Key(), it.Value()); err != nil {
			return err
		}
	}
	return it.Error()
}

// ClearState implements raftgroup.Snapshotter.
func (m *Meta) ClearState(b *pebble.Batch) error {
	lo, hi := m.groupBounds()
	return b.DeleteRange(lo, hi, nil)
}

// SnapshotApplied implements raftgroup.Snapshotter.
func (m *Meta) SnapshotApplied() error {
	m.mu.Lock()
	m.mu.leases = make(map[int64]*lease)
	m.mu.alarms = make(map[alarmKey]bool)
	m.mu.members = make(map[uint64]Member)
	m.mu.compact = -1
	m.mu.Unlock()
	m.mu.Lock()
	err := m.loadLocked()
	m.mu.Unlock()
	if err == nil && m.cfg.Auth != nil {
		err = m.cfg.Auth.Reload()
	}
	if err == nil && m.onSplits != nil {
		m.onSplits()
	}
	return err
}
