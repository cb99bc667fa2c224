package partition

import (
	"bytes"
	"errors"
	"math"
	"sort"

	"github.com/cockroachdb/pebble/v2"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Evaluation errors; the etcd edge maps them to etcd's codes and messages.
var (
	ErrCompacted     = errors.New("mvcc: required revision has been compacted")
	ErrFutureRev     = errors.New("mvcc: required revision is a future revision")
	ErrKeyNotFound   = errors.New("etcdserver: key not found")
	ErrLeaseNotFound = errors.New("lease not found")
)

// view is what a txn is evaluated against: the partition's state (the
// applied state at the leader, whose latched keys have no write in flight,
// or a closed revision on the read path) plus the txn's own changes. It
// mirrors etcd's storeTxnWrite: beginRev is the revision before the txn,
// and once the txn has a change its reads are at beginRev+1.
type view struct {
	r pebble.Reader
	// index, if set, holds the latest meta of every key; reads at
	// revisions it may not be current for resolve in storage.
	index      *keyIndex
	readRev    int64 // revision of "latest" reads in storage
	beginRev   int64
	compactRev int64
	leaseOK    func(id int64) bool

	changes []mutation                  // in op order
	overlay map[string]*mvccpb.KeyValue // key -> new kv, nil if deleted
	events  []*mvccpb.Event             // for the prev_kv of responses
}

func (v *view) rev() int64 {
	if len(v.changes) > 0 {
		return v.beginRev + 1
	}
	return v.beginRev
}

// rangeResult mirrors mvcc.RangeResult.
type rangeResult struct {
	kvs   []*mvccpb.KeyValue
	count int64
	rev   int64
}

type rangeOpts struct {
	limit    int64
	rev      int64
	count    bool
	keysOnly bool // values are not needed (internal: compares)
}

// rangeKeys mirrors storeTxnCommon.rangeKeys, through the overlay.
func (v *view) rangeKeys(key, end []byte, ro rangeOpts) (*rangeResult, error) {
	curRev := v.rev()
	rev := ro.rev
	if rev > curRev {
		return &rangeResult{count: -1, rev: curRev}, ErrFutureRev
	}
	if rev <= 0 {
		rev = curRev
	}
	if rev < v.compactRev {
		return &rangeResult{count: -1}, ErrCompacted
	}
	// Reads at the current revision see storage's latest state; older
	// revisions read storage at that revision and never see the overlay.
	storageRev := rev
	useOverlay := rev == curRev
	if useOverlay {
		storageRev = v.readRev
	}
	start, stop := key, end
	point := end == nil
	if point {
		stop = append(append([]byte(nil), key...), 0)
	}
	touched := useOverlay && v.overlayTouches(start, stop, point)
	opts := scanOptions{rev: storageRev, countOnly: ro.count, keysOnly: ro.keysOnly}
	if !touched && ro.limit > 0 {
		opts.limit = int(ro.limit)
	}
	var kvs []*mvccpb.KeyValue
	var count int64
	var err error
	if v.index != nil {
		kvs, count, err = v.index.indexedScan(v.r, start, stop, opts)
	} else {
		kvs, count, err = scan(v.r, start, stop, opts)
	}
	if err != nil {
		return nil, err
	}
	if touched {
		kvs, count, err = v.mergeOverlay(kvs, count, start, stop, point, !ro.count, storageRev)
		if err != nil {
			return nil, err
		}
		if ro.count {
			kvs = nil
		}
		if ro.limit > 0 && int64(len(kvs)) > ro.limit {
			kvs = kvs[:ro.limit]
		}
	}
	return &rangeResult{kvs: kvs, count: count, rev: curRev}, nil
}

func inRange(k, start, stop []byte) bool {
	return bytes.Compare(k, start) >= 0 && (len(stop) == 0 || bytes.Compare(k, stop) < 0)
}

func (v *view) overlayTouches(start, stop []byte, point bool) bool {
	for k := range v.overlay {
		if point {
			if k == string(start) {
				return true
			}
		} else if inRange([]byte(k), start, stop) {
			return true
		}
	}
	return false
}

// mergeOverlay applies the overlay to a storage result that holds every
// live key of the range (complete), or none of them (a count-only scan).
func (v *view) mergeOverlay(kvs []*mvccpb.KeyValue, count int64, start, stop []byte, point, complete bool, storageRev int64) ([]*mvccpb.KeyValue, int64, error) {
	byKey := make(map[string]int, len(kvs))
	for i, kv := range kvs {
		byKey[string(kv.Key)] = i
	}
	var added []*mvccpb.KeyValue
	removed := make(map[int]bool)
	for k, nkv := range v.overlay {
		if point && k != string(start) || !point && !inRange([]byte(k), start, stop) {
			continue
		}
		i, existed := byKey[k]
		if !complete {
			old, err := v.getAt([]byte(k), storageRev, true)
			if err != nil {
				return nil, 0, err
			}
			existed = old != nil
		}
		switch {
		case nkv == nil && existed:
			count--
			if _, ok := byKey[k]; ok {
				removed[i] = true
			}
		case nkv != nil && !existed:
			count++
			added = append(added, nkv)
		case nkv != nil && existed:
			if _, ok := byKey[k]; ok {
				kvs[i] = nkv
			}
		}
	}
	out := make([]*mvccpb.KeyValue, 0, len(kvs)+len(added))
	for i, kv := range kvs {
		if !removed[i] {
			out = append(out, kv)
		}
	}
	out = append(out, added...)
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].Key, out[j].Key) < 0 })
	return out, count, nil
}

