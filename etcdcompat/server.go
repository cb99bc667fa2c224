package etcdcompat

import (
	"context"
	"errors"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brainkv/brain/auth"
	"github.com/brainkv/brain/internal/rpccodec"
	"github.com/brainkv/brain/kvapi"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

var errContextCanceled = context.Canceled

// Maintenance is what the Maintenance service needs from the node.
type Maintenance interface {
	// DBSize returns the size of the node's storage and the part in use.
	DBSize() (size, inUse int64)
	// Defragment compacts the node's storage.
	Defragment(ctx context.Context) error
	// HashKV hashes the MVCC data at or below rev (0: current).
	HashKV(ctx context.Context, rev int64) (hash uint32, hashRev, compactRev int64, err error)
	// Snapshot streams a consistent backup.
	Snapshot(ctx context.Context, send func(chunk []byte, remaining uint64) error) error
	// Alarms lists active alarms; SetAlarm changes one.
	Alarms() []*pb.AlarmMember
	SetAlarm(ctx context.Context, activate bool, member uint64, a pb.AlarmType) error
	// RaftStatus returns the raft index and term of the node's meta group.
	RaftStatus() (index, term, applied uint64, leader uint64)
}

// Config configures the etcd services.
type Config struct {
	Store       *kvapi.Store
	Hub         *Hub
	Maintenance Maintenance
	ClusterID   uint64
	MemberID    uint64
	// Members lists the cluster's members for MemberList.
	Members func() []*pb.Member
	// MemberAdd adds a member and returns it and the new member list (nil:
	// membership changes are refused).
	MemberAdd func(ctx context.Context, r *pb.MemberAddRequest) (*pb.Member, []*pb.Member, error)
	// MemberRemove removes a member and returns the new member list (nil:
	// refused).
	MemberRemove func(ctx context.Context, id uint64) ([]*pb.Member, error)
	// Term returns the raft term reported in response headers.
	Term func() uint64
	// HasLeader reports whether the node knows a leader (for the
	// "hasleader" metadata kube-apiserver sends); nil: always.
	HasLeader func() bool
	// ElectionTimeout is the node's raft election timeout: requests and
	// streams with the "hasleader" metadata are refused, and open ones
	// cancelled, once the node has had no leader for 3 of them (etcd's
	// rule; see leaderWatch). Default 1 s (etcd's).
	ElectionTimeout time.Duration
	// MaxRequestBytes is etcd's --max-request-bytes; default 1.5 MiB.
	MaxRequestBytes uint
	// MaxTxnOps is etcd's --max-txn-ops; default 128.
	MaxTxnOps int
	// QuotaBackendBytes is reported by Status; 0: etcd's default 2 GiB.
	QuotaBackendBytes int64
	// MaxInflightWrites and MaxInflightReads bound the writes (Put,
	// DeleteRange, Txn, LeaseGrant, LeaseRevoke) and reads (Range) a node
	// works on at once; past them a request is refused at once with etcd's
	// "etcdserver: too many requests" (ResourceExhausted; nothing was done,
	// so it is safe to retry after a back-off). Load shedding keeps an
	// overloaded node answering health checks, watches, lease keep-alives
	// and raft within bounded latency instead of queueing without limit.
	// 0: no limit.
	MaxInflightWrites, MaxInflightReads int64
	// ProgressNotifyInterval is how often watches that asked for progress
	// notifications get one when idle; default 10 minutes (etcd's).
	ProgressNotifyInterval time.Duration
	Logger                 *slog.Logger
	// Registerer gets the per-RPC request metrics (grpc_server_started_total,
	// grpc_server_handled_total, grpc_server_handling_seconds by service,
	// method and code, as etcd exports them); nil: none.
	Registerer prometheus.Registerer
	// Auth is etcd's auth (users, roles, permission checks); nil: the
	// Auth service answers that it is not configured and nothing is
	// checked (tests of the layers below).
	Auth *auth.Store
}

// DefaultMaxRequestBytes is etcd's default --max-request-bytes.
const DefaultMaxRequestBytes = 1.5 * 1024 * 1024

// GRPCOverheadBytes is what etcd allows beyond MaxRequestBytes at the gRPC
// layer before gRPC itself refuses a message.
const GRPCOverheadBytes = 512 * 1024

// Version is the etcd version brain reports: kube-apiserver enables
// consistent reads from its cache for etcd >= 3.5.13.
const Version = "3.6.0"

// ClusterVersion is the cluster version brain reports (etcd's
// "etcdcluster" in /version: major.minor.0).
const ClusterVersion = "3.6.0"

// Server implements etcd's v3 gRPC services over a kvapi.Store.
type Server struct {
	cfg     Config
	store   *kvapi.Store
	hub     *Hub
	log     *slog.Logger
	metrics *grpcprom.ServerMetrics // nil without a Registerer
	// inflight counts the requests being served, by class.
	inflight struct{ writes, reads atomic.Int64 }
	shed     *prometheus.CounterVec
	// streams are the open client streams; leader applies etcd's rule
	// for the "hasleader" metadata to them and to unary requests.
	streams *streams
	leader  *leaderWatch
	// noLeader counts requests refused and streams cancelled for want of
	// a leader.
	noLeader  *prometheus.CounterVec
	stop      chan struct{}
	stopOnce  sync.Once
	leaderRun sync.WaitGroup
}

// New creates the services.
func New(cfg Config) *Server {
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if cfg.MaxTxnOps == 0 {
		cfg.MaxTxnOps = 128
	}
	if cfg.ProgressNotifyInterval == 0 {
		cfg.ProgressNotifyInterval = 10 * time.Minute
	}
	if cfg.QuotaBackendBytes == 0 {
		cfg.QuotaBackendBytes = 2 << 30
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ElectionTimeout == 0 {
		cfg.ElectionTimeout = time.Second
	}
	s := &Server{cfg: cfg, store: cfg.Store, hub: cfg.Hub, log: cfg.Logger.With("component", "etcdcompat"), stop: make(chan struct{})}
	s.streams = newStreams()
	s.leader = newLeaderWatch(s.hasLeader, cfg.ElectionTimeout, s.streams, time.Now())
	if cfg.Registerer != nil {
		s.metrics = grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
			grpcprom.WithHistogramBuckets([]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10})))
		cfg.Registerer.MustRegister(s.metrics)
	}
	s.shed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "brain_requests_shed_total",
		Help: "Requests refused with \"etcdserver: too many requests\" because the node was already serving --max-inflight-writes writes or --max-inflight-reads reads.",
	}, []string{"class"})
	s.shed.WithLabelValues("write") // both series from zero
	s.shed.WithLabelValues("read")
	s.noLeader = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "brain_no_leader_total",
		Help: "Requests and streams with etcd's \"hasleader\" metadata (every kube-apiserver watch) refused (what=refused) or cancelled (what=cancelled) with \"etcdserver: no leader\" because the node had no leader for 3 election timeouts.",
	}, []string{"what"})
	s.noLeader.WithLabelValues("refused")
	s.noLeader.WithLabelValues("cancelled")
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.shed, s.noLeader)
		cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "brain_inflight_writes", Help: "Writes being served."},
			func() float64 { return float64(s.inflight.writes.Load()) }))
		cfg.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "brain_inflight_reads", Help: "Reads being served."},
			func() float64 { return float64(s.inflight.reads.Load()) }))
	}
	s.leaderRun.Add(1)
	go func() {
		defer s.leaderRun.Done()
		s.leader.run(s.stop, func(n int) {
			s.noLeader.WithLabelValues("cancelled").Add(float64(n))
			s.log.Warn("cancelled streams that require a leader: no leader for 3 election timeouts", "streams", n,
				"election-timeout", cfg.ElectionTimeout)
		})
	}()
	return s
}

