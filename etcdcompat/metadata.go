package etcdcompat

import (
	"context"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/metadata"
)

func requireLeader(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return false
	}
	ks := md[rpctypes.MetadataRequireLeaderKey]
	return len(ks) > 0 && ks[0] == rpctypes.MetadataHasLeader
}
