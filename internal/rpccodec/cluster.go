package rpccodec

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Every call between nodes names the sender's cluster, and a node refuses
// calls from another cluster, as etcd's peers check X-Etcd-Cluster-ID: a
// member of an old cluster still running at an address a new cluster
// reuses (or a node pointed at the wrong peers) would otherwise feed its
// raft messages to groups of the same IDs in the other cluster, whose
// logs they do not match (raft panics: "tocommit(8) is out of range").

// ClusterHeader is the metadata key carrying the sender's cluster ID (hex).
const ClusterHeader = "brain-cluster-id"

// unnamedMethods may be called without a cluster ID: a joining node asks a
// member about the cluster before it knows the cluster's ID.
var unnamedMethods = map[string]bool{"/brain.Internal/Call": true}

// ClusterDialOptions make every call on a connection carry clusterID.
func ClusterDialOptions(clusterID uint64) []grpc.DialOption {
	id := strconv.FormatUint(clusterID, 16)
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(metadata.AppendToOutgoingContext(ctx, ClusterHeader, id), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(metadata.AppendToOutgoingContext(ctx, ClusterHeader, id), desc, cc, method, opts...)
		}),
	}
}

// ClusterServerOptions make a server refuse calls from another cluster
// than clusterID, and calls that do not name one (except those a joining
// node makes), with FailedPrecondition; refused (may be nil) hears of each
// refusal (from: the caller's cluster ID, "" if it named none).
func ClusterServerOptions(clusterID uint64, refused func(method, from string)) []grpc.ServerOption {
	check := func(ctx context.Context, method string) error {
		from, err := checkCluster(ctx, method, clusterID)
		if err != nil && refused != nil {
			refused(method, from)
		}
		return err
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if err := check(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if err := check(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return handler(srv, ss)
		}),
	}
}

func checkCluster(ctx context.Context, method string, clusterID uint64) (from string, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get(ClusterHeader)
	if len(vs) == 0 {
		if unnamedMethods[method] {
			return "", nil
		}
		return "", status.Errorf(codes.FailedPrecondition, "brain: %s without a cluster ID (this member is in cluster %x)", method, clusterID)
	}
	if got, err := strconv.ParseUint(vs[0], 16, 64); err != nil || got != clusterID {
		return vs[0], status.Error(codes.FailedPrecondition, ClusterMismatch(vs[0], clusterID))
	}
	return vs[0], nil
}

// ClusterMismatch is the message of a refused call from another cluster.
func ClusterMismatch(got string, want uint64) string {
	return fmt.Sprintf("brain: request cluster ID mismatch (request from cluster %s, this member is in cluster %x)", got, want)
}
