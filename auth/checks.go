package auth

import (
	"context"
	"errors"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	etcdauth "go.etcd.io/etcd/server/v3/auth"
)

// The request checks, etcd's (apply_auth.go, v3_server.go, v3rpc): each
// is nil when auth is off. LeaseKeys returns the keys attached to a lease
// (none for a lease that does not exist).
type LeaseKeys func(ctx context.Context, lease int64) ([]string, error)

// CheckRange checks a read of [key, end).
func (s *Store) CheckRange(ctx context.Context, key, end []byte) (*etcdauth.AuthInfo, error) {
	if !s.Enabled() {
		return nil, nil
	}
	ai, err := s.authInfoOrEmpty(ctx)
	if err != nil {
		return nil, err
	}
	return ai, s.as.IsRangePermitted(ai, key, end)
}

// CheckStale is etcd's check after a serializable read: the auth state
// changed while it ran.
func (s *Store) CheckStale(ai *etcdauth.AuthInfo) error {
	if ai != nil && ai.Revision != 0 && ai.Revision != s.as.Revision() {
		return etcdauth.ErrAuthOldRevision
	}
	return nil
}

// CheckPut checks a put.
func (s *Store) CheckPut(ctx context.Context, r *pb.PutRequest, leaseKeys LeaseKeys) error {
	if !s.Enabled() {
		return nil
	}
	ai, err := s.authInfoOrEmpty(ctx)
	if err != nil {
		return err
	}
	return s.checkPut(ctx, ai, r, leaseKeys)
}

func (s *Store) checkPut(ctx context.Context, ai *etcdauth.AuthInfo, r *pb.PutRequest, leaseKeys LeaseKeys) error {
	if err := s.as.IsPutPermitted(ai, r.Key); err != nil {
		return err
	}
	if err := s.checkLeasePuts(ctx, ai, r.Lease, leaseKeys); err != nil {
		return err
	}
	if r.PrevKv {
		return s.as.IsRangePermitted(ai, r.Key, nil)
	}
	return nil
}

// checkLeasePuts: a lease already attached to a key the caller may not
// write cannot be attached to more (the caller could not revoke it).
func (s *Store) checkLeasePuts(ctx context.Context, ai *etcdauth.AuthInfo, lease int64, leaseKeys LeaseKeys) error {
	if lease == 0 || s.as.IsAdminPermitted(ai) == nil {
		return nil
	}
	keys, err := leaseKeys(ctx, lease)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := s.as.IsPutPermitted(ai, []byte(k)); err != nil {
			return err
		}
	}
	return nil
}

// CheckDelete checks a delete of [key, end).
func (s *Store) CheckDelete(ctx context.Context, r *pb.DeleteRangeRequest) error {
	if !s.Enabled() {
		return nil
	}
	ai, err := s.authInfoOrEmpty(ctx)
	if err != nil {
		return err
	}
	if err := s.as.IsDeleteRangePermitted(ai, r.Key, r.RangeEnd); err != nil {
		return err
	}
	if r.PrevKv {
		return s.as.IsRangePermitted(ai, r.Key, r.RangeEnd)
	}
	return nil
}

// CheckTxn checks a transaction: every compare's range is read, every
// operation checked as on its own, nested transactions too.
func (s *Store) CheckTxn(ctx context.Context, r *pb.TxnRequest, leaseKeys LeaseKeys) (*etcdauth.AuthInfo, error) {
	if !s.Enabled() {
		return nil, nil
	}
	ai, err := s.authInfoOrEmpty(ctx)
	if err != nil {
		return nil, err
	}
	return ai, s.checkTxn(ctx, ai, r, leaseKeys)
}

func (s *Store) checkTxn(ctx context.Context, ai *etcdauth.AuthInfo, r *pb.TxnRequest, leaseKeys LeaseKeys) error {
	for _, c := range r.Compare {
		if err := s.as.IsRangePermitted(ai, c.Key, c.RangeEnd); err != nil {
			return err
		}
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			var err error
			switch o := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
				if o.RequestRange != nil {
					err = s.as.IsRangePermitted(ai, o.RequestRange.Key, o.RequestRange.RangeEnd)
				}
			case *pb.RequestOp_RequestPut:
				if o.RequestPut != nil {
					err = s.checkPut(ctx, ai, o.RequestPut, leaseKeys)
				}
			case *pb.RequestOp_RequestDeleteRange:
				if d := o.RequestDeleteRange; d != nil {
					if d.PrevKv {
						err = s.as.IsRangePermitted(ai, d.Key, d.RangeEnd)
					}
					if err == nil {
						err = s.as.IsDeleteRangePermitted(ai, d.Key, d.RangeEnd)
					}
				}
			case *pb.RequestOp_RequestTxn:
				if o.RequestTxn != nil {
					err = s.checkTxn(ctx, ai, o.RequestTxn, leaseKeys)
				}
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// RequireUser is etcd's requireAuthInfo: with auth on, the request must
// name a user (lease grants, revokes, time-to-live, alarms list, status).
func (s *Store) RequireUser(ctx context.Context) error {
	if !s.Enabled() {
		return nil
	}
	ai, err := s.AuthInfo(ctx)
	if err != nil {
		return err
	}
	if ai == nil {
		return etcdauth.ErrUserEmpty
	}
	return nil
}

// CheckAdmin requires the root role (maintenance, membership).
func (s *Store) CheckAdmin(ctx context.Context) error {
	if !s.Enabled() {
		return nil
	}
	ai, err := s.AuthInfo(ctx)
	if err != nil {
		return err
	}
	return s.as.IsAdminPermitted(ai)
}

// CheckLeaseRevoke requires write permission on every key attached.
func (s *Store) CheckLeaseRevoke(ctx context.Context, lease int64, leaseKeys LeaseKeys) error {
	if err := s.RequireUser(ctx); err != nil || !s.Enabled() {
		return err
	}
	ai, err := s.authInfoOrEmpty(ctx)
	if err != nil {
		return err
	}
	return s.checkLeasePuts(ctx, ai, lease, leaseKeys)
}

// CheckLeaseKeys requires read permission on every key attached (a
// time-to-live that lists them).
func (s *Store) CheckLeaseKeys(ctx context.Context, lease int64, leaseKeys LeaseKeys) error {
	if err := s.RequireUser(ctx); err != nil || !s.Enabled() {
		return err
	}
	ai, err := s.authInfoOrEmpty(ctx)
	if err != nil {
		return err
	}
	if s.as.IsAdminPermitted(ai) == nil {
		return nil
	}
	keys, err := leaseKeys(ctx, lease)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := s.as.IsRangePermitted(ai, []byte(k), []byte{}); err != nil {
			return err
		}
	}
	return nil
}

// WatchCancelReason checks a watch of [key, end) and returns, when it is
// refused, the cancel reason etcd gives (v3rpc/watch.go), or "".
func (s *Store) WatchCancelReason(ctx context.Context, key, end []byte) string {
	if !s.Enabled() {
		return ""
	}
	_, err := s.CheckRange(ctx, key, end)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, etcdauth.ErrInvalidAuthToken):
		return rpctypes.ErrGRPCInvalidAuthToken.Error()
	case errors.Is(err, etcdauth.ErrAuthOldRevision):
		return rpctypes.ErrGRPCAuthOldRevision.Error()
	case errors.Is(err, etcdauth.ErrUserEmpty):
		return rpctypes.ErrGRPCUserEmpty.Error()
	}
	return rpctypes.ErrGRPCPermissionDenied.Error()
}

