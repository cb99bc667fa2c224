package etcdcompat

import (
	"context"
	"errors"

	"github.com/brainkv/brain/auth"
	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/raftgroup"
	"github.com/brainkv/brain/tso"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errorTable maps internal errors to the exact gRPC errors etcd returns, as
// etcd's v3rpc toGRPCErrorMap does: etcd clients match on them.
var errorTable = []struct {
	err  error
	grpc error
}{
	{partition.ErrCompacted, rpctypes.ErrGRPCCompacted},
	{partition.ErrFutureRev, rpctypes.ErrGRPCFutureRev},
	{partition.ErrKeyNotFound, rpctypes.ErrGRPCKeyNotFound},
	{partition.ErrLeaseNotFound, rpctypes.ErrGRPCLeaseNotFound},
	{meta.ErrLeaseNotFound, rpctypes.ErrGRPCLeaseNotFound},
	{meta.ErrLeaseExists, rpctypes.ErrGRPCLeaseExist},
	{meta.ErrLeaseTTLTooLarge, rpctypes.ErrGRPCLeaseTTLTooLarge},
	{kvapi.ErrNoSpace, rpctypes.ErrGRPCNoSpace},
	{partition.ErrLeaderChanged, rpctypes.ErrGRPCLeaderChanged},
	{raftgroup.ErrLeaderChanged, rpctypes.ErrGRPCLeaderChanged},
	{meta.ErrStaleTerm, rpctypes.ErrGRPCLeaderChanged},
	{partition.ErrNotLeader, rpctypes.ErrGRPCNoLeader},
	{raftgroup.ErrNotLeader, rpctypes.ErrGRPCNoLeader},
	{meta.ErrNotLeader, rpctypes.ErrGRPCNoLeader},
	{tso.ErrNotLeader, rpctypes.ErrGRPCNoLeader},
	// No leader reachable in time, or a replica that stopped under a read
	// that had no other replica to go to: etcd's "no leader", which
	// clients retry.
	{kvapi.ErrNoLeader, rpctypes.ErrGRPCNoLeader},
	{kvapi.ErrNoReplica, rpctypes.ErrGRPCNoLeader},
	{partition.ErrReplicaClosed, rpctypes.ErrGRPCNoLeader},
	{raftgroup.ErrStopped, rpctypes.ErrGRPCStopped},
	{context.DeadlineExceeded, rpctypes.ErrGRPCTimeout},
	{partition.ErrRetriesExhausted, rpctypes.ErrGRPCTimeout},
}

// toGRPCError converts an internal error to the error etcd would return.
func toGRPCError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if g, ok := auth.ToGRPC(err); ok {
		return g
	}
	var cross *kvapi.CrossPartitionError
	if errors.As(err, &cross) {
		return status.Error(codes.InvalidArgument, cross.Error())
	}
	for _, e := range errorTable {
		if errors.Is(err, e.err) {
			return e.grpc
		}
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, context.Canceled.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// transient reports whether err is one etcd clients retry: etcd's answer
// for it is Unavailable (no leader, leader changed, a timeout, a stopping
// member).
func transient(err error) bool {
	return status.Code(toGRPCError(err)) == codes.Unavailable
}