// latest returns key's live kv through the overlay, or nil.
func (v *view) latest(key []byte) (*mvccpb.KeyValue, error) {
	if kv, ok := v.overlay[string(key)]; ok {
		return kv, nil
	}
	return v.getAt(key, v.readRev, false)
}

// latestMeta is latest without the value.
func (v *view) latestMeta(key []byte) (*mvccpb.KeyValue, error) {
	if kv, ok := v.overlay[string(key)]; ok {
		return kv, nil
	}
	return v.getAt(key, v.readRev, true)
}

// getAt is getAt through the in-memory index when there is one.
func (v *view) getAt(key []byte, rev int64, noValue bool) (*mvccpb.KeyValue, error) {
	if v.index == nil || rev != latestRev {
		return getAt(v.r, key, rev, noValue)
	}
	m, ok := v.index.get(key)
	if !ok || m.tombstone {
		return nil, nil
	}
	kv := &mvccpb.KeyValue{Key: key, ModRevision: m.mod, CreateRevision: m.create, Version: m.version, Lease: m.lease}
	if noValue {
		return kv, nil
	}
	return kv, readValue(v.r, key, m.mod, kv)
}

func (v *view) put(key, value []byte, lease int64) {
	rev := v.beginRev + 1
	kv := &mvccpb.KeyValue{Key: key, Value: value, CreateRevision: rev, ModRevision: rev, Version: 1, Lease: lease}
	if old, _ := v.latestMeta(key); old != nil {
		kv.CreateRevision, kv.Version = old.CreateRevision, old.Version+1
	}
	v.setOverlay(key, kv)
	v.changes = append(v.changes, mutation{kind: mutPut, key: key, value: value, lease: lease})
}

func (v *view) del(key []byte) {
	v.setOverlay(key, nil)
	v.changes = append(v.changes, mutation{kind: mutDelete, key: key})
}

func (v *view) setOverlay(key []byte, kv *mvccpb.KeyValue) {
	if v.overlay == nil {
		v.overlay = make(map[string]*mvccpb.KeyValue)
	}
	v.overlay[string(key)] = kv
}

// mkGteRange mirrors etcd: a range end of "\x00" means "all keys >= key".
func mkGteRange(rangeEnd []byte) []byte {
	if len(rangeEnd) == 1 && rangeEnd[0] == 0 {
		return []byte{}
	}
	return rangeEnd
}

