package kvapi

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/brainkv/brain/meta"

	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/tso"
	gogoproto "github.com/gogo/protobuf/proto"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// HandleCall implements Handler: it executes another node's call on this
// node's replicas, answering NotLeader where a leader is needed and this
// replica is not it, and ErrNoReplica (retried elsewhere) where the
// replica stopped under the call.
func (s *Store) HandleCall(ctx context.Context, req *CallRequest) ([]byte, error) {
	res, err := s.handleCall(ctx, req)
	if errors.Is(err, partition.ErrReplicaClosed) {
		err = ErrNoReplica
	}
	return res, err
}

func (s *Store) handleCall(ctx context.Context, req *CallRequest) ([]byte, error) {
	if req.Op == OpClusterInfo {
		if s.clusterInfo == nil {
			return nil, errCorruptCall
		}
		return s.clusterInfo()
	}
	if req.Op == OpGroupInfo {
		st, ok := s.groupStatus(req.Group)
		if !ok {
			return nil, ErrNoReplica
		}
		if !st.IsLeader {
			return nil, partition.ErrNotLeader
		}
		return encodeGroupInfo(GroupInfo{Leader: s.self, Voters: st.Voters, Learners: st.Learners}), nil
	}
	switch req.Group {
	case TSOGroup:
		return s.handleTSO(ctx, req)
	case MetaGroup:
		return s.handleMeta(ctx, req)
	}
	p := s.Local(req.Group)
	if p == nil {
		return nil, ErrNoReplica
	}
	switch req.Op {
	case OpTxn, OpPut, OpDeleteRange, OpDeleteByLease, OpCompact, OpSplit:
		if !p.IsLeader() {
			return nil, partition.ErrNotLeader
		}
	}
	switch req.Op {
	case OpTxn:
		var r pb.TxnRequest
		if err := r.Unmarshal(req.Args); err != nil {
			return nil, err
		}
		resp, err := p.Txn(ctx, &r)
		return marshal(resp, err)
	case OpPut:
		var r pb.PutRequest
		if err := r.Unmarshal(req.Args); err != nil {
			return nil, err
		}
		resp, err := p.Put(ctx, &r)
		return marshal(resp, err)
	case OpDeleteRange:
		var r pb.DeleteRangeRequest
		if err := r.Unmarshal(req.Args); err != nil {
			return nil, err
		}
		resp, err := p.DeleteRange(ctx, &r)
		return marshal(resp, err)
	case OpDeleteByLease:
		v, rest, err := readInts(req.Args, 1)
		if err != nil {
			return nil, err
		}
		start, end, err := readSpan(rest)
		if err != nil {
			return nil, err
		}
		_, rev, err := p.DeleteByLease(ctx, v[0])
		if err == nil && !p.Covers(start, end) {
			err = partition.ErrOutsideRange
		}
		return ints(rev), err
	case OpCompact:
		v, _, err := readInts(req.Args, 1)
		if err != nil {
			return nil, err
		}
		return nil, p.Compact(ctx, v[0])
	case OpSplit:
		v, key, err := readInts(req.Args, 1)
		if err != nil {
			return nil, err
		}
		return nil, s.splitLocal(ctx, p, key, uint64(v[0]))
	case OpRequestClose:
		v, _, err := readInts(req.Args, 1)
		if err != nil {
			return nil, err
		}
		if !p.IsLeader() {
			return nil, partition.ErrNotLeader
		}
		p.RequestClose(v[0])
		return nil, nil
	case OpReadTxn:
		v, rest, err := readInts(req.Args, 1)
		if err != nil {
			return nil, err
		}
		var r pb.TxnRequest
		if err := r.Unmarshal(rest); err != nil {
			return nil, err
		}
		resp, err := p.ReadTxn(ctx, &r, v[0])
		return marshal(resp, err)
	case OpScan:
		key, end, rev, o, err := decodeScan(req.Args)
		if err != nil {
			return nil, err
		}
		kvs, n, err := p.Scan(ctx, key, end, rev, o)
		if err != nil {
			return nil, err
		}
		return (&pb.RangeResponse{Kvs: kvs, Count: n}).Marshal()
	case OpEvents:
		v, rest, err := readInts(req.Args, 3)
		if err != nil {
			return nil, err
		}
		r := reader{b: rest}
		key, end := r.chunk(), r.chunk()
		if r.err != nil {
			return nil, r.err
		}
		// The caller's hub knows the range is closed; this replica may lag.
		if err := p.WaitClosed(ctx, v[1]); err != nil {
			return nil, err
		}
		evs, next, more, err := p.Events(v[0], v[1], key, end, int(v[2]))
		if err != nil {
			return nil, err
		}
		m := int64(0)
		if more {
			m = 1
		}
		return appendRevEvents(ints(next, m), evs)
	case OpPrevValue:
		v, key, err := readInts(req.Args, 1)
		if err != nil {
			return nil, err
		}
		// The version exists once rev applied here (this replica may lag).
		if err := p.WaitClosed(ctx, v[0]); err != nil {
			return nil, err
		}
		return p.PrevValue(key, v[0])
	case OpLeaseKeys:
		v, rest, err := readInts(req.Args, 1)
		if err != nil {
			return nil, err
		}
		start, end, err := readSpan(rest)
		if err != nil {
			return nil, err
		}
		keys, err := p.LeaseKeys(v[0])
		if err == nil && !p.Covers(start, end) {
			err = partition.ErrOutsideRange
		}
		if err != nil {
			return nil, err
		}
		resp := &pb.RangeResponse{}
		for _, k := range keys {
			resp.Kvs = append(resp.Kvs, &mvccpb.KeyValue{Key: k})
		}
		return resp.Marshal()
	}
	return nil, errCorruptCall
}

