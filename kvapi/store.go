package kvapi

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brainkv/brain/internal/bugs"
	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/raftgroup"
	"github.com/brainkv/brain/tso"
	gogoproto "github.com/gogo/protobuf/proto"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Errors of the router.
var (
	// ErrCrossPartitionTxn: a txn's keys span several partitions.
	ErrCrossPartitionTxn = errors.New("brain: txn spans multiple partitions")
	// ErrNoSpace: the NOSPACE alarm is active.
	ErrNoSpace = errors.New("brain: database space exceeded")
)

// CrossPartitionError reports which partitions a txn touched.
type CrossPartitionError struct {
	Spans   []string
	message string // set when received from another node
}

func (e *CrossPartitionError) Error() string {
	if e.message != "" {
		return e.message
	}
	return fmt.Sprintf("brain: txn spans multiple partitions (%s); a transaction must keep all its keys within one partition (see --initial-split-points)", joinSpans(e.Spans))
}

func (e *CrossPartitionError) Unwrap() error { return ErrCrossPartitionTxn }

func joinSpans(s []string) string {
	var b bytes.Buffer
	for i, x := range s {
		if i > 0 {
			b.WriteString(" and ")
		}
		b.WriteString(x)
	}
	return b.String()
}

// Route is one partition of the keyspace and its replica on this node.
type Route struct {
	ID         uint64
	Start, End []byte
	// Local is this node's replica, or nil.
	Local *partition.Partition
}

// route is a partition's span in a routing table and this node's slot
// for the partition (shared by every table).
type route struct {
	ID         uint64
	Start, End []byte
	*slot
}

// slot holds what the store keeps per partition across routing tables:
// this node's replica, which may come and go (a replica added here or
// removed), and the close forwarder.
type slot struct {
	localp atomic.Pointer[partition.Partition]
	// forwardClose asks the partition's leader to close a revision; for
	// the watch hub of a node without a replica, closeSoon decides when
	// (it sees the closed revisions of the partition's remote feed:
	// feedRemote).
	forwardClose func(rev int64)
	closeSoon    *partition.CloseSoon
}

// local returns this node's replica, or nil.
func (r *slot) local() *partition.Partition { return r.localp.Load() }

// table is a routing table: partitions covering the keyspace. Tables are
// immutable; a split replaces the store's table (SetRoutes).
type table struct {
	routes []*route // sorted by start key, covering all keys
	byID   map[uint64]*route
	// replaced is closed when a newer table replaces this one.
	replaced chan struct{}
}

// Config configures a Store.
type Config struct {
	// Self is this node's ID.
	Self uint64
	// Routes cover the keyspace, in any order.
	Routes []Route
	// TSO issues revisions; Oracle is this node's TSO replica (it answers
	// other nodes when it leads).
	TSO    *tso.Client
	Oracle *tso.Oracle
	// Meta is this node's meta replica.
	Meta *meta.Meta
	// RPC reaches other nodes (nil for a single node).
	RPC *Client
	// LeaderHint returns the node believed to lead a group (0: unknown).
	LeaderHint func(group uint64) uint64
	// Peers lists the other nodes believed up (nil: none). A call for a
	// group whose leader no hint names asks them (findLeader): gossip,
	// which LeaderHint reads for groups without a replica here, can miss
	// an update and hold the gap until its next full sync.
	Peers  func() []uint64
	Logger *slog.Logger
	// Quota, if set, is consulted before every write; see Store.quota.
	Quota func(n int) error
	// Groups returns the status of this node's replica of a group.
	Groups func(id uint64) (raftgroup.Status, bool)
	// Alive reports whether a node is believed up (nil: all are).
	Alive func(node uint64) bool
	// ClusterInfo describes the cluster to a joining node (OpClusterInfo).
	ClusterInfo func() ([]byte, error)
	// GroupLock, if set, returns the lock that serializes a group's
	// planned leadership transfers; a split holds it too (both drain the
	// leader's writes).
	GroupLock func(group uint64) *sync.Mutex
	// MaxStaleness bounds how stale a serializable read may be while the
	// node reaches the TSO: it reads at a revision at least the TSO's as
	// of that long ago (waiting for a partition that has not closed it, an
	// idle one, to close it). Default 100 ms; negative: no bound (a
	// serializable read reads what the node's replicas have closed).
	MaxStaleness time.Duration
}

// Store routes requests to the partitions (and the TSO and meta group)
// that serve them, locally or on other nodes.
type Store struct {
	self  uint64
	tab   atomic.Pointer[table]
	slots struct {
		sync.Mutex
		m map[uint64]*slot // protected by Mutex
	}
	// feeders are the partitions whose feeds run (feed.go).
	feeders struct {
		sync.Mutex
		sink FeedSink
		m    map[uint64]bool // protected by Mutex
	}
	tso        *tso.Client
	oracle     *tso.Oracle
	meta       *meta.Meta
	rpc        *Client
	leaderHint func(uint64) uint64
	peers      func() []uint64
	hints      hints
	probes     probes
	log        *slog.Logger

	// quota returns an error if a write of n more bytes would exceed the
	// backend quota (nil: no quota).
	quota func(n int) error

	maxStaleness time.Duration
	// staleReads counts serializable reads served without the staleness
	// bound (the TSO did not answer in time).
	staleReads prometheus.Counter

	groups      func(uint64) (raftgroup.Status, bool)
	alive       func(uint64) bool
	clusterInfo func() ([]byte, error)
	groupLock   func(uint64) *sync.Mutex

	// seen is the highest revision this store answered a client with: a
	// write's acknowledgement, a read's header. Serializable reads never
	// read below it, so on one node a serializable read sees every write
	// acknowledged before it started and its header never falls below an
	// earlier answer's, as on an etcd member.
	seen atomic.Int64

	// remoteFeedEvents counts the events this node's feeds received from
	// other nodes' replicas (RemoteFeedEvents).
	remoteFeedEvents atomic.Int64

	stopc chan struct{}
	wg    sync.WaitGroup
}