// ExecuteRange post-processes a range result exactly as etcd's
// executeRange does: filters, sort, limit, More, Count, KeysOnly. kvs must
// be in ascending key order and, when the request filters or sorts, hold
// every key in the range.
func ExecuteRange(r *pb.RangeRequest, kvs []*mvccpb.KeyValue, count int64, rev int64) *pb.RangeResponse {
	resp := &pb.RangeResponse{Header: &pb.ResponseHeader{}}
	prune := func(f func(*mvccpb.KeyValue) bool) {
		j := 0
		for _, kv := range kvs {
			if !f(kv) {
				kvs[j] = kv
				j++
			}
		}
		kvs = kvs[:j]
	}
	if r.MaxModRevision != 0 {
		prune(func(kv *mvccpb.KeyValue) bool { return kv.ModRevision > r.MaxModRevision })
	}
	if r.MinModRevision != 0 {
		prune(func(kv *mvccpb.KeyValue) bool { return kv.ModRevision < r.MinModRevision })
	}
	if r.MaxCreateRevision != 0 {
		prune(func(kv *mvccpb.KeyValue) bool { return kv.CreateRevision > r.MaxCreateRevision })
	}
	if r.MinCreateRevision != 0 {
		prune(func(kv *mvccpb.KeyValue) bool { return kv.CreateRevision < r.MinCreateRevision })
	}
	sortOrder := r.SortOrder
	if r.SortTarget != pb.RangeRequest_KEY && sortOrder == pb.RangeRequest_NONE {
		sortOrder = pb.RangeRequest_ASCEND
	} else if r.SortTarget == pb.RangeRequest_KEY && sortOrder == pb.RangeRequest_ASCEND {
		sortOrder = pb.RangeRequest_NONE
	}
	if sortOrder != pb.RangeRequest_NONE {
		var less func(a, b *mvccpb.KeyValue) bool
		switch r.SortTarget {
		case pb.RangeRequest_KEY:
			less = func(a, b *mvccpb.KeyValue) bool { return bytes.Compare(a.Key, b.Key) < 0 }
		case pb.RangeRequest_VERSION:
			less = func(a, b *mvccpb.KeyValue) bool { return a.Version < b.Version }
		case pb.RangeRequest_CREATE:
			less = func(a, b *mvccpb.KeyValue) bool { return a.CreateRevision < b.CreateRevision }
		case pb.RangeRequest_MOD:
			less = func(a, b *mvccpb.KeyValue) bool { return a.ModRevision < b.ModRevision }
		case pb.RangeRequest_VALUE:
			less = func(a, b *mvccpb.KeyValue) bool { return bytes.Compare(a.Value, b.Value) < 0 }
		}
		// etcd uses sort.Sort (not stable) with sort.Reverse for DESCEND;
		// the same algorithm on the same input order gives the same output.
		s := kvSorter{kvs: kvs, less: less}
		if sortOrder == pb.RangeRequest_DESCEND {
			sort.Sort(sort.Reverse(s))
		} else {
			sort.Sort(s)
		}
	}
	if r.Limit > 0 && len(kvs) > int(r.Limit) {
		kvs = kvs[:r.Limit]
		resp.More = true
	}
	resp.Header.Revision = rev
	resp.Count = count
	resp.Kvs = make([]*mvccpb.KeyValue, len(kvs))
	for i, kv := range kvs {
		if r.KeysOnly {
			kv.Value = nil
		}
		resp.Kvs[i] = kv
	}
	return resp
}

type kvSorter struct {
	kvs  []*mvccpb.KeyValue
	less func(a, b *mvccpb.KeyValue) bool
}

func (s kvSorter) Len() int           { return len(s.kvs) }
func (s kvSorter) Swap(i, j int)      { s.kvs[i], s.kvs[j] = s.kvs[j], s.kvs[i] }
func (s kvSorter) Less(i, j int) bool { return s.less(s.kvs[i], s.kvs[j]) }

// RangeLimit returns the limit to fetch from storage for r, as etcd does:
// everything when filtering or sorting, otherwise limit+1 to learn More.
func RangeLimit(r *pb.RangeRequest) int64 {
	limit := r.Limit
	if r.SortOrder != pb.RangeRequest_NONE ||
		r.MinModRevision != 0 || r.MaxModRevision != 0 ||
		r.MinCreateRevision != 0 || r.MaxCreateRevision != 0 {
		return 0
	}
	if limit > 0 {
		limit++
	}
	return limit
}