// Close ends every open stream (watches, lease keep-alives) with etcd's
// "etcdserver: server stopped" (Unavailable: etcd's client resumes a watch
// on another endpoint, or on this one once it is back), refuses new ones,
// and stops the services' background work. Call it before stopping the
// gRPC server gracefully, which would otherwise wait on streams that never
// end by themselves.
func (s *Server) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.streams.closeAll(rpctypes.ErrGRPCStopped)
	s.leaderRun.Wait()
}

// ServerOptions returns the gRPC options the services need: the codec that
// sends pre-encoded watch frames, and etcd's message size limits.
func (s *Server) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(rpccodec.New()),
		grpc.Creds(listenerTLS{}),
		grpc.MaxRecvMsgSize(int(s.cfg.MaxRequestBytes + GRPCOverheadBytes)),
		grpc.MaxSendMsgSize(1<<31 - 1),
		grpc.MaxConcurrentStreams(1<<32 - 1),
		grpc.ChainUnaryInterceptor(s.unaryInterceptors()...),
		grpc.ChainStreamInterceptor(s.streamInterceptors()...),
		// etcd's keepalive (--grpc-keepalive-*), but accepting pings every
		// second, also without streams: gRPC's default (one ping per 5
		// minutes) answers kube-apiserver's 30 s pings with GOAWAY
		// too_many_pings, breaking every watch on the connection.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Hour, Timeout: 20 * time.Second}),
		// Static flow-control windows: no PING and few WINDOW_UPDATE frames
		// per request (see rpccodec.StaticWindow).
		grpc.StaticStreamWindowSize(rpccodec.StaticWindow),
		grpc.StaticConnWindowSize(rpccodec.StaticWindow),
		// Requests run on kept goroutines, whose stacks stay grown (a
		// goroutine per request copied its stack as it grew: 3.4% of a
		// busy node's CPU); when all are busy, on a goroutine of their own.
		grpc.NumStreamWorkers(clientStreamWorkers),
	}
}

