package auth

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/gogo/protobuf/proto"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	etcdauth "go.etcd.io/etcd/server/v3/auth"
	"golang.org/x/crypto/bcrypt"
)

// Config configures a node's Store.
type Config struct {
	// DB is the node's store; MetaGroup the meta raft group whose key
	// range holds the auth state.
	DB        *pebble.DB
	MetaGroup uint64
	// Token is etcd's --auth-token: "simple" (the default) or
	// "jwt,pub-key=...,priv-key=...,sign-method=...[,ttl=...]".
	Token string
	// TokenTTL is etcd's --auth-token-ttl for simple tokens; default 300 s.
	TokenTTL time.Duration
	// BcryptCost is etcd's --bcrypt-cost; default bcrypt's (10).
	BcryptCost int
	// ClientCertAuth (etcd's --client-cert-auth): a request without a
	// token is the user its client certificate's common name names.
	ClientCertAuth bool
	// Applied returns the meta group's applied index on this node (a
	// simple token is valid here once its index is applied).
	Applied func() uint64
	// ReadIndex returns the meta group's commit index confirmed by its
	// leader (Fresh; nil: no barrier, tests).
	ReadIndex func(ctx context.Context) (uint64, error)
	Logger    *slog.Logger
}

// Store is a node's copy of the cluster's auth state and its checks.
type Store struct {
	cfg Config
	be  *backend
	as  etcdauth.AuthStore
	log *slog.Logger

	// applyMu serialises Apply (etcd's authApplierV3.mu).
	applyMu sync.Mutex
	// appliedc is closed and replaced whenever an auth entry is applied
	// (simple tokens wait on it for their index).
	mu       sync.Mutex
	appliedc chan struct{}

	bmu     sync.Mutex
	barrier *barrierCall
}