func (s *Store) noteSeen(rev int64) {
	// The TSO issued rev; a write forwarded to another node's leader
	// learned it there.
	s.tso.Observe(rev)
	for {
		cur := s.seen.Load()
		if rev <= cur || s.seen.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// NewStore creates a Store. Routes must cover the keyspace.
func NewStore(cfg Config) (*Store, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{self: cfg.Self, tso: cfg.TSO, oracle: cfg.Oracle, meta: cfg.Meta, rpc: cfg.RPC,
		leaderHint: cfg.LeaderHint, peers: cfg.Peers, log: cfg.Logger.With("component", "kvapi"), quota: cfg.Quota,
		groups: cfg.Groups, alive: cfg.Alive, clusterInfo: cfg.ClusterInfo, groupLock: cfg.GroupLock,
		maxStaleness: cfg.MaxStaleness, stopc: make(chan struct{})}
	if s.maxStaleness == 0 {
		s.maxStaleness = DefaultMaxStaleness
	}
	s.staleReads = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "brain_serializable_reads_unbounded_total",
		Help: "Serializable reads served at what this node's replicas had closed, without the --max-serializable-staleness bound, because the TSO did not answer in time (it was being elected, or out of reach).",
	})
	s.slots.m = make(map[uint64]*slot)
	s.feeders.m = make(map[uint64]bool)
	if err := s.SetRoutes(cfg.Routes); err != nil {
		return nil, err
	}
	for _, cr := range cfg.Routes {
		if cr.Local != nil {
			s.slot(cr.ID).localp.Store(cr.Local)
		}
	}
	return s, nil
}

// slot returns partition id's slot, creating it.
func (s *Store) slot(id uint64) *slot {
	s.slots.Lock()
	defer s.slots.Unlock()
	sl := s.slots.m[id]
	if sl == nil {
		fc := s.ForwardClose(id)
		sl = &slot{forwardClose: fc, closeSoon: partition.NewCloseSoon(fc)}
		s.slots.m[id] = sl
	}
	return sl
}

// SetRoutes replaces the routing table (Local is ignored: see SetLocal).
// Routes must cover the keyspace without gaps or overlaps. Requests
// routed by the previous table that a partition refuses as outside its
// span (ErrOutsideRange) are routed again by the new one.
func (s *Store) SetRoutes(routes []Route) error {
	t := &table{byID: make(map[uint64]*route), replaced: make(chan struct{})}
	for _, cr := range routes {
		r := &route{ID: cr.ID, Start: cr.Start, End: cr.End, slot: s.slot(cr.ID)}
		t.routes = append(t.routes, r)
		t.byID[r.ID] = r
	}
	sort.Slice(t.routes, func(i, j int) bool { return bytes.Compare(t.routes[i].Start, t.routes[j].Start) < 0 })
	for i, r := range t.routes {
		if i == 0 && len(r.Start) != 0 {
			return fmt.Errorf("kvapi: first partition starts at %q, not at the empty key", r.Start)
		}
		if i+1 < len(t.routes) {
			if !bytes.Equal(r.End, t.routes[i+1].Start) {
				return fmt.Errorf("kvapi: partitions %d and %d leave a gap or overlap", r.ID, t.routes[i+1].ID)
			}
		} else if len(r.End) != 0 {
			return fmt.Errorf("kvapi: last partition ends at %q, not at the end of the keyspace", r.End)
		}
	}
	if len(t.routes) == 0 {
		return errors.New("kvapi: no partitions")
	}
	if old := s.tab.Swap(t); old != nil {
		close(old.replaced)
	}
	return nil
}

// Routes returns the current routing table.
func (s *Store) Routes() []Route {
	t := s.tab.Load()
	out := make([]Route, len(t.routes))
	for i, r := range t.routes {
		out[i] = Route{ID: r.ID, Start: r.Start, End: r.End, Local: r.local()}
	}
	return out
}

func (s *Store) table() *table { return s.tab.Load() }

// routed runs op, and again with a newer routing table while a partition
// answers ErrOutsideRange (it split since the table was made). op must be
// safe to repeat after such an answer (reads; writes the partition
// refused before executing them).
func (s *Store) routed(ctx context.Context, op func(t *table) error) error {
	var deadline <-chan time.Time
	for {
		t := s.table()
		err := op(t)
		if !errors.Is(err, partition.ErrOutsideRange) {
			return err
		}
		if deadline == nil {
			tm := time.NewTimer(requestTimeout)
			defer tm.Stop()
			deadline = tm.C
		}
		select {
		case <-t.replaced:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return ErrNoLeader
		case <-time.After(50 * time.Millisecond):
			// The partition map may be current while this node's replica
			// is not: look again.
		}
	}
}

// routedResult is routed for an operation with a result: the result of
// the attempt that was not refused as outside a partition's range.
func routedResult[T any](ctx context.Context, s *Store, op func(t *table) (T, error)) (res T, err error) {
	err = s.routed(ctx, func(t *table) error {
		res, err = op(t)
		return err
	})
	return res, err
}

// SetTSO replaces the TSO client (a cluster's client reaches the TSO
// leader through the store itself, so it is set after NewStore).
func (s *Store) SetTSO(c *tso.Client) { s.tso = c }

// TSOBackend returns the tso.Backend that reaches the TSO leader through
// the internal API.
func (s *Store) TSOBackend() tso.Backend { return tsoBackend{s} }

type tsoBackend struct{ s *Store }

func (b tsoBackend) Next(ctx context.Context, n int64) (int64, int64, error) {
	var first, cur int64
	err := b.s.call(ctx, TSOGroup, OpTSONext, true, nil, func() ([]byte, error) { return ints(n), nil },
		func(res []byte) error {
			v, _, err := readInts(res, 2)
			if err == nil {
				first, cur = v[0], v[1]
			}
			return err
		})
	return first, cur, err
}

func (b tsoBackend) Current(ctx context.Context) (int64, error) {
	var cur int64
	err := b.s.call(ctx, TSOGroup, OpTSOCurrent, true, nil, func() ([]byte, error) { return nil, nil },
		func(res []byte) error {
			v, _, err := readInts(res, 1)
			if err == nil {
				cur = v[0]
			}
			return err
		})
	return cur, err
}

// Partitions returns this node's partition replicas in key order.
func (s *Store) Partitions() []*partition.Partition {
	var out []*partition.Partition
	for _, r := range s.table().routes {
		if l := r.local(); l != nil {
			out = append(out, l)
		}
	}
	return out
}

// CurrentRevision returns the highest revision this node knows was
// issued: a lower bound of the current revision.
func (s *Store) CurrentRevision() int64 { return s.tso.Known() }

// FreshRevision returns the current revision, never below any write
// acknowledged before the call (docs/design.md, invariant 3).
func (s *Store) FreshRevision(ctx context.Context) (int64, error) {
	return s.tso.Fresh(ctx)
}

// CompactRevision returns the compaction revision this node knows.
func (s *Store) CompactRevision() int64 { return s.meta.CompactRevision() }

// partitionIndex returns the index of the route owning key.
func (t *table) partitionIndex(key []byte) int {
	return sort.Search(len(t.routes), func(i int) bool {
		return bytes.Compare(t.routes[i].Start, key) > 0
	}) - 1
}

func (t *table) routeFor(key []byte) *route { return t.routes[t.partitionIndex(key)] }

