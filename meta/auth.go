package meta

import (
	"context"
	"encoding/binary"
	"errors"

	"github.com/brainkv/brain/raftgroup"
	"github.com/gogo/protobuf/proto"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
)

// ErrNoAuth: this node has no auth store to apply auth changes with.
var ErrNoAuth = errors.New("meta: auth is not configured")

// ProposeAuth proposes one of etcd's auth changes (prepared by package
// auth: its header names the caller, its passwords hashed) and returns
// its response once applied.
func (m *Meta) ProposeAuth(ctx context.Context, r *pb.InternalRaftRequest) (proto.Message, error) {
	if m.cfg.Auth == nil {
		return nil, ErrNoAuth
	}
	payload, err := r.Marshal()
	if err != nil {
		return nil, err
	}
	res, err := m.proposePayload(ctx, cmdAuth, payload)
	if err != nil {
		return nil, err
	}
	return res.resp, nil
}

func (m *Meta) applyAuth(ac *raftgroup.ApplyContext, e *raftpb.Entry, cmd []byte) any {
	if term := binary.BigEndian.Uint64(cmd[1:9]); term != e.Term {
		return result{err: ErrStaleTerm}
	}
	if m.cfg.Auth == nil {
		return result{err: ErrNoAuth}
	}
	var r pb.InternalRaftRequest
	if err := r.Unmarshal(cmd[9:]); err != nil {
		m.log.Error("malformed auth command; rejected", "index", e.Index)
		return result{err: errors.New("meta: malformed auth command")}
	}
	resp, err := m.cfg.Auth.Apply(ac.Batch, e.Index, &r)
	return result{resp: resp, err: err}
}
