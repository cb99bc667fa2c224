package kvapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/tso"
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
	Spans []string
}

func (e *CrossPartitionError) Error() string {
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

// Store routes requests to this node's partitions.
type Store struct {
	parts []*partition.Partition // sorted by start key, covering all keys
	tso   *tso.Oracle
	meta  *meta.Meta
	log   *slog.Logger

	// quota returns an error if a write of n more bytes would exceed the
	// backend quota (nil: no quota).
	quota func(n int) error

	// acked is the highest revision a write through this store has been
	// acknowledged with. Serializable reads never read below it, so a
	// client reads its own writes on the node it wrote through.
	acked atomic.Int64

	stopc chan struct{}
	wg    sync.WaitGroup
}

func (s *Store) noteAcked(rev int64) {
	for {
		cur := s.acked.Load()
		if rev <= cur || s.acked.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// Config configures a Store.
type Config struct {
	Partitions []*partition.Partition
	TSO        *tso.Oracle
	Meta       *meta.Meta
	Logger     *slog.Logger
	// Quota, if set, is consulted before every write; see Store.quota.
	Quota func(n int) error
}

// NewStore creates a Store. Partitions must cover the keyspace, in order.
func NewStore(cfg Config) (*Store, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	parts := append([]*partition.Partition(nil), cfg.Partitions...)
	sort.Slice(parts, func(i, j int) bool {
		a, _ := parts[i].Span()
		b, _ := parts[j].Span()
		return bytes.Compare(a, b) < 0
	})
	for i, p := range parts {
		s, e := p.Span()
		if i == 0 && len(s) != 0 {
			return nil, fmt.Errorf("kvapi: first partition starts at %q, not at the empty key", s)
		}
		if i+1 < len(parts) {
			ns, _ := parts[i+1].Span()
			if !bytes.Equal(e, ns) {
				return nil, fmt.Errorf("kvapi: partitions %d and %d leave a gap or overlap", p.ID(), parts[i+1].ID())
			}
		} else if len(e) != 0 {
			return nil, fmt.Errorf("kvapi: last partition ends at %q, not at the end of the keyspace", e)
		}
	}
	return &Store{parts: parts, tso: cfg.TSO, meta: cfg.Meta, log: cfg.Logger.With("component", "kvapi"), quota: cfg.Quota, stopc: make(chan struct{})}, nil
}

// Partitions returns the partitions in key order.
func (s *Store) Partitions() []*partition.Partition { return s.parts }

// CurrentRevision returns the cluster's current revision.
func (s *Store) CurrentRevision() int64 { return s.tso.Current() }

// CompactRevision returns the cluster's compaction revision.
func (s *Store) CompactRevision() int64 { return s.meta.CompactRevision() }

// partitionIndex returns the index of the partition owning key.
func (s *Store) partitionIndex(key []byte) int {
	return sort.Search(len(s.parts), func(i int) bool {
		st, _ := s.parts[i].Span()
		return bytes.Compare(st, key) > 0
	}) - 1
}

// partitionFor returns the partition owning key.
func (s *Store) partitionFor(key []byte) *partition.Partition {
	return s.parts[s.partitionIndex(key)]
}

// overlapping returns the partitions overlapping [key, end) in key order
// (end nil: the single key; empty: unbounded).
func (s *Store) overlapping(key, end []byte) []*partition.Partition {
	i := s.partitionIndex(key)
	if end == nil {
		return s.parts[i : i+1]
	}
	j := i + 1
	for ; j < len(s.parts); j++ {
		st, _ := s.parts[j].Span()
		if len(end) != 0 && bytes.Compare(st, end) >= 0 {
			break
		}
	}
	return s.parts[i:j]
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

// readRevision picks the revision a read runs at and checks it.
func (s *Store) readRevision(parts []*partition.Partition, rev int64, serializable bool) (readRev, header int64, err error) {
	cur := s.tso.Current()
	if rev > cur {
		return 0, 0, partition.ErrFutureRev
	}
	header = cur
	readRev = rev
	if readRev <= 0 {
		if serializable {
			// A serializable read does not ask the TSO: it reads what this
			// node has closed, and at least what it has acknowledged.
			readRev = cur
			for _, p := range parts {
				readRev = min(readRev, p.Closed())
			}
			readRev = max(readRev, min(s.acked.Load(), cur))
			header = readRev
		} else {
			readRev = cur
		}
	}
	if readRev < s.meta.CompactRevision() {
		return 0, 0, partition.ErrCompacted
	}
	return readRev, header, nil
}

// Range implements etcd's Range across partitions.
func (s *Store) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	end := mkEnd(r.RangeEnd)
	parts := s.overlapping(r.Key, end)
	if end != nil && len(end) != 0 && bytes.Compare(r.Key, end) >= 0 {
		parts = nil
	}
	readRev, header, err := s.readRevision(parts, r.Revision, r.Serializable)
	if err != nil {
		return nil, err
	}
	// Ask every partition to close at once, so their waits overlap.
	for _, p := range parts {
		if !p.ReadableAt(readRev) {
			p.RequestClose(readRev)
		}
	}
	limit := partition.RangeLimit(r)
	var kvs []*mvccpb.KeyValue
	var count int64
	for _, p := range parts {
		// Sorting by value needs the values even when the reply drops them.
		o := partition.ScanOptions{KeysOnly: r.KeysOnly && r.SortTarget != pb.RangeRequest_VALUE, CountOnly: r.CountOnly}
		if limit > 0 {
			if int64(len(kvs)) >= limit {
				o.CountOnly = true
			} else {
				o.Limit = limit - int64(len(kvs))
			}
		}
		pkvs, n, err := p.Scan(ctx, r.Key, end, readRev, o)
		if err != nil {
			return nil, err
		}
		kvs = append(kvs, pkvs...)
		count += n
	}
	// A compaction may have removed versions while we read.
	if readRev < s.meta.CompactRevision() {
		return nil, partition.ErrCompacted
	}
	return partition.ExecuteRange(r, kvs, count, header), nil
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

// Put implements etcd's Put.
func (s *Store) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := s.checkWrite(r.Size()); err != nil {
		return nil, err
	}
	resp, err := s.partitionFor(r.Key).Put(ctx, r)
	if err == nil {
		s.noteAcked(resp.Header.Revision)
	}
	return resp, err
}

// DeleteRange implements etcd's DeleteRange; see the package documentation
// for ranges over several partitions.
func (s *Store) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	end := mkEnd(r.RangeEnd)
	parts := s.overlapping(r.Key, end)
	if len(parts) == 1 {
		resp, err := parts[0].DeleteRange(ctx, r)
		if err == nil {
			s.noteAcked(resp.Header.Revision)
		}
		return resp, err
	}
	out := &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{}}
	for _, p := range parts {
		st, en := p.Span()
		k, e := r.Key, end
		if bytes.Compare(k, st) < 0 {
			k = st
		}
		if len(en) != 0 && (len(e) == 0 || bytes.Compare(e, en) > 0) {
			e = en
		}
		if len(e) != 0 && bytes.Compare(k, e) >= 0 {
			continue
		}
		sub := *r
		sub.Key, sub.RangeEnd = k, e
		if len(e) == 0 {
			sub.RangeEnd = []byte{0}
		}
		resp, err := p.DeleteRange(ctx, &sub)
		if err != nil {
			return nil, err
		}
		s.noteAcked(resp.Header.Revision)
		out.Deleted += resp.Deleted
		out.PrevKvs = append(out.PrevKvs, resp.PrevKvs...)
		out.Header.Revision = max(out.Header.Revision, resp.Header.Revision)
	}
	out.Header.Revision = max(out.Header.Revision, s.tso.Current())
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

func spanString(p *partition.Partition) string {
	s, e := p.Span()
	if len(e) == 0 {
		return fmt.Sprintf("[%q, end)", s)
	}
	return fmt.Sprintf("[%q, %q)", s, e)
}

// txnPartition returns the one partition rt touches.
func (s *Store) txnPartition(rt *pb.TxnRequest) (*partition.Partition, error) {
	var only *partition.Partition
	for _, sp := range txnSpans(rt, nil) {
		if sp[1] != nil && len(sp[1]) != 0 && bytes.Compare(sp[0], sp[1]) >= 0 {
			continue // an empty range touches nothing
		}
		for _, p := range s.overlapping(sp[0], sp[1]) {
			if only == nil {
				only = p
			} else if p != only {
				return nil, &CrossPartitionError{Spans: []string{spanString(only), spanString(p)}}
			}
		}
	}
	if only == nil {
		only = s.parts[0]
	}
	return only, nil
}

// Txn implements etcd's Txn for txns within one partition.
func (s *Store) Txn(ctx context.Context, rt *pb.TxnRequest) (*pb.TxnResponse, error) {
	p, err := s.txnPartition(rt)
	if err != nil {
		return nil, err
	}
	if partition.IsTxnReadonly(rt) {
		rev, _, err := s.readRevision([]*partition.Partition{p}, 0, partition.IsTxnSerializable(rt))
		if err != nil {
			return nil, err
		}
		return p.ReadTxn(ctx, rt, rev)
	}
	if err := s.checkWrite(rt.Size()); err != nil {
		return nil, err
	}
	resp, err := p.Txn(ctx, rt)
	if err == nil {
		s.noteAcked(resp.Header.Revision)
	}
	return resp, err
}

// Compact implements etcd's Compact.
func (s *Store) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	if r.Revision > s.tso.Current() {
		return nil, partition.ErrFutureRev
	}
	if r.Revision <= s.meta.CompactRevision() {
		return nil, partition.ErrCompacted
	}
	// Every write at or below the revision must have applied before any
	// version below it is collected.
	for _, p := range s.parts {
		p.RequestClose(r.Revision)
	}
	for _, p := range s.parts {
		if err := p.WaitClosed(ctx, r.Revision); err != nil {
			return nil, err
		}
	}
	if err := s.meta.SetCompact(ctx, r.Revision); err != nil {
		return nil, err
	}
	for _, p := range s.parts {
		if err := p.Compact(ctx, r.Revision); err != nil {
			return nil, err
		}
	}
	if r.Physical {
		for _, p := range s.parts {
			if err := p.WaitCollected(ctx, r.Revision); err != nil {
				return nil, err
			}
		}
	}
	return &pb.CompactionResponse{Header: &pb.ResponseHeader{Revision: s.tso.Current()}}, nil
}

// LeaseGrant grants a lease.
func (s *Store) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	if err := s.checkWrite(r.Size()); err != nil {
		return nil, err
	}
	id, ttl, err := s.meta.Grant(ctx, r.ID, r.TTL)
	if err != nil {
		return nil, err
	}
	return &pb.LeaseGrantResponse{Header: &pb.ResponseHeader{Revision: s.tso.Current()}, ID: id, TTL: ttl}, nil
}