func (v *view) executeRange(r *pb.RangeRequest) (*pb.RangeResponse, error) {
	rr, err := v.rangeKeys(r.Key, mkGteRange(r.RangeEnd), rangeOpts{limit: RangeLimit(r), rev: r.Revision, count: r.CountOnly})
	if err != nil {
		return nil, err
	}
	// Copy kvs: the overlay's kvs are shared with later ops.
	kvs := make([]*mvccpb.KeyValue, len(rr.kvs))
	for i, kv := range rr.kvs {
		c := *kv
		kvs[i] = &c
	}
	return ExecuteRange(r, kvs, rr.count, rr.rev), nil
}

func (v *view) executePut(p *pb.PutRequest) (*pb.PutResponse, error) {
	resp := &pb.PutResponse{Header: &pb.ResponseHeader{}}
	val, lease := p.Value, p.Lease
	var prev *mvccpb.KeyValue
	if p.IgnoreValue || p.IgnoreLease || p.PrevKv {
		var err error
		if prev, err = v.latest(p.Key); err != nil {
			return nil, err
		}
	}
	if p.IgnoreValue || p.IgnoreLease {
		if prev == nil {
			return nil, ErrKeyNotFound
		}
	}
	if p.IgnoreValue {
		val = prev.Value
	}
	if p.IgnoreLease {
		lease = prev.Lease
	}
	if p.PrevKv && prev != nil {
		c := *prev
		resp.PrevKv = &c
	}
	v.put(p.Key, val, lease)
	resp.Header.Revision = v.beginRev + 1
	return resp, nil
}

func (v *view) executeDeleteRange(dr *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	resp := &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{}}
	end := mkGteRange(dr.RangeEnd)
	rr, err := v.rangeKeys(dr.Key, end, rangeOpts{})
	if err != nil {
		return nil, err
	}
	if dr.PrevKv {
		resp.PrevKvs = make([]*mvccpb.KeyValue, len(rr.kvs))
		for i, kv := range rr.kvs {
			c := *kv
			resp.PrevKvs[i] = &c
		}
	}
	for _, kv := range rr.kvs {
		v.del(kv.Key)
	}
	resp.Deleted = int64(len(rr.kvs))
	if resp.Deleted != 0 || len(v.changes) > 0 {
		resp.Header.Revision = v.beginRev + 1
	} else {
		resp.Header.Revision = v.beginRev
	}
	return resp, nil
}

// precheck evaluates rt's compares and etcd's checks of the ops on the
// chosen path, without executing the ops. It returns the path and whether
// the txn certainly writes (the chosen path has a put).
func (v *view) precheck(rt *pb.TxnRequest) (path []bool, writes bool, err error) {
	if path, err = v.compareToPath(rt); err != nil {
		return nil, false, err
	}
	if _, err := v.checkTxn(rt, path); err != nil {
		return nil, false, err
	}
	writes, _ = pathHasPut(rt, path)
	return path, writes, nil
}

// pathHasPut reports whether the ops on path include a put, and how many
// nested txns it consumed from path.
func pathHasPut(rt *pb.TxnRequest, path []bool) (bool, int) {
	reqs := rt.Success
	if !path[0] {
		reqs = rt.Failure
	}
	has, used := false, 0
	for _, req := range reqs {
		switch tv := req.Request.(type) {
		case *pb.RequestOp_RequestPut:
			has = true
		case *pb.RequestOp_RequestTxn:
			h, n := pathHasPut(tv.RequestTxn, path[1+used:])
			has = has || h
			used += n + 1
		}
	}
	return has, used
}

// evalTxn evaluates rt as etcd's Txn does and returns the response; the
// view's changes are the writes to apply.
func (v *view) evalTxn(rt *pb.TxnRequest) (*pb.TxnResponse, error) {
	path, err := v.compareToPath(rt)
	if err != nil {
		return nil, err
	}
	if _, err := v.checkTxn(rt, path); err != nil {
		return nil, err
	}
	return v.executePath(rt, path)
}