// overlapping returns the routes overlapping [key, end) in key order (end
// nil: the single key; empty: unbounded).
func (t *table) overlapping(key, end []byte) []*route {
	i := t.partitionIndex(key)
	if end == nil {
		return t.routes[i : i+1]
	}
	j := i + 1
	for ; j < len(t.routes); j++ {
		if len(end) != 0 && bytes.Compare(t.routes[j].Start, end) >= 0 {
			break
		}
	}
	return t.routes[i:j]
}

// clip intersects [key, end) (end nil: the single key; empty: unbounded)
// with rt's span; ok is false if they do not meet.
func (rt *route) clip(key, end []byte) (k, e []byte, ok bool) {
	if end == nil {
		return key, nil, true
	}
	k, e = key, end
	if bytes.Compare(k, rt.Start) < 0 {
		k = rt.Start
	}
	if len(rt.End) != 0 && (len(e) == 0 || bytes.Compare(e, rt.End) > 0) {
		e = rt.End
	}
	if len(e) != 0 && bytes.Compare(k, e) >= 0 {
		return nil, nil, false
	}
	return k, e, true
}

// mkEnd converts an etcd range end: empty means a single key (nil here),
// "\x00" means unbounded (empty non-nil here).
func mkEnd(rangeEnd []byte) []byte {
	switch {
	case len(rangeEnd) == 0:
		return nil
	case len(rangeEnd) == 1 && rangeEnd[0] == 0:
		return []byte{}
	}
	return rangeEnd
}

// compactRevision is the compaction revision for reading routes: the meta
// group's, or a partition's own if this node learned of it there first.
func (s *Store) compactRevision(routes []*route) int64 {
	c := s.meta.CompactRevision()
	for _, r := range routes {
		if l := r.local(); l != nil {
			c = max(c, l.CompactRevision())
		}
	}
	return c
}

// readRevision picks the revision a read runs at and checks it.
func (s *Store) readRevision(ctx context.Context, routes []*route, rev int64, serializable bool) (readRev, header int64, err error) {
	var cur int64
	if bugs.On("stale-read") {
		serializable = true
	}
	if serializable {
		cur = s.tso.Known()
	} else if cur, err = s.tso.Fresh(ctx); err != nil {
		return 0, 0, err
	}
	if rev > cur {
		if !serializable {
			return 0, 0, partition.ErrFutureRev
		}
		if cur, err = s.tso.Fresh(ctx); err != nil {
			return 0, 0, err
		}
		if rev > cur {
			return 0, 0, partition.ErrFutureRev
		}
	}
	header = cur
	readRev = rev
	if readRev <= 0 {
		if serializable {
			// A serializable read reads what this node has closed, and at
			// least what it has answered with and what the TSO had issued
			// MaxStaleness ago (staleFloor).
			readRev = cur
			for _, r := range routes {
				if l := r.local(); l != nil {
					readRev = min(readRev, l.Closed())
				}
			}
			floor := s.seen.Load()
			if f, ok := s.staleFloor(ctx); ok {
				floor = max(floor, f)
			}
			readRev = max(readRev, min(floor, s.tso.Known()))
			header = readRev
		} else {
			readRev = cur
		}
	}
	if readRev < s.compactRevision(routes) {
		return 0, 0, partition.ErrCompacted
	}
	return readRev, header, nil
}

// Collectors returns the store's metrics.
func (s *Store) Collectors() []prometheus.Collector { return []prometheus.Collector{s.staleReads} }

// DefaultMaxStaleness is Config.MaxStaleness's default.
const DefaultMaxStaleness = 100 * time.Millisecond

// staleFloorWait bounds how long a serializable read waits for the TSO's
// revision when it knows none recent enough: past it (the TSO is being
// elected, or out of reach) it reads what is closed, as an etcd member
// cut off from its leader serves stale serializable reads.
const staleFloorWait = 250 * time.Millisecond

// staleFloor returns a revision the TSO had issued at most MaxStaleness
// ago (every write acknowledged before then is at or below it): one a
// write or read of this node learned within that time, or else one it
// asks the TSO for now (concurrent readers share the request). A
// serializable read at or above it is at most MaxStaleness stale. Without
// a bound, or without an answer in time, ok is false.
func (s *Store) staleFloor(ctx context.Context) (rev int64, ok bool) {
	if s.maxStaleness < 0 {
		return 0, false
	}
	if rev, ok := s.tso.ConfirmedSince(time.Now().Add(-s.maxStaleness)); ok {
		return rev, true
	}
	ctx, cancel := context.WithTimeout(ctx, staleFloorWait)
	defer cancel()
	rev, err := s.tso.Fresh(ctx)
	if err != nil {
		s.staleReads.Inc()
		return 0, false
	}
	return rev, true
}

// Range implements etcd's Range across partitions.
func (s *Store) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	return routedResult(ctx, s, func(t *table) (*pb.RangeResponse, error) { return s.rangeIn(ctx, t, r) })
}

func (s *Store) rangeIn(ctx context.Context, t *table, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	end := mkEnd(r.RangeEnd)
	routes := t.overlapping(r.Key, end)
	if end != nil && len(end) != 0 && bytes.Compare(r.Key, end) >= 0 {
		routes = nil
	}
	readRev, header, err := s.readRevision(ctx, routes, r.Revision, r.Serializable)
	if err != nil {
		return nil, err
	}
	// Ask every partition to close at once, so their waits overlap.
	for _, rt := range routes {
		if l := rt.local(); l != nil && !l.ReadableAt(readRev) {
			l.RequestClose(readRev)
		}
	}
	limit := partition.RangeLimit(r)
	var kvs []*mvccpb.KeyValue
	var count int64
	for _, rt := range routes {
		// Sorting by value needs the values even when the reply drops them.
		o := partition.ScanOptions{KeysOnly: r.KeysOnly && r.SortTarget != pb.RangeRequest_VALUE, CountOnly: r.CountOnly}
		if limit > 0 {
			if int64(len(kvs)) >= limit {
				o.CountOnly = true
			} else {
				o.Limit = limit - int64(len(kvs))
			}
		}
		k, e, ok := rt.clip(r.Key, end)
		if !ok {
			continue
		}
		pkvs, n, err := s.scan(ctx, rt, k, e, readRev, o)
		if err != nil {
			return nil, err
		}
		kvs = append(kvs, pkvs...)
		count += n
	}
	// A compaction may have removed versions while we read.
	if readRev < s.compactRevision(routes) {
		return nil, partition.ErrCompacted
	}
	s.noteSeen(header)
	return partition.ExecuteRange(r, kvs, count, header), nil
}