// clientStreamWorkers is how many goroutines serve client streams.
const clientStreamWorkers = 128

func (s *Server) unaryInterceptors() []grpc.UnaryServerInterceptor {
	if s.metrics == nil {
		return []grpc.UnaryServerInterceptor{s.unaryInterceptor, s.authUnary}
	}
	return []grpc.UnaryServerInterceptor{s.metrics.UnaryServerInterceptor(), s.unaryInterceptor, s.authUnary}
}

func (s *Server) streamInterceptors() []grpc.StreamServerInterceptor {
	if s.metrics == nil {
		return []grpc.StreamServerInterceptor{s.streamInterceptor, s.authStream}
	}
	return []grpc.StreamServerInterceptor{s.metrics.StreamServerInterceptor(), s.streamInterceptor, s.authStream}
}

// streamInterceptor registers every client stream (so that Close can end
// it), and gives streams with the "hasleader" metadata etcd's treatment
// (leaderWatch): refused, or cancelled while open, with "no leader" once
// the node has had none for 3 election timeouts.
func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	rl := requireLeader(ss.Context())
	st, done, err := s.leader.open(ss, rl, time.Now())
	if err != nil {
		if errors.Is(err, rpctypes.ErrGRPCNoLeader) {
			s.noLeader.WithLabelValues("refused").Inc()
		}
		return err
	}
	defer done()
	return handler(srv, st)
}

// Register registers every service on g.
func (s *Server) Register(g *grpc.Server) {
	pb.RegisterKVServer(g, &kvServer{s: s})
	pb.RegisterWatchServer(g, &watchServer{s: s})
	pb.RegisterLeaseServer(g, &leaseServer{s: s})
	pb.RegisterClusterServer(g, &clusterServer{s: s})
	pb.RegisterMaintenanceServer(g, &maintenanceServer{s: s})
	pb.RegisterAuthServer(g, &authServer{s: s})
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	if s.metrics != nil {
		s.metrics.InitializeMetrics(g) // every method's series from zero
	}
}

func (s *Server) hasLeader() bool { return s.cfg.HasLeader == nil || s.cfg.HasLeader() }

// unaryInterceptor refuses requests that require a leader when the node
// has had none for 3 election timeouts (leaderWatch), and sheds load past
// the in-flight limits.
func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if requireLeader(ctx) && s.leader.leaderless(time.Now()) {
		s.noLeader.WithLabelValues("refused").Inc()
		return nil, rpctypes.ErrGRPCNoLeader
	}
	var n *atomic.Int64
	var limit int64
	var class string
	switch info.FullMethod {
	case "/etcdserverpb.KV/Put", "/etcdserverpb.KV/DeleteRange", "/etcdserverpb.KV/Txn",
		"/etcdserverpb.Lease/LeaseGrant", "/etcdserverpb.Lease/LeaseRevoke":
		n, limit, class = &s.inflight.writes, s.cfg.MaxInflightWrites, "write"
	case "/etcdserverpb.KV/Range":
		n, limit, class = &s.inflight.reads, s.cfg.MaxInflightReads, "read"
	default:
		return handler(ctx, req)
	}
	if n.Add(1) > limit && limit > 0 {
		n.Add(-1)
		s.shed.WithLabelValues(class).Inc()
		return nil, rpctypes.ErrGRPCRequestTooManyRequests
	}
	defer n.Add(-1)
	return handler(ctx, req)
}

// fill completes a response header as etcd's header.fill does. A zero
// revision is replaced by the current one.
func (s *Server) fill(h *pb.ResponseHeader) {
	if h == nil {
		return
	}
	h.ClusterId = s.cfg.ClusterID
	h.MemberId = s.cfg.MemberID
	if s.cfg.Term != nil {
		h.RaftTerm = s.cfg.Term()
	}
	if h.Revision == 0 {
		h.Revision = s.currentRevision(context.Background())
	}
}

// currentRevision is the revision for a response header: the current
// revision confirmed by the TSO's leader (never below an acknowledged
// write), or, if the TSO cannot answer soon, the highest this node knows.
func (s *Server) currentRevision(ctx context.Context) int64 {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if rev, err := s.store.FreshRevision(ctx); err == nil {
		return rev
	}
	return s.store.CurrentRevision()
}

type sizer interface{ Size() int }

// checkSize refuses write requests larger than --max-request-bytes with
// etcd's error.
func (s *Server) checkSize(r sizer) error {
	if uint(r.Size()) > s.cfg.MaxRequestBytes {
		return rpctypes.ErrGRPCRequestTooLarge
	}
	return nil
}
