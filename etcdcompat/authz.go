package etcdcompat

import (
	"context"
	"errors"

	"github.com/brainkv/brain/auth"
	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	gogoproto "github.com/gogo/protobuf/proto"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	etcdauth "go.etcd.io/etcd/server/v3/auth"
	"google.golang.org/grpc"
)

// etcd's auth: the Auth service, and the permission checks of every other
// call (authUnary, authStream, and the watch's in watchStream.create), as
// etcd makes them, with its errors. Changes go through the meta group
// (kvapi.Store.Auth); the checks read this node's copy of the auth state
// (package auth).

// authUnary checks a unary call's permission before it runs. Requests
// etcd refuses as malformed are left to their handler, so their errors
// come first, as in etcd.
func (s *Server) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	a := s.cfg.Auth
	if a == nil {
		return handler(ctx, req)
	}
	switch req.(type) {
	case *pb.LeaseKeepAliveRequest, *pb.LeaseLeasesRequest, *pb.MemberListRequest, *pb.CompactionRequest:
	default:
		if _, isAuth := authMethods[info.FullMethod]; !isAuth {
			if err := a.Fresh(ctx); err != nil {
				return nil, toGRPCError(err)
			}
		}
	}
	if !a.Enabled() {
		return handler(ctx, req)
	}
	var ai *etcdauth.AuthInfo
	var err error
	leaseKeys := s.leaseKeys
	switch r := req.(type) {
	case *pb.RangeRequest:
		if checkRangeRequest(r) == nil {
			ai, err = a.CheckRange(ctx, r.Key, r.RangeEnd)
		}
	case *pb.PutRequest:
		if checkPutRequest(r) == nil {
			err = a.CheckPut(ctx, r, leaseKeys)
		}
	case *pb.DeleteRangeRequest:
		if checkDeleteRequest(r) == nil {
			err = a.CheckDelete(ctx, r)
		}
	case *pb.TxnRequest:
		if checkTxnRequest(r, s.cfg.MaxTxnOps) == nil {
			ai, err = a.CheckTxn(ctx, r, leaseKeys)
			if !readOnlyTxn(r) {
				ai = nil
			}
		}
	case *pb.LeaseGrantRequest:
		err = a.RequireUser(ctx)
	case *pb.LeaseRevokeRequest:
		err = a.CheckLeaseRevoke(ctx, r.ID, leaseKeys)
	case *pb.LeaseTimeToLiveRequest:
		if err = a.RequireUser(ctx); err == nil && r.Keys {
			err = a.CheckLeaseKeys(ctx, r.ID, leaseKeys)
		}
	case *pb.AlarmRequest:
		if r.Action == pb.AlarmRequest_GET {
			err = a.RequireUser(ctx)
		} else {
			err = a.CheckAdmin(ctx)
		}
	case *pb.StatusRequest:
		err = a.RequireUser(ctx)
	case *pb.DefragmentRequest, *pb.HashRequest, *pb.HashKVRequest, *pb.MoveLeaderRequest, *pb.DowngradeRequest,
		*pb.MemberAddRequest, *pb.MemberRemoveRequest, *pb.MemberUpdateRequest, *pb.MemberPromoteRequest:
		err = a.CheckAdmin(ctx)
	}
	if err != nil {
		return nil, toGRPCError(err)
	}
	resp, err := handler(ctx, req)
	if err == nil && ai != nil {
		// etcd's doSerialize: the auth state changed while it read.
		if err := a.CheckStale(ai); err != nil {
			return nil, toGRPCError(err)
		}
	}
	return resp, err
}

// authStream checks a stream's permission (a snapshot needs the root
// role; watches are checked as they are created).
func (s *Server) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if a := s.cfg.Auth; a != nil && info.FullMethod == "/etcdserverpb.Maintenance/Snapshot" {
		if err := a.Fresh(ss.Context()); err != nil {
			return toGRPCError(err)
		}
		if err := a.CheckAdmin(ss.Context()); err != nil {
			return toGRPCError(err)
		}
	}
	return handler(srv, ss)
}

// authMethods are the Auth service's calls: they go through the meta
// group's log and are checked when applied.
var authMethods = func() map[string]struct{} {
	m := map[string]struct{}{}
	for _, name := range []string{"AuthEnable", "AuthDisable", "AuthStatus", "Authenticate", "UserAdd", "UserGet",
		"UserList", "UserDelete", "UserChangePassword", "UserGrantRole", "UserRevokeRole", "RoleAdd", "RoleGet",
		"RoleList", "RoleDelete", "RoleGrantPermission", "RoleRevokePermission"} {
		m["/etcdserverpb.Auth/"+name] = struct{}{}
	}
	return m
}()