// scan reads a route at rev on the local replica, or on the leader's node.
func (s *Store) scan(ctx context.Context, rt *route, key, end []byte, rev int64, o partition.ScanOptions) (kvs []*mvccpb.KeyValue, n int64, err error) {
	local := func() (bool, error) {
		l := rt.local()
		if l == nil {
			return false, nil
		}
		var err error
		kvs, n, err = l.Scan(ctx, key, end, rev, o)
		// A replica removed while the read waited: read elsewhere.
		return !errors.Is(err, partition.ErrReplicaClosed), err
	}
	var resp pb.RangeResponse
	err = s.call(ctx, rt.ID, OpScan, true, local, func() ([]byte, error) {
		return encodeScan(key, end, rev, o), nil
	}, func(b []byte) error {
		if err := resp.Unmarshal(b); err != nil {
			return err
		}
		kvs, n = resp.Kvs, resp.Count
		return nil
	})
	return kvs, n, err
}

func (s *Store) checkWrite(size int) error {
	if s.meta.HasAlarm(pb.AlarmType_NOSPACE) {
		return ErrNoSpace
	}
	if s.quota != nil {
		return s.quota(size)
	}
	return nil
}

// onLeader runs a partition write on its leader.
func (s *Store) onLeader(ctx context.Context, rt *route, op Op, local func(*partition.Partition) error, args func() ([]byte, error), decode func([]byte) error) error {
	localFn := func() (bool, error) {
		l := rt.local()
		if l == nil || !l.IsLeader() {
			return false, nil
		}
		err := local(l)
		return !errors.Is(err, partition.ErrNotLeader), err
	}
	return s.call(ctx, rt.ID, op, false, localFn, args, decode)
}

// Put implements etcd's Put.
func (s *Store) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := s.checkWrite(r.Size()); err != nil {
		return nil, err
	}
	var resp *pb.PutResponse
	err := s.routed(ctx, func(t *table) error {
		return s.onLeader(ctx, t.routeFor(r.Key), OpPut,
			func(p *partition.Partition) (err error) { resp, err = p.Put(ctx, r); return err },
			r.Marshal,
			func(b []byte) error { resp = &pb.PutResponse{}; return resp.Unmarshal(b) })
	})
	if err != nil {
		return nil, err
	}
	s.noteSeen(resp.Header.Revision)
	return resp, nil
}

func (s *Store) deleteOn(ctx context.Context, rt *route, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	var resp *pb.DeleteRangeResponse
	err := s.onLeader(ctx, rt, OpDeleteRange,
		func(p *partition.Partition) (err error) { resp, err = p.DeleteRange(ctx, r); return err },
		r.Marshal,
		func(b []byte) error { resp = &pb.DeleteRangeResponse{}; return resp.Unmarshal(b) })
	if err != nil {
		return nil, err
	}
	s.noteSeen(resp.Header.Revision)
	return resp, nil
}

// DeleteRange implements etcd's DeleteRange; see the package documentation
// for ranges over several partitions.
//
// A split during a delete over several partitions makes it start over
// (the partitions it finished delete nothing more the second time).
func (s *Store) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	return routedResult(ctx, s, func(t *table) (*pb.DeleteRangeResponse, error) { return s.deleteRangeIn(ctx, t, r) })
}

func (s *Store) deleteRangeIn(ctx context.Context, t *table, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	end := mkEnd(r.RangeEnd)
	routes := t.overlapping(r.Key, end)
	if len(routes) == 1 {
		return s.deleteOn(ctx, routes[0], r)
	}
	out := &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{}}
	for _, rt := range routes {
		k, e := r.Key, end
		if bytes.Compare(k, rt.Start) < 0 {
			k = rt.Start
		}
		if len(rt.End) != 0 && (len(e) == 0 || bytes.Compare(e, rt.End) > 0) {
			e = rt.End
		}
		if len(e) != 0 && bytes.Compare(k, e) >= 0 {
			continue
		}
		sub := *r
		sub.Key, sub.RangeEnd = k, e
		if len(e) == 0 {
			sub.RangeEnd = []byte{0}
		}
		resp, err := s.deleteOn(ctx, rt, &sub)
		if err != nil {
			return nil, err
		}
		out.Deleted += resp.Deleted
		out.PrevKvs = append(out.PrevKvs, resp.PrevKvs...)
		out.Header.Revision = max(out.Header.Revision, resp.Header.Revision)
	}
	if cur, err := s.tso.Fresh(ctx); err == nil {
		out.Header.Revision = max(out.Header.Revision, cur)
	}
	return out, nil
}

// txnSpans collects every key range a txn touches.
func txnSpans(rt *pb.TxnRequest, out [][2][]byte) [][2][]byte {
	for _, c := range rt.Compare {
		out = append(out, [2][]byte{c.Key, mkEnd(c.RangeEnd)})
	}
	for _, ops := range [][]*pb.RequestOp{rt.Success, rt.Failure} {
		for _, op := range ops {
			switch tv := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
				out = append(out, [2][]byte{tv.RequestRange.Key, mkEnd(tv.RequestRange.RangeEnd)})
			case *pb.RequestOp_RequestPut:
				out = append(out, [2][]byte{tv.RequestPut.Key, nil})
			case *pb.RequestOp_RequestDeleteRange:
				out = append(out, [2][]byte{tv.RequestDeleteRange.Key, mkEnd(tv.RequestDeleteRange.RangeEnd)})
			case *pb.RequestOp_RequestTxn:
				out = txnSpans(tv.RequestTxn, out)
			}
		}
	}
	return out
}

func spanString(r *route) string {
	if len(r.End) == 0 {
		return fmt.Sprintf("[%q, end)", r.Start)
	}
	return fmt.Sprintf("[%q, %q)", r.Start, r.End)
}

// txnRoute returns the one route rt touches.
func (s *Store) txnRoute(t *table, rt *pb.TxnRequest) (*route, error) {
	var only *route
	for _, sp := range txnSpans(rt, nil) {
		if sp[1] != nil && len(sp[1]) != 0 && bytes.Compare(sp[0], sp[1]) >= 0 {
			continue // an empty range touches nothing
		}
		for _, r := range t.overlapping(sp[0], sp[1]) {
			if only == nil {
				only = r
			} else if r != only {
				return nil, &CrossPartitionError{Spans: []string{spanString(only), spanString(r)}}
			}
		}
	}
	if only == nil {
		only = t.routes[0]
	}
	return only, nil
}

// Txn implements etcd's Txn for txns within one partition.
func (s *Store) Txn(ctx context.Context, rt *pb.TxnRequest) (*pb.TxnResponse, error) {
	return routedResult(ctx, s, func(t *table) (*pb.TxnResponse, error) { return s.txnIn(ctx, t, rt) })
}