// LeaseRevoke revokes a lease, deleting its keys.
func (s *Store) LeaseRevoke(ctx context.Context, id int64) (*pb.LeaseRevokeResponse, error) {
	if err := s.meta.StartRevoke(ctx, id); err != nil {
		return nil, err
	}
	if err := s.finishRevoke(ctx, id); err != nil {
		return nil, err
	}
	return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: s.tso.Current()}}, nil
}

func (s *Store) finishRevoke(ctx context.Context, id int64) error {
	for _, p := range s.parts {
		if _, err := p.DeleteByLease(ctx, id); err != nil {
			return err
		}
	}
	s.noteAcked(s.tso.Current())
	err := s.meta.FinishRevoke(ctx, id)
	if errors.Is(err, meta.ErrLeaseNotFound) {
		return nil // finished concurrently
	}
	return err
}

// LeaseRenew renews a lease; it returns its TTL.
func (s *Store) LeaseRenew(id int64) (int64, error) { return s.meta.Renew(id) }

// LeaseTimeToLive describes a lease.
func (s *Store) LeaseTimeToLive(r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	remaining, granted, err := s.meta.TimeToLive(r.ID)
	if err != nil {
		return nil, err
	}
	resp := &pb.LeaseTimeToLiveResponse{Header: &pb.ResponseHeader{Revision: s.tso.Current()}, ID: r.ID, TTL: remaining, GrantedTTL: granted}
	if r.Keys {
		for _, p := range s.parts {
			keys, err := p.LeaseKeys(r.ID)
			if err != nil {
				return nil, err
			}
			resp.Keys = append(resp.Keys, keys...)
		}
	}
	return resp, nil
}