// readSpan decodes a span appended by appendSpan (end as a range end).
func readSpan(b []byte) (start, end []byte, err error) {
	r := reader{b: b}
	start, end = r.chunk(), r.chunk()
	return start, spanEnd(end), r.err
}

func (s *Store) handleTSO(ctx context.Context, req *CallRequest) ([]byte, error) {
	if s.oracle == nil || !s.oracle.Serving() {
		return nil, tso.ErrNotLeader
	}
	switch req.Op {
	case OpTSONext:
		v, _, err := readInts(req.Args, 1)
		if err != nil {
			return nil, err
		}
		first, err := s.oracle.Next(ctx, v[0])
		if err != nil {
			return nil, err
		}
		return ints(first, s.oracle.Current()), nil
	case OpTSOCurrent:
		cur, err := s.oracle.ConfirmedCurrent(ctx)
		return ints(cur), err
	}
	return nil, errCorruptCall
}

func (s *Store) handleMeta(ctx context.Context, req *CallRequest) ([]byte, error) {
	m := s.meta
	if !m.IsLeader() {
		return nil, partition.ErrNotLeader
	}
	switch req.Op {
	case OpMetaGrant:
		v, _, err := readInts(req.Args, 2)
		if err != nil {
			return nil, err
		}
		id, ttl, err := m.Grant(ctx, v[0], v[1])
		return ints(id, ttl), err
	case OpMetaStartRevoke, OpMetaFinishRevoke, OpMetaRenew, OpMetaTimeToLive, OpMetaSetCompact:
		v, _, err := readInts(req.Args, 1)
		if err != nil {
			return nil, err
		}
		switch req.Op {
		case OpMetaStartRevoke:
			return nil, m.StartRevoke(ctx, v[0])
		case OpMetaFinishRevoke:
			return nil, m.FinishRevoke(ctx, v[0])
		case OpMetaRenew:
			ttl, err := m.Renew(v[0])
			return ints(ttl), err
		case OpMetaTimeToLive:
			rem, granted, err := m.TimeToLive(v[0])
			return ints(rem, granted), err
		default:
			return nil, m.SetCompact(ctx, v[0])
		}
	case OpMetaSetAlarm:
		v, _, err := readInts(req.Args, 3)
		if err != nil {
			return nil, err
		}
		return nil, m.SetAlarm(ctx, v[0] == 1, uint64(v[1]), pb.AlarmType(v[2]))
	case OpMetaReadIndex:
		idx, err := m.ReadIndex(ctx)
		return ints(int64(idx)), err
	case OpMetaSetMember:
		var mem meta.Member
		if err := json.Unmarshal(req.Args, &mem); err != nil {
			return nil, errCorruptCall
		}
		return nil, m.SetMember(ctx, mem)
	case OpMetaAllocPartition:
		id, err := m.AllocPartitionID(ctx)
		return ints(int64(id)), err
	case OpMetaAuth:
		var r pb.InternalRaftRequest
		if err := r.Unmarshal(req.Args); err != nil {
			return nil, errCorruptCall
		}
		resp, err := m.ProposeAuth(ctx, &r)
		if err != nil {
			return nil, err
		}
		return gogoproto.Marshal(resp)
	case OpMetaRecordSplits:
		var splits []meta.Split
		if err := json.Unmarshal(req.Args, &splits); err != nil {
			return nil, errCorruptCall
		}
		return nil, m.RecordSplits(ctx, splits)
	}
	return nil, errCorruptCall
}

// LeaderOf implements Handler: the leader a "not leader" answer names.
// It never names this node, which has just found it does not lead group
// although gossip may still say it does (its claim outlives a step-down
// until its next publication reaches the peers): naming itself would send
// the caller straight back.
func (s *Store) LeaderOf(group uint64) uint64 {
	if s.leaderHint == nil {
		return 0
	}
	if l := s.leaderHint(group); l != s.self {
		return l
	}
	return 0
}

type marshaler interface{ Marshal() ([]byte, error) }

func marshal(m marshaler, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	return m.Marshal()
}