func (s *Store) txnIn(ctx context.Context, t *table, rt *pb.TxnRequest) (*pb.TxnResponse, error) {
	if partition.IsTxnReadonly(rt) {
		return s.readTxn(ctx, t, rt)
	}
	rte, err := s.txnRoute(t, rt)
	if err != nil {
		return nil, err
	}
	if err := s.checkWrite(rt.Size()); err != nil {
		return nil, err
	}
	var resp *pb.TxnResponse
	err = s.onLeader(ctx, rte, OpTxn,
		func(p *partition.Partition) (err error) { resp, err = p.Txn(ctx, rt); return err },
		rt.Marshal,
		func(b []byte) error { resp = &pb.TxnResponse{}; return resp.Unmarshal(b) })
	if err != nil {
		return nil, err
	}
	s.noteSeen(resp.Header.Revision)
	return resp, nil
}

// txnRoutes returns the routes rt touches, in key order (the first route
// when it touches none).
func (s *Store) txnRoutes(t *table, rt *pb.TxnRequest) []*route {
	seen := map[*route]bool{}
	var out []*route
	for _, sp := range txnSpans(rt, nil) {
		if sp[1] != nil && len(sp[1]) != 0 && bytes.Compare(sp[0], sp[1]) >= 0 {
			continue // an empty range touches nothing
		}
		for _, r := range t.overlapping(sp[0], sp[1]) {
			if !seen[r] {
				seen[r] = true
				out = append(out, r)
			}
		}
	}
	if len(out) == 0 {
		return t.routes[:1]
	}
	slices.SortFunc(out, func(a, b *route) int { return bytes.Compare(a.Start, b.Start) })
	return out
}

// readTxn serves a read-only txn (compares and ranges only) at one
// revision: the current one (linearizable), what this node has closed
// (serializable), or the highest a range asks for. Global revisions make
// a read at one revision a consistent snapshot of every partition, so the
// txn may touch any keys: within one partition its replica evaluates it;
// across partitions each compare and range is a read at that revision
// (readTxnAcross).
func (s *Store) readTxn(ctx context.Context, t *table, rt *pb.TxnRequest) (*pb.TxnResponse, error) {
	routes := s.txnRoutes(t, rt)
	serializable := partition.IsTxnSerializable(rt)
	rev, _, err := s.readRevision(ctx, routes, 0, serializable)
	if err != nil {
		return nil, err
	}
	if want := partition.TxnRangeRevision(rt); want > rev {
		// A range asks for a revision above the one this read would run
		// at (a serializable read runs at what this node has closed,
		// which can trail a revision another partition answered with):
		// run at it, waiting for it to close, if the TSO has issued it.
		// A revision it has not issued is a future revision, an error
		// only if the range is on the branch the compares choose (as in
		// etcd).
		issued := want <= s.tso.Known()
		if !issued {
			cur, err := s.tso.Fresh(ctx)
			if err != nil {
				return nil, err
			}
			issued = want <= cur
		}
		if issued {
			rev = want
		}
	}
	var resp *pb.TxnResponse
	if len(routes) == 1 {
		resp, err = s.readTxnAt(ctx, routes[0], rt, rev)
	} else {
		resp, err = s.readTxnAcross(ctx, t, rt, rev)
	}
	if err != nil {
		return nil, err
	}
	s.noteSeen(resp.Header.Revision)
	return resp, nil
}

// readTxnAt evaluates a read-only txn within one partition at rev, on its
// local replica or its leader's node.
func (s *Store) readTxnAt(ctx context.Context, rte *route, rt *pb.TxnRequest, rev int64) (*pb.TxnResponse, error) {
	if l := rte.local(); l != nil {
		resp, err := l.ReadTxn(ctx, rt, rev)
		if !errors.Is(err, partition.ErrReplicaClosed) {
			return resp, err
		}
		// The replica was removed while the read waited: read elsewhere.
	}
	var resp pb.TxnResponse
	err := s.call(ctx, rte.ID, OpReadTxn, true, nil, func() ([]byte, error) {
		b, err := rt.Marshal()
		return append(binary.AppendVarint(nil, rev), b...), err
	}, resp.Unmarshal)
	return &resp, err
}

// readTxnAcross evaluates a read-only txn over several partitions at rev,
// as etcd's txn does over its one store: each compare reads its key (or
// range) at rev and holds for every key read (a compare of a range with no
// key compares the zero key-value, and a value compare fails); then the
// chosen branch's ranges read at their own revision, or at rev. Every
// read is a range at an explicit revision, which waits until the
// partitions it reads have closed it.
func (s *Store) readTxnAcross(ctx context.Context, t *table, rt *pb.TxnRequest, rev int64) (*pb.TxnResponse, error) {
	succeeded := true
	for _, c := range rt.Compare {
		rr, err := s.rangeIn(ctx, t, &pb.RangeRequest{Key: c.Key, RangeEnd: c.RangeEnd, Revision: rev, Serializable: true,
			KeysOnly: c.Target != pb.Compare_VALUE})
		if err != nil {
			return nil, err
		}
		ok := len(rr.Kvs) > 0 || c.Target != pb.Compare_VALUE
		if len(rr.Kvs) == 0 && ok {
			ok = partition.CompareKV(c, &mvccpb.KeyValue{})
		}
		for _, kv := range rr.Kvs {
			ok = ok && partition.CompareKV(c, kv)
		}
		if !ok {
			succeeded = false
			break
		}
	}
	ops := rt.Success
	if !succeeded {
		ops = rt.Failure
	}
	resp := &pb.TxnResponse{Header: &pb.ResponseHeader{Revision: rev}, Succeeded: succeeded, Responses: make([]*pb.ResponseOp, len(ops))}
	for i, op := range ops {
		r := *op.GetRequestRange()
		switch {
		case r.Revision == 0:
			r.Revision = rev
		case r.Revision > rev:
			return nil, partition.ErrFutureRev // not issued (readTxn)
		}
		r.Serializable = true // at an explicit revision: no TSO round trip
		rr, err := s.rangeIn(ctx, t, &r)
		if err != nil {
			return nil, err
		}
		rr.Header = &pb.ResponseHeader{Revision: rev}
		resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
	}
	return resp, nil
}