// LeaseLeases lists leases.
func (s *Store) LeaseLeases() *pb.LeaseLeasesResponse {
	ids := s.meta.Leases()
	resp := &pb.LeaseLeasesResponse{Header: &pb.ResponseHeader{Revision: s.tso.Current()}, Leases: make([]*pb.LeaseStatus, len(ids))}
	for i, id := range ids {
		resp.Leases[i] = &pb.LeaseStatus{ID: id}
	}
	return resp
}

// StartLeaseExpiry revokes expired leases every interval until Stop.
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
					if err == nil || errors.Is(err, meta.ErrLeaseNotFound) {
						if err == nil {
							err = s.finishRevoke(ctx, id)
						}
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
// partitions in revision order. It returns at most about maxRevs revisions;
// next is the first revision not covered.
func (s *Store) Events(from, to int64, key, end []byte, maxRevs int) ([]partition.RevEvents, int64, error) {
	parts := s.overlapping(key, end)
	if end == nil {
		end = append(append([]byte(nil), key...), 0)
	}
	var all []partition.RevEvents
	next := to + 1
	for _, p := range parts {
		evs, pnext, more, err := p.Events(from, to, key, end, maxRevs)
		if err != nil {
			return nil, 0, err
		}
		all = append(all, evs...)
		if more && pnext < next {
			next = pnext
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Rev < all[j].Rev })
	// Revisions may be shared by several partitions only through a bug;
	// merge them anyway so each revision is one unit.
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

// PrevValue loads the value of key's version at rev.
func (s *Store) PrevValue(key []byte, rev int64) ([]byte, error) {
	return s.partitionFor(key).PrevValue(key, rev)
}

// RequestClose asks every partition overlapping [key, end) to close rev.
func (s *Store) RequestClose(rev int64) {
	for _, p := range s.parts {
		p.RequestClose(rev)
	}
}