// readOnlyTxn reports whether a txn only reads.
func readOnlyTxn(r *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			switch o := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
			case *pb.RequestOp_RequestTxn:
				if o.RequestTxn != nil && !readOnlyTxn(o.RequestTxn) {
					return false
				}
			default:
				return false
			}
		}
	}
	return true
}

// leaseKeys lists the keys attached to a lease.
func (s *Server) leaseKeys(ctx context.Context, lease int64) ([]string, error) {
	resp, err := s.store.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: lease, Keys: true})
	if errors.Is(err, meta.ErrLeaseNotFound) || errors.Is(err, partition.ErrLeaseNotFound) {
		return nil, nil // no such lease: nothing attached
	}
	if err != nil {
		return nil, err // unknown: the check must not pass on it
	}
	out := make([]string, len(resp.Keys))
	for i, k := range resp.Keys {
		out[i] = string(k)
	}
	return out, nil
}

// authServer is etcd's Auth service.
type authServer struct {
	pb.UnimplementedAuthServer
	s *Server
}

// change proposes an auth change and returns its response with the
// header filled.
func (a *authServer) change(ctx context.Context, r *pb.InternalRaftRequest) (gogoproto.Message, error) {
	as := a.s.cfg.Auth
	if as == nil {
		return nil, toGRPCError(auth.ErrNotConfigured)
	}
	if err := as.Prepare(ctx, r); err != nil {
		return nil, toGRPCError(err)
	}
	resp, err := a.s.store.Auth(ctx, r, auth.ResponseFor(r))
	if err != nil {
		return nil, toGRPCError(auth.FromMessage(err))
	}
	if h, ok := resp.(interface{ GetHeader() *pb.ResponseHeader }); ok {
		hdr := h.GetHeader()
		if hdr == nil {
			hdr = &pb.ResponseHeader{}
			setHeader(resp, hdr)
		}
		a.s.fill(hdr)
	}
	return resp, nil
}

// setHeader sets the Header field of an auth response.
func setHeader(m gogoproto.Message, h *pb.ResponseHeader) {
	switch r := m.(type) {
	case *pb.AuthEnableResponse:
		r.Header = h
	case *pb.AuthDisableResponse:
		r.Header = h
	case *pb.AuthStatusResponse:
		r.Header = h
	case *pb.AuthenticateResponse:
		r.Header = h
	case *pb.AuthUserAddResponse:
		r.Header = h
	case *pb.AuthUserDeleteResponse:
		r.Header = h
	case *pb.AuthUserChangePasswordResponse:
		r.Header = h
	case *pb.AuthUserGrantRoleResponse:
		r.Header = h
	case *pb.AuthUserRevokeRoleResponse:
		r.Header = h
	case *pb.AuthUserGetResponse:
		r.Header = h
	case *pb.AuthUserListResponse:
		r.Header = h
	case *pb.AuthRoleAddResponse:
		r.Header = h
	case *pb.AuthRoleDeleteResponse:
		r.Header = h
	case *pb.AuthRoleGrantPermissionResponse:
		r.Header = h
	case *pb.AuthRoleRevokePermissionResponse:
		r.Header = h
	case *pb.AuthRoleGetResponse:
		r.Header = h
	case *pb.AuthRoleListResponse:
		r.Header = h
	}
}

func changeAs[T gogoproto.Message](a *authServer, ctx context.Context, r *pb.InternalRaftRequest) (T, error) {
	var zero T
	resp, err := a.change(ctx, r)
	if err != nil {
		return zero, err
	}
	return resp.(T), nil
}

func (a *authServer) AuthEnable(ctx context.Context, r *pb.AuthEnableRequest) (*pb.AuthEnableResponse, error) {
	return changeAs[*pb.AuthEnableResponse](a, ctx, &pb.InternalRaftRequest{AuthEnable: r})
}

func (a *authServer) AuthDisable(ctx context.Context, r *pb.AuthDisableRequest) (*pb.AuthDisableResponse, error) {
	return changeAs[*pb.AuthDisableResponse](a, ctx, &pb.InternalRaftRequest{AuthDisable: r})
}

func (a *authServer) AuthStatus(ctx context.Context, r *pb.AuthStatusRequest) (*pb.AuthStatusResponse, error) {
	return changeAs[*pb.AuthStatusResponse](a, ctx, &pb.InternalRaftRequest{AuthStatus: r})
}