// metaCall runs a meta-leader operation.
func (s *Store) metaCall(ctx context.Context, op Op, local func() error, args []byte, decode func([]byte) error) error {
	return s.call(ctx, MetaGroup, op, op == OpMetaReadIndex || op == OpMetaRenew || op == OpMetaTimeToLive,
		func() (bool, error) {
			if !s.meta.IsLeader() {
				return false, nil
			}
			// Not executed: retried at the leader (ErrStaleTerm: the
			// leadership moved before the command applied).
			err := local()
			return !errors.Is(err, meta.ErrNotLeader) && !errors.Is(err, meta.ErrStaleTerm), err
		},
		func() ([]byte, error) { return args, nil }, decode)
}

// Compact implements etcd's Compact.
func (s *Store) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	cur, err := s.tso.Fresh(ctx)
	if err != nil {
		return nil, err
	}
	if r.Revision > cur {
		return nil, partition.ErrFutureRev
	}
	if r.Revision <= s.meta.CompactRevision() {
		return nil, partition.ErrCompacted
	}
	if err := s.metaCall(ctx, OpMetaSetCompact, func() error { return s.meta.SetCompact(ctx, r.Revision) }, ints(r.Revision), nil); err != nil {
		return nil, err
	}
	for _, rt := range s.table().routes {
		err := s.onLeader(ctx, rt, OpCompact,
			func(p *partition.Partition) error { return p.Compact(ctx, r.Revision) },
			func() ([]byte, error) { return ints(r.Revision), nil }, nil)
		if err != nil {
			return nil, err
		}
	}
	if r.Physical {
		for _, p := range s.Partitions() {
			if err := p.WaitCollected(ctx, r.Revision); err != nil {
				return nil, err
			}
		}
	}
	cur, _ = s.tso.Fresh(ctx)
	return &pb.CompactionResponse{Header: &pb.ResponseHeader{Revision: cur}}, nil
}

// LeaseGrant grants a lease.
func (s *Store) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	if err := s.checkWrite(r.Size()); err != nil {
		return nil, err
	}
	id, ttl := meta.NewLeaseID(r.ID), r.TTL
	err := s.metaCall(ctx, OpMetaGrant, func() (err error) { id, ttl, err = s.meta.Grant(ctx, id, ttl); return err }, ints(id, ttl),
		func(b []byte) error {
			v, _, err := readInts(b, 2)
			if err == nil {
				id, ttl = v[0], v[1]
			}
			return err
		})
	if err != nil {
		return nil, err
	}
	cur, _ := s.tso.Fresh(ctx)
	return &pb.LeaseGrantResponse{Header: &pb.ResponseHeader{Revision: cur}, ID: id, TTL: ttl}, nil
}

// LeaseRevoke revokes a lease, deleting its keys.
func (s *Store) LeaseRevoke(ctx context.Context, id int64) (*pb.LeaseRevokeResponse, error) {
	if err := s.metaCall(ctx, OpMetaStartRevoke, func() error { return s.meta.StartRevoke(ctx, id) }, ints(id), nil); err != nil {
		return nil, err
	}
	if err := s.finishRevoke(ctx, id); err != nil {
		return nil, err
	}
	cur, _ := s.tso.Fresh(ctx)
	return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: cur}}, nil
}

// finishRevoke deletes the keys of lease id in every partition (again
// everywhere if a partition split meanwhile: deleting is idempotent) and
// drops the lease.
func (s *Store) finishRevoke(ctx context.Context, id int64) error {
	err := s.routed(ctx, func(t *table) error {
		for _, rt := range t.routes {
			var rev int64
			err := s.onLeader(ctx, rt, OpDeleteByLease,
				func(p *partition.Partition) (err error) {
					_, rev, err = p.DeleteByLease(ctx, id)
					if err == nil && !p.Covers(rt.Start, spanEnd(rt.End)) {
						err = partition.ErrOutsideRange
					}
					return err
				},
				func() ([]byte, error) { return appendSpan(ints(id), rt), nil },
				func(b []byte) error {
					v, _, err := readInts(b, 1)
					if err == nil {
						rev = v[0]
					}
					return err
				})
			if err != nil {
				return err
			}
			s.noteSeen(rev)
		}
		return nil
	})
	if err != nil {
		return err
	}
	err = s.metaCall(ctx, OpMetaFinishRevoke, func() error { return s.meta.FinishRevoke(ctx, id) }, ints(id), nil)
	if errors.Is(err, meta.ErrLeaseNotFound) {
		return nil // finished concurrently
	}
	return err
}

// LeaseRenew renews a lease; it returns its TTL.
func (s *Store) LeaseRenew(ctx context.Context, id int64) (int64, error) {
	var ttl int64
	err := s.metaCall(ctx, OpMetaRenew, func() (err error) { ttl, err = s.meta.Renew(id); return err }, ints(id),
		func(b []byte) error {
			v, _, err := readInts(b, 1)
			ttl = v[0]
			return err
		})
	return ttl, err
}