// executePath executes the ops of rt on path, which compares and checks
// have already chosen (see precheck).
func (v *view) executePath(rt *pb.TxnRequest, path []bool) (*pb.TxnResponse, error) {
	resp, _ := newTxnResp(rt, path)
	if _, err := v.executeTxn(rt, path, resp); err != nil {
		return nil, err
	}
	resp.Header.Revision = v.rev()
	return resp, nil
}

func newTxnResp(rt *pb.TxnRequest, path []bool) (*pb.TxnResponse, int) {
	reqs := rt.Success
	if !path[0] {
		reqs = rt.Failure
	}
	resps := make([]*pb.ResponseOp, len(reqs))
	resp := &pb.TxnResponse{Responses: resps, Succeeded: path[0], Header: &pb.ResponseHeader{}}
	count := 0
	for i, req := range reqs {
		switch tv := req.Request.(type) {
		case *pb.RequestOp_RequestRange:
			resps[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{}}
		case *pb.RequestOp_RequestPut:
			resps[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{}}
		case *pb.RequestOp_RequestDeleteRange:
			resps[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{}}
		case *pb.RequestOp_RequestTxn:
			r, n := newTxnResp(tv.RequestTxn, path[1:])
			resps[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: r}}
			path = path[1+n:]
			count += n + 1
		}
	}
	return resp, count
}

func (v *view) executeTxn(rt *pb.TxnRequest, path []bool, tresp *pb.TxnResponse) (int, error) {
	reqs := rt.Success
	if !path[0] {
		reqs = rt.Failure
	}
	txns := 0
	for i, req := range reqs {
		respi := tresp.Responses[i].Response
		switch tv := req.Request.(type) {
		case *pb.RequestOp_RequestRange:
			r, err := v.executeRange(tv.RequestRange)
			if err != nil {
				return 0, err
			}
			respi.(*pb.ResponseOp_ResponseRange).ResponseRange = r
		case *pb.RequestOp_RequestPut:
			r, err := v.executePut(tv.RequestPut)
			if err != nil {
				return 0, err
			}
			respi.(*pb.ResponseOp_ResponsePut).ResponsePut = r
		case *pb.RequestOp_RequestDeleteRange:
			r, err := v.executeDeleteRange(tv.RequestDeleteRange)
			if err != nil {
				return 0, err
			}
			respi.(*pb.ResponseOp_ResponseDeleteRange).ResponseDeleteRange = r
		case *pb.RequestOp_RequestTxn:
			r := respi.(*pb.ResponseOp_ResponseTxn).ResponseTxn
			n, err := v.executeTxn(tv.RequestTxn, path[1:], r)
			if err != nil {
				return 0, err
			}
			txns += n + 1
			path = path[n+1:]
		}
	}
	return txns, nil
}

func (v *view) checkTxn(rt *pb.TxnRequest, path []bool) (int, error) {
	count := 0
	reqs := rt.Success
	if !path[0] {
		reqs = rt.Failure
	}
	for _, req := range reqs {
		var err error
		switch tv := req.Request.(type) {
		case *pb.RequestOp_RequestRange:
			r := tv.RequestRange
			switch {
			case r.Revision == 0:
			case r.Revision > v.beginRev:
				err = ErrFutureRev
			case r.Revision < v.compactRev:
				err = ErrCompacted
			}
		case *pb.RequestOp_RequestPut:
			p := tv.RequestPut
			if p.IgnoreValue || p.IgnoreLease {
				var kv *mvccpb.KeyValue
				if kv, err = v.getAt(p.Key, v.readRev, true); err == nil && kv == nil {
					err = ErrKeyNotFound
				}
			}
			if err == nil && p.Lease != 0 && !v.leaseOK(p.Lease) {
				err = ErrLeaseNotFound
			}
		case *pb.RequestOp_RequestTxn:
			var n int
			n, err = v.checkTxn(tv.RequestTxn, path[1:])
			count += n + 1
			path = path[n+1:]
		}
		if err != nil {
			return 0, err
		}
	}
	return count, nil
}