// errorTable is etcd's (v3rpc/util.go) for the auth errors.
var errorTable = []struct{ err, grpc error }{
	{etcdauth.ErrRootUserNotExist, rpctypes.ErrGRPCRootUserNotExist},
	{etcdauth.ErrRootRoleNotExist, rpctypes.ErrGRPCRootRoleNotExist},
	{etcdauth.ErrUserAlreadyExist, rpctypes.ErrGRPCUserAlreadyExist},
	{etcdauth.ErrUserEmpty, rpctypes.ErrGRPCUserEmpty},
	{etcdauth.ErrUserNotFound, rpctypes.ErrGRPCUserNotFound},
	{etcdauth.ErrRoleAlreadyExist, rpctypes.ErrGRPCRoleAlreadyExist},
	{etcdauth.ErrRoleNotFound, rpctypes.ErrGRPCRoleNotFound},
	{etcdauth.ErrRoleEmpty, rpctypes.ErrGRPCRoleEmpty},
	{etcdauth.ErrAuthFailed, rpctypes.ErrGRPCAuthFailed},
	{etcdauth.ErrPermissionNotGiven, rpctypes.ErrGRPCPermissionNotGiven},
	{etcdauth.ErrPermissionDenied, rpctypes.ErrGRPCPermissionDenied},
	{etcdauth.ErrRoleNotGranted, rpctypes.ErrGRPCRoleNotGranted},
	{etcdauth.ErrPermissionNotGranted, rpctypes.ErrGRPCPermissionNotGranted},
	{etcdauth.ErrAuthNotEnabled, rpctypes.ErrGRPCAuthNotEnabled},
	{etcdauth.ErrInvalidAuthToken, rpctypes.ErrGRPCInvalidAuthToken},
	{etcdauth.ErrInvalidAuthMgmt, rpctypes.ErrGRPCInvalidAuthMgmt},
	{etcdauth.ErrAuthOldRevision, rpctypes.ErrGRPCAuthOldRevision},
}

// allErrors are the auth package's errors that cross nodes by message.
var allErrors = []error{
	etcdauth.ErrRootUserNotExist, etcdauth.ErrRootRoleNotExist, etcdauth.ErrUserAlreadyExist,
	etcdauth.ErrUserEmpty, etcdauth.ErrUserNotFound, etcdauth.ErrRoleAlreadyExist,
	etcdauth.ErrRoleNotFound, etcdauth.ErrRoleEmpty, etcdauth.ErrPermissionNotGiven,
	etcdauth.ErrAuthFailed, etcdauth.ErrNoPasswordUser, etcdauth.ErrPermissionDenied,
	etcdauth.ErrRoleNotGranted, etcdauth.ErrPermissionNotGranted, etcdauth.ErrAuthNotEnabled,
	etcdauth.ErrAuthOldRevision, etcdauth.ErrInvalidAuthToken, etcdauth.ErrInvalidAuthOpts,
	etcdauth.ErrInvalidAuthMgmt, etcdauth.ErrInvalidAuthMethod, etcdauth.ErrMissingKey,
	etcdauth.ErrKeyMismatch, etcdauth.ErrVerifyOnly,
}

// FromMessage returns the auth error whose message err carries (an error
// that came back from another node as text), or err.
func FromMessage(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, e := range allErrors {
		if msg == e.Error() || strings.HasSuffix(msg, ": "+e.Error()) {
			return e
		}
	}
	return err
}

// ToGRPC returns etcd's gRPC error for an auth error (false: err is no
// auth error).
func ToGRPC(err error) (error, bool) {
	for _, e := range errorTable {
		if errors.Is(err, e.err) {
			return e.grpc, true
		}
	}
	return nil, false
}

// ErrNotConfigured: the node was built without an auth store (tests).
var ErrNotConfigured = errors.New("auth: not configured on this node")