// LeaseTimeToLive describes a lease.
func (s *Store) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	var remaining, granted int64
	err := s.metaCall(ctx, OpMetaTimeToLive, func() (err error) { remaining, granted, err = s.meta.TimeToLive(r.ID); return err }, ints(r.ID),
		func(b []byte) error {
			v, _, err := readInts(b, 2)
			if err == nil {
				remaining, granted = v[0], v[1]
			}
			return err
		})
	if err != nil {
		return nil, err
	}
	cur, _ := s.tso.Fresh(ctx)
	resp := &pb.LeaseTimeToLiveResponse{Header: &pb.ResponseHeader{Revision: cur}, ID: r.ID, TTL: remaining, GrantedTTL: granted}
	if r.Keys {
		err := s.routed(ctx, func(t *table) error {
			resp.Keys = nil
			for _, rt := range t.routes {
				keys, err := s.leaseKeys(ctx, rt, r.ID)
				if err != nil {
					return err
				}
				resp.Keys = append(resp.Keys, keys...)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// spanEnd is a route's end as Partition.Covers takes it (a range end:
// never nil).
func spanEnd(end []byte) []byte {
	if end == nil {
		return []byte{}
	}
	return end
}

// appendSpan appends rt's span to a call's arguments, for the answering
// node to check its replica still covers it.
func appendSpan(b []byte, rt *route) []byte {
	b = binary.AppendUvarint(b, uint64(len(rt.Start)))
	b = append(b, rt.Start...)
	b = binary.AppendUvarint(b, uint64(len(rt.End)))
	return append(b, rt.End...)
}

func (s *Store) leaseKeys(ctx context.Context, rt *route, id int64) (keys [][]byte, err error) {
	local := func() (bool, error) {
		l := rt.local()
		if l == nil {
			return false, nil
		}
		var err error
		keys, err = l.LeaseKeys(id)
		if err == nil && !l.Covers(rt.Start, spanEnd(rt.End)) {
			err = partition.ErrOutsideRange
		}
		return true, err
	}
	err = s.call(ctx, rt.ID, OpLeaseKeys, true, local, func() ([]byte, error) { return appendSpan(ints(id), rt), nil }, func(b []byte) error {
		var resp pb.RangeResponse
		if err := resp.Unmarshal(b); err != nil {
			return err
		}
		keys = make([][]byte, len(resp.Kvs))
		for i, kv := range resp.Kvs {
			keys[i] = kv.Key
		}
		return nil
	})
	return keys, err
}

// LeaseLeases lists leases (from this node's meta replica, as etcd lists
// its own lessor's).
func (s *Store) LeaseLeases() *pb.LeaseLeasesResponse {
	ids := s.meta.Leases()
	resp := &pb.LeaseLeasesResponse{Header: &pb.ResponseHeader{Revision: s.tso.Known()}, Leases: make([]*pb.LeaseStatus, len(ids))}
	for i, id := range ids {
		resp.Leases[i] = &pb.LeaseStatus{ID: id}
	}
	return resp
}

// SetAlarm activates or deactivates an alarm.
func (s *Store) SetAlarm(ctx context.Context, activate bool, member uint64, a pb.AlarmType) error {
	act := int64(0)
	if activate {
		act = 1
	}
	return s.metaCall(ctx, OpMetaSetAlarm, func() error { return s.meta.SetAlarm(ctx, activate, member, a) }, ints(act, int64(member), int64(a)), nil)
}

// SetMember records a member change in the meta group.
func (s *Store) SetMember(ctx context.Context, mem meta.Member) error {
	b, err := json.Marshal(mem)
	if err != nil {
		return err
	}
	return s.metaCall(ctx, OpMetaSetMember, func() error { return s.meta.SetMember(ctx, mem) }, b, nil)
}

// Auth proposes an auth change (package auth prepared it) to the meta
// group on its leader and returns its response; resp is an empty response
// of its type (auth.ResponseFor), filled when another node applied it.
func (s *Store) Auth(ctx context.Context, r *pb.InternalRaftRequest, resp gogoproto.Message) (gogoproto.Message, error) {
	args, err := r.Marshal()
	if err != nil {
		return nil, err
	}
	var out gogoproto.Message
	err = s.metaCall(ctx, OpMetaAuth, func() error {
		m, err := s.meta.ProposeAuth(ctx, r)
		out = m
		return err
	}, args, func(b []byte) error {
		out = resp
		return gogoproto.Unmarshal(b, resp)
	})
	return out, err
}

// MetaReadIndex returns the meta group's commit index, confirmed by its
// leader.
func (s *Store) MetaReadIndex(ctx context.Context) (uint64, error) {
	var idx int64
	err := s.metaCall(ctx, OpMetaReadIndex, func() error {
		i, err := s.meta.ReadIndex(ctx)
		idx = int64(i)
		return err
	}, nil, func(b []byte) error {
		v, _, err := readInts(b, 1)
		idx = v[0]
		return err
	})
	return uint64(idx), err
}

// StartLeaseExpiry revokes expired leases every interval until Stop (on
// the meta leader; elsewhere it finds nothing to do).
func (s *Store) StartLeaseExpiry(interval time.Duration) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		inflight := make(map[int64]bool)
		var mu sync.Mutex
		for {
			select {
			case <-s.stopc:
				return
			case <-t.C:
			}
			for _, id := range s.meta.Expired() {
				mu.Lock()
				busy := inflight[id]
				inflight[id] = true
				mu.Unlock()
				if busy {
					continue
				}
				s.wg.Add(1)
				go func(id int64) {
					defer s.wg.Done()
					defer func() { mu.Lock(); delete(inflight, id); mu.Unlock() }()
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					err := s.meta.StartRevoke(ctx, id)
					if err == nil {
						err = s.finishRevoke(ctx, id)
					}
					if err != nil && !errors.Is(err, meta.ErrLeaseNotFound) {
						s.log.Warn("lease expiry revocation failed; will retry", "lease", id, "err", err)
					}
				}(id)
			}
		}
	}()
}

// Stop stops background work.
func (s *Store) Stop() {
	select {
	case <-s.stopc:
	default:
		close(s.stopc)
	}
	s.wg.Wait()
}

// Events returns the events with revisions in [from, to] (to must be
// closed on every partition) whose keys are in [key, end), merged across
// the partitions in revision order, read from this node's replicas or,
// for a partition without one here, from another node's. It returns at
// most about maxRevs revisions; next is the first revision not covered.
func (s *Store) Events(from, to int64, key, end []byte, maxRevs int) (evs []partition.RevEvents, next int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), remoteReadTimeout)
	defer cancel()
	err = s.routed(ctx, func(t *table) error {
		evs, next, err = s.eventsIn(t, from, to, key, end, maxRevs)
		return err
	})
	return evs, next, err
}

func (s *Store) eventsIn(t *table, from, to int64, key, end []byte, maxRevs int) ([]partition.RevEvents, int64, error) {
	routes := t.overlapping(key, end)
	if end == nil {
		end = append(append([]byte(nil), key...), 0)
	}
	var all []partition.RevEvents
	next := to + 1
	for _, rt := range routes {
		k, e, ok := rt.clip(key, end)
		if !ok {
			continue
		}
		evs, pnext, more, err := s.partitionEvents(rt, from, to, k, e, maxRevs)
		if err != nil {
			return nil, 0, err
		}
		all = append(all, evs...)
		if more && pnext < next {
			next = pnext
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Rev < all[j].Rev })
	out := all[:0]
	for _, e := range all {
		if e.Rev >= next {
			break
		}
		if n := len(out); n > 0 && out[n-1].Rev == e.Rev {
			out[n-1].Events = append(out[n-1].Events, e.Events...)
			continue
		}
		out = append(out, e)
	}
	return out, next, nil
}

// remoteReadTimeout bounds a read the watch path makes on another node.
const remoteReadTimeout = 10 * time.Second

// partitionEvents reads a partition's event log up to to, which the
// caller's hub knows the partition closed: from the local replica once it
// is final there (its closed revision, or, as sole voter and leader, what
// it knows applied), else from the leader, which waits for it. The local
// check is made again before every attempt: a single node has no other
// node to ask, and its replica's bound rises as its writes apply.
func (s *Store) partitionEvents(rt *route, from, to int64, key, end []byte, maxRevs int) ([]partition.RevEvents, int64, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), remoteReadTimeout)
	defer cancel()
	var evs []partition.RevEvents
	var next int64
	var more bool
	local := func() (bool, error) {
		l := rt.local()
		if l == nil || !l.ReadableAt(to) {
			return false, nil
		}
		var err error
		evs, next, more, err = l.Events(from, to, key, end, maxRevs)
		return true, err
	}
	err := s.call(ctx, rt.ID, OpEvents, true, local, func() ([]byte, error) {
		b := ints(from, to, int64(maxRevs))
		b = binary.AppendUvarint(b, uint64(len(key)))
		b = append(b, key...)
		b = binary.AppendUvarint(b, uint64(len(end)))
		return append(b, end...), nil
	}, func(res []byte) error {
		v, rest, err := readInts(res, 2)
		if err != nil {
			return err
		}
		next, more = v[0], v[1] != 0
		evs, _, err = readRevEvents(rest)
		return err
	})
	return evs, next, more, err
}