func (v *view) compareToPath(rt *pb.TxnRequest) ([]bool, error) {
	ok, err := v.applyCompares(rt.Compare)
	if err != nil {
		return nil, err
	}
	path := []bool{ok}
	ops := rt.Success
	if !ok {
		ops = rt.Failure
	}
	for _, op := range ops {
		tv, isTxn := op.Request.(*pb.RequestOp_RequestTxn)
		if !isTxn || tv.RequestTxn == nil {
			continue
		}
		sub, err := v.compareToPath(tv.RequestTxn)
		if err != nil {
			return nil, err
		}
		path = append(path, sub...)
	}
	return path, nil
}

func (v *view) applyCompares(cmps []*pb.Compare) (bool, error) {
	for _, c := range cmps {
		ok, err := v.applyCompare(c)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

func (v *view) applyCompare(c *pb.Compare) (bool, error) {
	// Only a value compare needs values.
	rr, err := v.rangeKeys(c.Key, mkGteRange(c.RangeEnd), rangeOpts{keysOnly: c.Target != pb.Compare_VALUE})
	if err != nil {
		return false, err
	}
	if len(rr.kvs) == 0 {
		if c.Target == pb.Compare_VALUE {
			return false, nil
		}
		return CompareKV(c, &mvccpb.KeyValue{}), nil
	}
	for _, kv := range rr.kvs {
		if !CompareKV(c, kv) {
			return false, nil
		}
	}
	return true, nil
}

// CompareKV mirrors etcd's compareKV.
func CompareKV(c *pb.Compare, kv *mvccpb.KeyValue) bool {
	var result int
	rev := int64(0)
	switch c.Target {
	case pb.Compare_VALUE:
		var val []byte
		if tv, _ := c.TargetUnion.(*pb.Compare_Value); tv != nil {
			val = tv.Value
		}
		result = bytes.Compare(kv.Value, val)
	case pb.Compare_CREATE:
		if tv, _ := c.TargetUnion.(*pb.Compare_CreateRevision); tv != nil {
			rev = tv.CreateRevision
		}
		result = cmpInt64(kv.CreateRevision, rev)
	case pb.Compare_MOD:
		if tv, _ := c.TargetUnion.(*pb.Compare_ModRevision); tv != nil {
			rev = tv.ModRevision
		}
		result = cmpInt64(kv.ModRevision, rev)
	case pb.Compare_VERSION:
		if tv, _ := c.TargetUnion.(*pb.Compare_Version); tv != nil {
			rev = tv.Version
		}
		result = cmpInt64(kv.Version, rev)
	case pb.Compare_LEASE:
		if tv, _ := c.TargetUnion.(*pb.Compare_Lease); tv != nil {
			rev = tv.Lease
		}
		result = cmpInt64(kv.Lease, rev)
	}
	switch c.Result {
	case pb.Compare_EQUAL:
		return result == 0
	case pb.Compare_NOT_EQUAL:
		return result != 0
	case pb.Compare_GREATER:
		return result > 0
	case pb.Compare_LESS:
		return result < 0
	}
	return true
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// IsTxnReadonly reports whether rt has no put, delete or nested txn.
func IsTxnReadonly(rt *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{rt.Success, rt.Failure} {
		for _, u := range ops {
			if u.GetRequestRange() == nil {
				return false
			}
		}
	}
	return true
}

// IsTxnSerializable reports whether every op of rt is a serializable range.
func IsTxnSerializable(rt *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{rt.Success, rt.Failure} {
		for _, u := range ops {
			if r := u.GetRequestRange(); r == nil || !r.Serializable {
				return false
			}
		}
	}
	return true
}

// TxnRangeRevision returns the highest revision a range of rt asks to read
// at (0: every range reads at the txn's revision).
func TxnRangeRevision(rt *pb.TxnRequest) int64 {
	var rev int64
	for _, ops := range [][]*pb.RequestOp{rt.Success, rt.Failure} {
		for _, u := range ops {
			if r := u.GetRequestRange(); r != nil {
				rev = max(rev, r.Revision)
			}
		}
	}
	return rev
}

var latestRev int64 = math.MaxInt64
