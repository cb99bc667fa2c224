package etcdcompat

import (
	"context"
	"errors"
	"io"
	"sort"

	"github.com/brainkv/brain/meta"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

type leaseServer struct {
	pb.UnimplementedLeaseServer
	s *Server
}

func (l *leaseServer) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	resp, err := l.s.store.LeaseGrant(ctx, r)
	if err != nil {
		return nil, toGRPCError(err)
	}
	l.s.fill(resp.Header)
	return resp, nil
}

func (l *leaseServer) LeaseRevoke(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	resp, err := l.s.store.LeaseRevoke(ctx, r.ID)
	if err != nil {
		return nil, toGRPCError(err)
	}
	l.s.fill(resp.Header)
	return resp, nil
}

func (l *leaseServer) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	resp, err := l.s.store.LeaseTimeToLive(ctx, r)
	if errors.Is(err, meta.ErrLeaseNotFound) {
		// etcd answers an unknown lease with TTL -1, not an error.
		resp, err = &pb.LeaseTimeToLiveResponse{Header: &pb.ResponseHeader{}, ID: r.ID, TTL: -1}, nil
	}
	if err != nil {
		return nil, toGRPCError(err)
	}
	sort.Slice(resp.Keys, func(i, j int) bool { return string(resp.Keys[i]) < string(resp.Keys[j]) })
	l.s.fill(resp.Header)
	return resp, nil
}

func (l *leaseServer) LeaseLeases(ctx context.Context, r *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	resp := l.s.store.LeaseLeases()
	l.s.fill(resp.Header)
	return resp, nil
}

// LeaseKeepAlive renews leases as the client asks. Requests are read on a
// goroutine of their own, so that a stream whose context ends (the client
// went away, or leaderWatch cancelled a require-leader stream) returns at
// once, as etcd's does.
func (l *leaseServer) LeaseKeepAlive(stream pb.Lease_LeaseKeepAliveServer) error {
	ctx := stream.Context()
	reqs := make(chan *pb.LeaseKeepAliveRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		var req *pb.LeaseKeepAliveRequest
		select {
		case <-ctx.Done():
			return streamCause(ctx, ctx.Err())
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case req = <-reqs:
		}
		// The header is taken before the renewal, as etcd does, so a lease
		// revoked at revision R never looks renewed at a later revision.
		resp := &pb.LeaseKeepAliveResponse{ID: req.ID, Header: &pb.ResponseHeader{}}
		l.s.fill(resp.Header)
		ttl, err := l.s.store.LeaseRenew(ctx, req.ID)
		if errors.Is(err, meta.ErrLeaseNotFound) {
			ttl, err = 0, nil
		}
		if err != nil {
			return streamCause(ctx, toGRPCError(err))
		}
		resp.TTL = ttl
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}
