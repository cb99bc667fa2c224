package etcdcompat

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type clusterServer struct {
	pb.UnimplementedClusterServer
	s *Server
}

func (c *clusterServer) MemberList(ctx context.Context, r *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	resp := &pb.MemberListResponse{Header: &pb.ResponseHeader{}, Members: c.s.cfg.Members()}
	c.s.fill(resp.Header)
	return resp, nil
}

var errMembership = status.Error(codes.Unimplemented, "brain: this membership change is not supported; add nodes with MemberAdd or --join and remove them with MemberRemove")

func (c *clusterServer) MemberAdd(ctx context.Context, r *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	if c.s.cfg.MemberAdd == nil {
		return nil, errMembership
	}
	m, ms, err := c.s.cfg.MemberAdd(ctx, r)
	if err != nil {
		return nil, toGRPCError(err)
	}
	resp := &pb.MemberAddResponse{Header: &pb.ResponseHeader{}, Member: m, Members: ms}
	c.s.fill(resp.Header)
	return resp, nil
}
func (c *clusterServer) MemberRemove(ctx context.Context, r *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	if c.s.cfg.MemberRemove == nil {
		return nil, errMembership
	}
	ms, err := c.s.cfg.MemberRemove(ctx, r.ID)
	if err != nil {
		return nil, toGRPCError(err)
	}
	resp := &pb.MemberRemoveResponse{Header: &pb.ResponseHeader{}, Members: ms}
	c.s.fill(resp.Header)
	return resp, nil
}
func (c *clusterServer) MemberUpdate(context.Context, *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	return nil, errMembership
}
func (c *clusterServer) MemberPromote(context.Context, *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	return nil, errMembership
}
