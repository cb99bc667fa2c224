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

var errMembership = status.Error(codes.Unimplemented, "brain: membership changes through the etcd Cluster API are not supported by this node; start new nodes with --initial-cluster")

func (c *clusterServer) MemberAdd(context.Context, *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	return nil, errMembership
}
func (c *clusterServer) MemberRemove(context.Context, *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	return nil, errMembership
}
func (c *clusterServer) MemberUpdate(context.Context, *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	return nil, errMembership
}
func (c *clusterServer) MemberPromote(context.Context, *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	return nil, errMembership
}

// authServer reports authentication as disabled; brain authenticates
// clients with TLS certificates instead of etcd users and roles.
type authServer struct {
	pb.UnimplementedAuthServer
	s *Server
}

func (a *authServer) AuthStatus(ctx context.Context, r *pb.AuthStatusRequest) (*pb.AuthStatusResponse, error) {
	resp := &pb.AuthStatusResponse{Header: &pb.ResponseHeader{}, Enabled: false}
	a.s.fill(resp.Header)
	return resp, nil
}