// New opens the auth state of cfg.DB.
func New(cfg Config) (*Store, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Token == "" {
		cfg.Token = "simple"
	}
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = 300 * time.Second
	}
	if cfg.BcryptCost == 0 {
		cfg.BcryptCost = bcrypt.DefaultCost
	}
	if cfg.BcryptCost < bcrypt.MinCost || cfg.BcryptCost > bcrypt.MaxCost {
		return nil, fmt.Errorf("auth: --bcrypt-cost %d: want %d to %d", cfg.BcryptCost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	s := &Store{cfg: cfg, log: cfg.Logger.With("component", "auth"), appliedc: make(chan struct{})}
	be, err := newBackend(cfg.DB, cfg.MetaGroup)
	if err != nil {
		return nil, err
	}
	s.be = be
	zl := zapLogger(s.log)
	tp, err := etcdauth.NewTokenProvider(zl, cfg.Token, s.indexWaiter, cfg.TokenTTL)
	if err != nil {
		return nil, fmt.Errorf("auth: --auth-token %q: %w", tokenType(cfg.Token), err)
	}
	s.as = etcdauth.NewAuthStore(zl, be, tp, cfg.BcryptCost)
	return s, nil
}

func tokenType(opts string) string {
	for i, c := range opts {
		if c == ',' {
			return opts[:i]
		}
	}
	return opts
}

// indexWaiter is etcd's: a channel closed once this node's meta replica
// has applied index.
func (s *Store) indexWaiter(index uint64) <-chan struct{} {
	ch := make(chan struct{})
	if s.cfg.Applied != nil && s.cfg.Applied() >= index {
		close(ch) // the usual case: applied long ago
		return ch
	}
	go func() {
		defer close(ch)
		deadline := time.Now().Add(10 * time.Second)
		for s.cfg.Applied == nil || s.cfg.Applied() < index {
			s.mu.Lock()
			c := s.appliedc
			s.mu.Unlock()
			if time.Now().After(deadline) {
				return // the token's lookup then fails: invalid token
			}
			select {
			case <-c:
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return ch
}

// Etcd returns etcd's auth store (its permission checks).
func (s *Store) Etcd() etcdauth.AuthStore { return s.as }

// Enabled reports whether auth is on.
func (s *Store) Enabled() bool { return s.as.IsAuthEnabled() }

// Revision is the auth revision.
func (s *Store) Revision() uint64 { return s.as.Revision() }

// Close stops the token provider.
func (s *Store) Close() error { return s.as.Close() }

// Reload rereads the state (after a raft snapshot of the meta group
// replaced it).
func (s *Store) Reload() error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if err := s.be.load(); err != nil {
		return err
	}
	s.as.Recover(s.be)
	return nil
}

// AuthInfo returns the caller of ctx: the user of its token, or with
// client certificate auth, of its certificate's common name; nil when auth
// is off or the request names nobody.
func (s *Store) AuthInfo(ctx context.Context) (*etcdauth.AuthInfo, error) {
	ai, err := s.as.AuthInfoFromCtx(ctx)
	if ai != nil || err != nil {
		return ai, err
	}
	if !s.cfg.ClientCertAuth || !s.as.IsAuthEnabled() {
		return nil, nil
	}
	return s.as.AuthInfoFromTLS(ctx), nil
}

// authInfoOrEmpty is AuthInfo with an empty caller for none (the checks
// then answer "user name is empty" when auth is on).
func (s *Store) authInfoOrEmpty(ctx context.Context) (*etcdauth.AuthInfo, error) {
	ai, err := s.AuthInfo(ctx)
	if err != nil {
		return nil, err
	}
	if ai == nil {
		ai = &etcdauth.AuthInfo{}
	}
	return ai, nil
}

// Prepare readies a change for the meta group, as etcd's server does
// before proposing it: the caller's user and auth revision go in its
// header (Apply checks them), and passwords are hashed here so none enters
// the log.
func (s *Store) Prepare(ctx context.Context, r *pb.InternalRaftRequest) error {
	r.Header = &pb.RequestHeader{}
	ai, err := s.AuthInfo(ctx)
	if err != nil {
		return err
	}
	if ai != nil {
		r.Header.Username, r.Header.AuthRevision = ai.Username, ai.Revision
	}
	hash := func(password string) (string, error) {
		h, err := bcrypt.GenerateFromPassword([]byte(password), s.as.BcryptCost())
		if err != nil {
			return "", err
		}
		return base64.StdEncoding.EncodeToString(h), nil
	}
	switch {
	case r.AuthUserAdd != nil:
		if u := r.AuthUserAdd; u.Options == nil || !u.Options.NoPassword {
			if u.HashedPassword, err = hash(u.Password); err != nil {
				return err
			}
			u.Password = ""
		}
	case r.AuthUserChangePassword != nil:
		if u := r.AuthUserChangePassword; u.Password != "" {
			if u.HashedPassword, err = hash(u.Password); err != nil {
				return err
			}
			u.Password = ""
		}
	}
	return nil
}

// PrepareAuthenticate checks a user's password here (bcrypt is costly:
// etcd too keeps it out of the log's apply) and returns the request to
// propose, and the auth revision the password was checked at: a caller
// whose proposal applied at another revision tries again (the password
// may have changed meanwhile), as etcd's Authenticate does.
func (s *Store) PrepareAuthenticate(r *pb.AuthenticateRequest) (*pb.InternalRaftRequest, uint64, error) {
	rev, err := s.as.CheckPassword(r.Name, r.Password)
	if err != nil {
		if !errors.Is(err, etcdauth.ErrAuthNotEnabled) {
			s.log.Warn("invalid authentication was requested", "user", r.Name, "err", err)
		}
		return nil, 0, err
	}
	prefix, err := s.as.GenTokenPrefix()
	if err != nil {
		return nil, 0, err
	}
	return &pb.InternalRaftRequest{Authenticate: &pb.InternalAuthenticateRequest{Name: r.Name, SimpleToken: prefix}}, rev, nil
}

// Apply applies an auth change of the meta group's log at index, its
// writes going into b, and returns its response: etcd's authApplierV3 and
// applierV3backend for the auth requests.
func (s *Store) Apply(b *pebble.Batch, index uint64, r *pb.InternalRaftRequest) (proto.Message, error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.be.setBatch(b)
	defer s.be.setBatch(nil)
	defer s.notifyApplied()
	ai := etcdauth.AuthInfo{}
	if r.Header != nil {
		ai.Username, ai.Revision = r.Header.Username, r.Header.AuthRevision
	}
	if needAdminPermission(r) {
		if err := s.as.IsAdminPermitted(&ai); err != nil {
			return nil, err
		}
	}
	as := s.as
	switch {
	case r.Authenticate != nil:
		ctx := context.WithValue(context.WithValue(context.Background(), etcdauth.AuthenticateParamIndex{}, index),
			etcdauth.AuthenticateParamSimpleTokenPrefix{}, r.Authenticate.SimpleToken)
		return nilIfErr(as.Authenticate(ctx, r.Authenticate.Name, r.Authenticate.Password))
	case r.AuthEnable != nil:
		if err := as.AuthEnable(); err != nil {
			return nil, err
		}
		return &pb.AuthEnableResponse{}, nil
	case r.AuthDisable != nil:
		as.AuthDisable()
		return &pb.AuthDisableResponse{}, nil
	case r.AuthStatus != nil:
		return &pb.AuthStatusResponse{Enabled: as.IsAuthEnabled(), AuthRevision: as.Revision()}, nil
	case r.AuthUserAdd != nil:
		return nilIfErr(as.UserAdd(r.AuthUserAdd))
	case r.AuthUserDelete != nil:
		return nilIfErr(as.UserDelete(r.AuthUserDelete))
	case r.AuthUserChangePassword != nil:
		return nilIfErr(as.UserChangePassword(r.AuthUserChangePassword))
	case r.AuthUserGrantRole != nil:
		return nilIfErr(as.UserGrantRole(r.AuthUserGrantRole))
	case r.AuthUserRevokeRole != nil:
		return nilIfErr(as.UserRevokeRole(r.AuthUserRevokeRole))
	case r.AuthUserGet != nil:
		if err := as.IsAdminPermitted(&ai); err != nil && r.AuthUserGet.Name != ai.Username {
			return nil, err
		}
		return nilIfErr(as.UserGet(r.AuthUserGet))
	case r.AuthUserList != nil:
		return nilIfErr(as.UserList(r.AuthUserList))
	case r.AuthRoleAdd != nil:
		return nilIfErr(as.RoleAdd(r.AuthRoleAdd))
	case r.AuthRoleDelete != nil:
		return nilIfErr(as.RoleDelete(r.AuthRoleDelete))
	case r.AuthRoleGrantPermission != nil:
		return nilIfErr(as.RoleGrantPermission(r.AuthRoleGrantPermission))
	case r.AuthRoleRevokePermission != nil:
		return nilIfErr(as.RoleRevokePermission(r.AuthRoleRevokePermission))
	case r.AuthRoleGet != nil:
		if err := as.IsAdminPermitted(&ai); err != nil && !as.HasRole(ai.Username, r.AuthRoleGet.Role) {
			return nil, err
		}
		return nilIfErr(as.RoleGet(r.AuthRoleGet))
	case r.AuthRoleList != nil:
		return nilIfErr(as.RoleList(r.AuthRoleList))
	}
	return nil, errors.New("auth: not an auth request")
}

// nilIfErr drops a typed response that came with an error.
func nilIfErr[T proto.Message](resp T, err error) (proto.Message, error) {
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *Store) notifyApplied() {
	s.mu.Lock()
	close(s.appliedc)
	s.appliedc = make(chan struct{})
	s.mu.Unlock()
}

// needAdminPermission is etcd's (apply_auth.go): these changes need the
// root role when auth is on.
func needAdminPermission(r *pb.InternalRaftRequest) bool {
	return r.AuthEnable != nil || r.AuthDisable != nil || r.AuthStatus != nil ||
		r.AuthUserAdd != nil || r.AuthUserDelete != nil || r.AuthUserChangePassword != nil ||
		r.AuthUserGrantRole != nil || r.AuthUserRevokeRole != nil || r.AuthRoleAdd != nil ||
		r.AuthRoleGrantPermission != nil || r.AuthRoleRevokePermission != nil || r.AuthRoleDelete != nil ||
		r.AuthUserList != nil || r.AuthRoleList != nil
}

// ResponseFor returns an empty response of the type r's answer has (to
// decode it when another node applied r).
func ResponseFor(r *pb.InternalRaftRequest) proto.Message {
	switch {
	case r.Authenticate != nil:
		return &pb.AuthenticateResponse{}
	case r.AuthEnable != nil:
		return &pb.AuthEnableResponse{}
	case r.AuthDisable != nil:
		return &pb.AuthDisableResponse{}
	case r.AuthStatus != nil:
		return &pb.AuthStatusResponse{}
	case r.AuthUserAdd != nil:
		return &pb.AuthUserAddResponse{}
	case r.AuthUserDelete != nil:
		return &pb.AuthUserDeleteResponse{}
	case r.AuthUserChangePassword != nil:
		return &pb.AuthUserChangePasswordResponse{}
	case r.AuthUserGrantRole != nil:
		return &pb.AuthUserGrantRoleResponse{}
	case r.AuthUserRevokeRole != nil:
		return &pb.AuthUserRevokeRoleResponse{}
	case r.AuthUserGet != nil:
		return &pb.AuthUserGetResponse{}
	case r.AuthUserList != nil:
		return &pb.AuthUserListResponse{}
	case r.AuthRoleAdd != nil:
		return &pb.AuthRoleAddResponse{}
	case r.AuthRoleDelete != nil:
		return &pb.AuthRoleDeleteResponse{}
	case r.AuthRoleGrantPermission != nil:
		return &pb.AuthRoleGrantPermissionResponse{}
	case r.AuthRoleRevokePermission != nil:
		return &pb.AuthRoleRevokePermissionResponse{}
	case r.AuthRoleGet != nil:
		return &pb.AuthRoleGetResponse{}
	case r.AuthRoleList != nil:
		return &pb.AuthRoleListResponse{}
	}
	return nil
}

// Fresh waits until this node's copy of the auth state is at least as new
// as the meta group's when Fresh was called: a read index of the meta
// group taken after the call (shared by concurrent callers), then this
// replica's apply reaching it. Checks made after it see every auth change
// acknowledged before the request arrived, on any node, as etcd's checks
// at apply time do.
//
// It costs a round trip to the meta leader per batch of requests, so it
// runs only while the cluster has auth state (auth on, or users defined):
// a cluster that never used auth pays nothing.
func (s *Store) Fresh(ctx context.Context) error {
	if !s.as.IsAuthEnabled() && !s.be.hasUsers() {
		return nil
	}
	return s.Sync(ctx)
}

// Sync is Fresh whether or not the cluster has auth state (Authenticate:
// a linearizable read of it, as etcd's).
func (s *Store) Sync(ctx context.Context) error {
	if s.cfg.ReadIndex == nil {
		return nil
	}
	arrived := time.Now()
	var c *barrierCall
	for {
		s.bmu.Lock()
		c = s.barrier
		if c != nil && !c.started.Before(arrived) {
			s.bmu.Unlock()
			break // started after this request arrived: its index will do
		}
		if c == nil || c.finished() {
			c = &barrierCall{started: time.Now(), done: make(chan struct{})}
			s.barrier = c
			s.bmu.Unlock()
			go s.runBarrier(c)
			break
		}
		s.bmu.Unlock()
		select { // one in flight from before: wait for it, then take the next
		case <-c.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if c.err != nil {
		return c.err
	}
	for s.cfg.Applied() < c.index {
		s.mu.Lock()
		ch := s.appliedc
		s.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

type barrierCall struct {
	started time.Time
	done    chan struct{}
	index   uint64
	err     error
}

func (c *barrierCall) finished() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// runBarrier takes the meta group's read index, trying again while the
// group changes leaders (a planned transfer as a node stops answers
// "leader changed" to a read index in flight) for up to 5 s.
func (s *Store) runBarrier(c *barrierCall) {
	defer close(c.done)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		c.index, c.err = s.cfg.ReadIndex(ctx)
		if c.err == nil || ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ValidateToken checks etcd's --auth-token options (the JWT keys load and
// match) without opening anything.
func ValidateToken(opts string) error {
	if opts == "" {
		return nil
	}
	tp, err := etcdauth.NewTokenProvider(zapLogger(slog.New(slog.DiscardHandler)), opts, func(uint64) <-chan struct{} { return nil }, time.Minute)
	if err != nil {
		return fmt.Errorf("--auth-token %q: %w", tokenType(opts), err)
	}
	_ = tp
	return nil
}