// Authenticate checks the password on this node, then proposes the token's
// assignment (every node learns a simple token so), as etcd does; if the
// auth state changed in between, it checks again.
func (a *authServer) Authenticate(ctx context.Context, r *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	as := a.s.cfg.Auth
	if as == nil {
		return nil, toGRPCError(auth.ErrNotConfigured)
	}
	defer func() { r.Password = "" }()
	if err := as.Sync(ctx); err != nil {
		return nil, toGRPCError(err)
	}
	for {
		req, checked, err := as.PrepareAuthenticate(r)
		if err != nil {
			return nil, toGRPCError(err)
		}
		resp, err := a.s.store.Auth(ctx, req, auth.ResponseFor(req))
		if err != nil {
			return nil, toGRPCError(auth.FromMessage(err))
		}
		if checked == as.Revision() {
			out := resp.(*pb.AuthenticateResponse)
			if out.Header == nil {
				out.Header = &pb.ResponseHeader{}
			}
			a.s.fill(out.Header)
			return out, nil
		}
	}
}

func (a *authServer) UserAdd(ctx context.Context, r *pb.AuthUserAddRequest) (*pb.AuthUserAddResponse, error) {
	return changeAs[*pb.AuthUserAddResponse](a, ctx, &pb.InternalRaftRequest{AuthUserAdd: r})
}

func (a *authServer) UserGet(ctx context.Context, r *pb.AuthUserGetRequest) (*pb.AuthUserGetResponse, error) {
	return changeAs[*pb.AuthUserGetResponse](a, ctx, &pb.InternalRaftRequest{AuthUserGet: r})
}

func (a *authServer) UserList(ctx context.Context, r *pb.AuthUserListRequest) (*pb.AuthUserListResponse, error) {
	return changeAs[*pb.AuthUserListResponse](a, ctx, &pb.InternalRaftRequest{AuthUserList: r})
}

func (a *authServer) UserDelete(ctx context.Context, r *pb.AuthUserDeleteRequest) (*pb.AuthUserDeleteResponse, error) {
	return changeAs[*pb.AuthUserDeleteResponse](a, ctx, &pb.InternalRaftRequest{AuthUserDelete: r})
}

func (a *authServer) UserChangePassword(ctx context.Context, r *pb.AuthUserChangePasswordRequest) (*pb.AuthUserChangePasswordResponse, error) {
	return changeAs[*pb.AuthUserChangePasswordResponse](a, ctx, &pb.InternalRaftRequest{AuthUserChangePassword: r})
}

func (a *authServer) UserGrantRole(ctx context.Context, r *pb.AuthUserGrantRoleRequest) (*pb.AuthUserGrantRoleResponse, error) {
	return changeAs[*pb.AuthUserGrantRoleResponse](a, ctx, &pb.InternalRaftRequest{AuthUserGrantRole: r})
}

func (a *authServer) UserRevokeRole(ctx context.Context, r *pb.AuthUserRevokeRoleRequest) (*pb.AuthUserRevokeRoleResponse, error) {
	return changeAs[*pb.AuthUserRevokeRoleResponse](a, ctx, &pb.InternalRaftRequest{AuthUserRevokeRole: r})
}

func (a *authServer) RoleAdd(ctx context.Context, r *pb.AuthRoleAddRequest) (*pb.AuthRoleAddResponse, error) {
	return changeAs[*pb.AuthRoleAddResponse](a, ctx, &pb.InternalRaftRequest{AuthRoleAdd: r})
}

func (a *authServer) RoleGet(ctx context.Context, r *pb.AuthRoleGetRequest) (*pb.AuthRoleGetResponse, error) {
	return changeAs[*pb.AuthRoleGetResponse](a, ctx, &pb.InternalRaftRequest{AuthRoleGet: r})
}

func (a *authServer) RoleList(ctx context.Context, r *pb.AuthRoleListRequest) (*pb.AuthRoleListResponse, error) {
	return changeAs[*pb.AuthRoleListResponse](a, ctx, &pb.InternalRaftRequest{AuthRoleList: r})
}

func (a *authServer) RoleDelete(ctx context.Context, r *pb.AuthRoleDeleteRequest) (*pb.AuthRoleDeleteResponse, error) {
	return changeAs[*pb.AuthRoleDeleteResponse](a, ctx, &pb.InternalRaftRequest{AuthRoleDelete: r})
}

func (a *authServer) RoleGrantPermission(ctx context.Context, r *pb.AuthRoleGrantPermissionRequest) (*pb.AuthRoleGrantPermissionResponse, error) {
	return changeAs[*pb.AuthRoleGrantPermissionResponse](a, ctx, &pb.InternalRaftRequest{AuthRoleGrantPermission: r})
}

func (a *authServer) RoleRevokePermission(ctx context.Context, r *pb.AuthRoleRevokePermissionRequest) (*pb.AuthRoleRevokePermissionResponse, error) {
	return changeAs[*pb.AuthRoleRevokePermissionResponse](a, ctx, &pb.InternalRaftRequest{AuthRoleRevokePermission: r})
}