// PrevValue loads the value of key's version at rev. A version is the same
// wherever it is found, so a local replica is asked first; one that misses
// it and has not applied rev yet (it catches up while a remote feed serves
// its partition) is no answer, and the leader is asked instead.
func (s *Store) PrevValue(key []byte, rev int64) (v []byte, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), remoteReadTimeout)
	defer cancel()
	err = s.routed(ctx, func(t *table) error {
		rt := t.routeFor(key)
		local := func() (bool, error) {
			l := rt.local()
			if l == nil {
				return false, nil
			}
			var err error
			v, err = l.PrevValue(key, rev)
			return err == nil || s.rpc == nil || (l.Initialized() && l.ReadableAt(rev)), err
		}
		return s.call(ctx, rt.ID, OpPrevValue, true, local, func() ([]byte, error) {
			return append(ints(rev), key...), nil
		}, func(res []byte) error { v = res; return nil })
	})
	return v, err
}

// RequestClose asks every partition to close rev (through its leader) at
// once, for a progress request or a consistent cut.
func (s *Store) RequestClose(rev int64) {
	for _, rt := range s.table().routes {
		if l := rt.local(); l != nil {
			l.RequestClose(rev)
		} else {
			rt.forwardClose(rev)
		}
	}
}

// RequestCloseSoon asks every partition but those skip names (nil: none)
// to close rev, for the watch frontier: a partition this node does not
// lead is asked only if its leader does not close rev by itself
// (partition.CloseSoon), judged by the closed revisions of the local
// follower replica or, without one, of the partition's remote feed.
func (s *Store) RequestCloseSoon(rev int64, skip func(id uint64) bool) {
	for _, rt := range s.table().routes {
		if skip != nil && skip(rt.ID) {
			continue
		}
		if l := rt.local(); l != nil {
			l.RequestCloseSoon(rev)
		} else {
			rt.closeSoon.Request(rev)
		}
	}
}

// GroupInfo describes a raft group's replicas, as its leader knows them.
type GroupInfo struct {
	Leader   uint64
	Voters   []uint64
	Learners []uint64
}

// GroupInfo asks group's leader for its replicas.
func (s *Store) GroupInfo(ctx context.Context, group uint64) (GroupInfo, error) {
	var info GroupInfo
	local := func() (bool, error) {
		st, ok := s.groupStatus(group)
		if !ok || !st.IsLeader {
			return false, nil
		}
		info = GroupInfo{Leader: s.self, Voters: st.Voters, Learners: st.Learners}
		return true, nil
	}
	err := s.call(ctx, group, OpGroupInfo, true, local, func() ([]byte, error) { return nil, nil }, func(res []byte) error {
		var err error
		info, err = decodeGroupInfo(res)
		return err
	})
	return info, err
}

func (s *Store) groupStatus(group uint64) (raftgroup.Status, bool) {
	if s.groups == nil {
		return raftgroup.Status{}, false
	}
	return s.groups(group)
}

func encodeGroupInfo(info GroupInfo) []byte {
	b := binary.AppendUvarint(nil, info.Leader)
	for _, l := range [][]uint64{info.Voters, info.Learners} {
		b = binary.AppendUvarint(b, uint64(len(l)))
		for _, n := range l {
			b = binary.AppendUvarint(b, n)
		}
	}
	return b
}

func decodeGroupInfo(b []byte) (GroupInfo, error) {
	d := reader{b: b}
	info := GroupInfo{Leader: d.uvarint()}
	for _, l := range []*[]uint64{&info.Voters, &info.Learners} {
		n := d.uvarint()
		if n > uint64(len(b)) {
			return info, errCorruptCall
		}
		for i := uint64(0); i < n; i++ {
			*l = append(*l, d.uvarint())
		}
	}
	return info, d.err
}

// ForwardClose returns the function a follower replica of partition id
// uses to ask its leader to close a revision: asynchronous, with at most
// one request in flight per partition.
func (s *Store) ForwardClose(id uint64) func(rev int64) {
	var mu sync.Mutex
	var want, inflight int64
	var send func()
	send = func() {
		mu.Lock()
		rev := want
		if rev <= inflight {
			mu.Unlock()
			return
		}
		inflight = rev
		mu.Unlock()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			// Up to the current revision this node knows (issued by
			// the TSO), so that the leader closes ahead of what was
			// asked for and the next request may not be needed.
			ahead := max(rev, s.CurrentRevision())
			if err := s.call(ctx, id, OpRequestClose, true, nil, func() ([]byte, error) { return ints(ahead), nil }, nil); err != nil {
				s.log.Debug("a close request to the partition's leader failed", "partition", id, "rev", ahead, "err", err)
			}
			cancel()
			mu.Lock()
			inflight = 0
			more := want > rev
			mu.Unlock()
			if more {
				send()
			}
		}()
	}
	return func(rev int64) {
		if s.rpc == nil {
			return
		}
		mu.Lock()
		if rev > want {
			want = rev
		}
		busy := inflight != 0
		mu.Unlock()
		if !busy {
			send()
		}
	}
}

func encodeScan(key, end []byte, rev int64, o partition.ScanOptions) []byte {
	var flags int64
	if o.KeysOnly {
		flags |= 1
	}
	if o.CountOnly {
		flags |= 2
	}
	if end == nil {
		flags |= 4
	}
	b := ints(rev, o.Limit, flags)
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	b = binary.AppendUvarint(b, uint64(len(end)))
	return append(b, end...)
}

func decodeScan(b []byte) (key, end []byte, rev int64, o partition.ScanOptions, err error) {
	v, rest, err := readInts(b, 3)
	if err != nil {
		return nil, nil, 0, o, err
	}
	rev, o.Limit = v[0], v[1]
	o.KeysOnly, o.CountOnly = v[2]&1 != 0, v[2]&2 != 0
	r := reader{b: rest}
	key = append([]byte(nil), r.chunk()...)
	end = append([]byte{}, r.chunk()...)
	if v[2]&4 != 0 {
		end = nil
	}
	return key, end, rev, o, r.err
}
