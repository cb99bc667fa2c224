package etcdcompat

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/raftgroup"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestErrorsAsEtcd checks internal errors, wrapped or not, come out as
// etcd's errors, with the codes etcd clients retry on.
func TestErrorsAsEtcd(t *testing.T) {
	for _, c := range []struct {
		err  error
		want error
		code codes.Code
	}{
		{partition.ErrCompacted, rpctypes.ErrGRPCCompacted, codes.OutOfRange},
		{fmt.Errorf("range: %w", partition.ErrFutureRev), rpctypes.ErrGRPCFutureRev, codes.OutOfRange},
		{raftgroup.ErrLeaderChanged, rpctypes.ErrGRPCLeaderChanged, codes.Unavailable},
		{partition.ErrRetriesExhausted, rpctypes.ErrGRPCTimeout, codes.Unavailable},
		{context.DeadlineExceeded, rpctypes.ErrGRPCTimeout, codes.Unavailable},
		{kvapi.ErrNoLeader, rpctypes.ErrGRPCNoLeader, codes.Unavailable},
		{fmt.Errorf("scan: %w", partition.ErrReplicaClosed), rpctypes.ErrGRPCNoLeader, codes.Unavailable},
	} {
		got := toGRPCError(c.err)
		if !errors.Is(got, c.want) || status.Code(got) != c.code {
			t.Errorf("%v: got %v (%s), want %v (%s)", c.err, got, status.Code(got), c.want, c.code)
		}
	}
	if got := toGRPCError(errors.New("boom")); status.Code(got) != codes.Unknown {
		t.Errorf("an unmapped error: got %v, want code Unknown", got)
	}
}
