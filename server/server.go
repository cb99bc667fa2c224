package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/brainkv/brain/auth"
	"github.com/brainkv/brain/internal/diskfault"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/etcdcompat"
	"github.com/brainkv/brain/internal/peerconn"
	"github.com/brainkv/brain/internal/rpccodec"
	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/raftgroup"
	"github.com/brainkv/brain/tso"
	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/soheilhy/cmux"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// Server is one brain node.
type Server struct {
	cfg      Config
	log      *slog.Logger
	registry *prometheus.Registry
	db       *pebble.DB
	id       *identity
	host     *raftgroup.Host
	oracle   *tso.Oracle
	// transfers serializes leadership transfers per group (placement.go).
	transfers struct {
		sync.Mutex
		m map[uint64]*sync.Mutex
	}
	tso  *tso.Client
	meta *meta.Meta
	pm   *partition.Metrics
	// parts are this node's partition replicas (serving or being added),
	// by group; partsMu guards the map after start.
	partsMu sync.Mutex
	parts   map[uint64]*partition.Partition
	// routesKick wakes the partition map refresher (splits.go); routesMu
	// serializes installing maps.
	routesKick chan struct{}
	routesMu   sync.Mutex
	// load is what the leader balancer knows of the partitions this node
	// leads (loadbalance.go).
	load leaderLoad
	// splits counts the splits this node started, by reason.
	splits           *prometheus.CounterVec
	balanceTransfers *prometheus.CounterVec // leader balancer's transfers, by reason
	leaderWriteRate  prometheus.Gauge       // writes/s of the partitions this node leads
	leaderLoadGauge  prometheus.Gauge       // the leader load this node gossips (ownLoad)
	offPlacement     prometheus.Gauge       // partitions this node leads whose replicas are not at their placement
	refused          prometheus.Counter     // peer calls refused as another cluster's
	refusedLog       atomic.Int64           // unix nanos of the last refusal logged
	internalCalls    *prometheus.CounterVec // calls other nodes made here, by op
	feedSent         *prometheus.CounterVec // feed stream messages sent to other nodes, by kind
	closeFwd         []*forwardCloser
	store            *kvapi.Store
	hub              *etcdcompat.Hub
	etcd             *etcdcompat.Server
	grpc             *grpc.Server
	quota            *quota

	// Cluster plumbing (nil on a single node).
	membership *membership
	peers      *peerconn.Pool // connections to the other nodes, shared by transport and rpc
	transport  *raftgroup.GRPCTransport
	rpc        *kvapi.Client
	peerGRPC   *grpc.Server
	// drainCalls waits for the internal calls under way (Stop, before
	// peerGRPC stops).
	drainCalls func(context.Context) error

	listeners []net.Listener
	clientLs  []boundListener // bound by listen, served by serve
	metricsLs []boundListener
	auth      *auth.Store
	// joinedMembers are the members a node that joined on this start
	// learned from the cluster (its identity keeps only the initial ones;
	// the meta group has the rest once this node's replica catches up).
	joinedMembers []member
	clientURL     []string // the addresses actually bound
	// ready is set once the node serves client requests (serveWhenReady).
	ready atomic.Bool
	// began is when New was called; storageOpen how long opening the
	// store (and replaying its write-ahead log) took.
	began       time.Time
	storageOpen time.Duration
	ballast     string // what manageBallast did at start
	peerURL     string
	wg          sync.WaitGroup
	stopc       chan struct{}
	stopOnce    sync.Once
	// removed is closed when the node learns it was removed from the
	// cluster (see Removed).
	removed     chan struct{}
	removedOnce sync.Once
}

// New opens (or creates) the node's store and starts it. A single node
// waits until its groups have leaders; a cluster member returns at once
// and serves as soon as a quorum of the cluster is up.
func New(cfg Config) (*Server, error) {
	cfg.EnsureDefaults()
	if cfg.DiskFaults != nil {
		cfg.FS = diskfault.Wrap(cfg.FS, cfg.DiskFaults)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = newLogger(cfg.LogLevel, cfg.LogFormat)
	}
	s := &Server{cfg: cfg, log: log, began: time.Now(), registry: prometheus.NewRegistry(), stopc: make(chan struct{}), removed: make(chan struct{}),
		routesKick: make(chan struct{}, 1)}
	s.registry.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler)), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.splits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "brain_partition_splits_total", Help: "Partition splits this node started, by reason (manual, size, load, balance, across: a split for balance whose new half goes to other nodes).",
	}, []string{"reason"})
	s.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "brain_peer_requests_refused_total", Help: "Calls to the peer port refused because they came from another cluster (or named none).",
	})
	s.internalCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "brain_internal_calls_total", Help: "Internal calls other nodes made to this one, by operation (forwarded writes, TSO, reads, closes, ...).",
	}, []string{"op"})
	s.balanceTransfers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "brain_leader_balance_transfers_total", Help: "Leadership transfers the leader balancer started, by reason (preferred: to the placement's node; load: to even out the nodes' leader write load).",
	}, []string{"reason"})
	s.leaderWriteRate = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "brain_leader_write_rate", Help: "Writes per second the partitions this node leads took over the last split window.",
	})
	s.leaderLoadGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "brain_leader_load", Help: "The leader load this node gossips to the leader balancer, in writes per second: brain_leader_write_rate, and on the TSO leader the TSO requests it answered, weighted by what one costs against a write.",
	})
	s.offPlacement = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "brain_partitions_off_placement", Help: "Partitions this node leads whose voters are not their placement's, or that have learners: replica moves (rebalancing or repair) still to do. 0 on every node: the cluster is balanced.",
	})
	s.feedSent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "brain_feed_messages_sent_total", Help: "Messages of partition feeds this node streamed to other nodes' watch hubs, by kind (events: with events; closed: a closed revision only).",
	}, []string{"kind"})
	feedEvents := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "brain_feed_events_received_total", Help: "Events this node's watch hub received through partition feeds from other nodes' replicas (partitions with no replica here); each costs the node a decode on top of what brain_watch_events_merged_total counts.",
	}, func() float64 {
		if s.store == nil {
			return 0
		}
		return float64(s.store.RemoteFeedEvents())
	})
	s.registry.MustRegister(s.splits, s.refused, s.internalCalls, s.feedSent, s.balanceTransfers, s.leaderWriteRate, s.leaderLoadGauge, s.offPlacement, feedEvents)
	existed, inUse := dataDirState(cfg.FS, cfg.DataDir)
	err := s.listen()
	if err == nil {
		err = s.open()
	}
	if err != nil {
		s.closeListeners()
		s.closeStorage(false)
		if !inUse {
			// A store this call created and could not start is not left
			// half made: a retry would find it and start it empty.
			if rerr := removeNewStore(cfg.FS, cfg.DataDir, existed); rerr != nil {
				log.Warn("could not remove the data directory of the store that failed to start", "data-dir", cfg.DataDir, "err", rerr)
			}
		}
		return nil, err
	}
	if err := s.serve(); err != nil {
		s.Stop()
		return nil, err
	}
	s.log.Info("brain node started", "name", s.id.Name, "member-id", formatID(s.id.MemberID),
		"members", len(s.id.Members), "client-urls", s.clientURL, "data-dir", cfg.DataDir,
		"partitions", len(s.store.Routes()), "known-revision", s.tso.Known(),
		// What a restart costs before the node can serve: opening the
		// store replays its write-ahead log (after a crash, up to the
		// memtables' worth), and each partition loads its key index.
		"took", time.Since(s.began).Round(time.Millisecond).String(), "storage-open", s.storageOpen.Round(time.Millisecond).String(),
		"emergency-ballast", s.ballast)
	return s, nil
}

func newLogger(level, format string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(strings.ToUpper(level)))
	opts := &slog.HandlerOptions{Level: l}
	if format == "text" || (format == "" && stderrIsTerminal()) {
		return slog.New(slog.NewTextHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, opts))
}

// stderrIsTerminal reports whether stderr is a character device (a
// terminal), where people rather than collectors read the log.
func stderrIsTerminal() bool {
	st, err := os.Stderr.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func formatID(id uint64) string { return fmt.Sprintf("%x", id) }

// clustered reports whether the node serves peers: it is one of several
// initial members, joined a cluster, or is a one-member store started
// with --allow-join.
func (s *Server) clustered() bool {
	return len(s.id.Members) > 1 || s.id.JoinedAt != 0 || s.id.Clustered
}

func (s *Server) open() error {
	cfg := s.cfg
	if err := cfg.FS.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("server: create data dir: %w", err)
	}
	s.ballast = manageBallast(cfg.FS, cfg.DataDir, cfg.EmergencyBallastBytes, cfg.MemTableBytes, s.log)
	t0 := time.Now()
	db, err := engine.Open(engine.Config{Dir: filepath.Join(cfg.DataDir, "pebble"), FS: cfg.FS, CacheBytes: cfg.CacheBytes, MemTableBytes: cfg.MemTableBytes, ValueSeparationMinBytes: cfg.ValueSeparationMinBytes, Logger: s.log})
	if err != nil {
		return err
	}
	s.storageOpen = time.Since(t0)
	s.db = db
	s.registry.MustRegister(engine.NewMetricsCollector(db))
	if err := s.loadOrCreateIdentity(); err != nil {
		return err
	}
	if s.clustered() {
		if err := s.startMembership(); err != nil {
			return err
		}
		s.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "brain_gossip_connections_refused_total",
			Help: "Incoming gossip connections refused at the TLS handshake (no certificate from the peer CA; gossip runs over TLS with peer TLS on).",
		}, func() float64 { return float64(s.membership.Refusals()) }))
		dialOpts, err := s.cfg.peerDialOptions()
		if err != nil {
			return err
		}
		dialOpts = append(dialOpts, rpccodec.ClusterDialOptions(s.id.ClusterID)...)
		s.peers = peerconn.New(s.membership.Resolve, dialOpts...)
		s.transport = raftgroup.NewGRPCTransport(s.id.MemberID, s.peers, s.log)
		s.rpc = kvapi.NewClient(s.peers, s.log)
		s.registry.MustRegister(s.rpc.Collectors()...)
	}
	var transport raftgroup.Transport
	if s.transport != nil {
		transport = s.transport
	}
	s.host, err = raftgroup.NewHost(raftgroup.Config{
		NodeID:         s.id.MemberID,
		TickInterval:   cfg.HeartbeatInterval,
		ElectionTicks:  int(cfg.ElectionTimeout / cfg.HeartbeatInterval),
		HeartbeatTicks: 1,
		Workers:        cfg.RaftWorkers,
		LogKeepEntries: cfg.RaftLogKeep,
		TruncateEvery:  cfg.RaftTruncateEvery,
		Logger:         s.log,
		Registerer:     s.registry,
		NewReplica:     s.newReplica,
	}, db, transport)
	if err != nil {
		return err
	}
	if s.transport != nil {
		s.transport.Bind(s.host)
	}
	if s.oracle, err = tso.New(tso.Config{WindowSize: cfg.TSOWindow, Logger: s.log, Registerer: s.registry}, db, kvapi.TSOGroup); err != nil {
		return err
	}
	// etcd's minimum lease TTL: 1.5 election timeouts, rounded up.
	minTTL := int64((3*cfg.ElectionTimeout/2 + time.Second - 1) / time.Second)
	if s.auth, err = auth.New(auth.Config{
		DB: db, MetaGroup: kvapi.MetaGroup,
		Token: cfg.AuthToken, TokenTTL: cfg.AuthTokenTTL, BcryptCost: cfg.BcryptCost,
		ClientCertAuth: cfg.ClientCertAuth,
		Applied: func() uint64 {
			if g := s.host.Group(kvapi.MetaGroup); g != nil {
				return g.AppliedIndex()
			}
			return 0
		},
		ReadIndex: func(ctx context.Context) (uint64, error) { return s.store.MetaReadIndex(ctx) },
		Logger:    s.log,
	}); err != nil {
		return err
	}
	if s.meta, err = meta.New(meta.Config{MinLeaseTTL: minTTL, Logger: s.log, Auth: s.auth}, db, kvapi.MetaGroup); err != nil {
		return err
	}
	if s.membership != nil {
		// Members added after the identity was made are the meta
		// group's: gossip resolves them from now on.
		s.membership.SetMembers(s.gossipMembers())
	}
	s.tso = tso.NewClient(s.oracle, nil)
	s.hub = etcdcompat.NewHub(etcdcompat.HubConfig{Registerer: s.registry, IdleFeedsAfter: cfg.WatchFeedsIdleAfter, Logger: s.log.With("component", "watch")}, nil)
	s.pm = partition.NewMetrics(s.registry)
	s.parts = make(map[uint64]*partition.Partition)

	// Partitions and their routes. This node opens a replica of every
	// partition it has raft state for - the initial ones, and those splits
	// created (named by the meta replica's records and by the local
	// partitions' own) - and on a new store bootstraps those the initial
	// placement gives it; replicas added later are created when their
	// leader first contacts this node (newReplica), or by a split applied
	// here (splits.go).
	bounds := append([]string{""}, s.id.SplitPoints...)
	var candidates []uint64
	initial := make(map[uint64][2][]byte)
	for i, start := range bounds {
		id := uint64(kvapi.FirstPartition + i)
		var end []byte
		if i+1 < len(bounds) {
			end = []byte(bounds[i+1])
		}
		initial[id] = [2][]byte{[]byte(start), end}
		candidates = append(candidates, id)
	}
	for _, sp := range s.meta.Splits() {
		candidates = append(candidates, sp.Child)
	}
	for len(candidates) > 0 {
		id := candidates[0]
		candidates = candidates[1:]
		if s.parts[id] != nil {
			continue
		}
		has, err := raftgroup.HasState(db, id)
		if err != nil {
			return err
		}
		boot := s.bootConf(id) != nil
		if !has && !boot {
			continue
		}
		// A replica added after bootstrap has the span it persisted
		// with its snapshot (or none yet).
		var pStart, pEnd []byte
		if boot {
			pStart, pEnd = initial[id][0], initial[id][1]
		}
		p, err := s.newPartition(id, pStart, pEnd)
		if err != nil {
			return err
		}
		s.parts[id] = p
		for _, r := range p.Splits() {
			candidates = append(candidates, r.Child)
		}
	}
	routes := s.partitionMap()
	for i, rt := range routes {
		// A cluster member's replica serves once it hears a leader
		// (serveIfReady): it may have been replaced while this node
		// was down, and would never catch up.
		if p := s.parts[rt.ID]; p != nil && p.Initialized() && !s.clustered() {
			routes[i].Local = p
		}
		// The hub knows a local replica's closed revision; another node's
		// comes with the feed.
		closed := int64(0)
		if p := s.parts[rt.ID]; p != nil {
			closed = p.Closed()
		}
		s.hub.AddPartition(rt.ID, rt.Start, rt.End, closed)
	}
	s.quota = newQuota(db, s.id.MemberID, cfg.QuotaBackendBytes)
	if s.store, err = kvapi.NewStore(kvapi.Config{
		Self: s.id.MemberID, Routes: routes, TSO: s.tso, Oracle: s.oracle, Meta: s.meta,
		RPC: s.rpc, LeaderHint: s.leaderHint, Peers: s.alivePeers, Logger: s.log, Quota: s.quota.check,
		Groups: s.groupStatus, Alive: s.alive, ClusterInfo: s.clusterInfo, GroupLock: s.transferLock,
		MaxStaleness: cfg.MaxSerializableStaleness,
	}); err != nil {
		return err
	}
	s.registry.MustRegister(s.store.Collectors()...)
	s.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "brain_partition_replicas_stale_closed",
		Help: "This node's partition replicas whose closed revision is older than --max-serializable-staleness (idle partitions no reader asked to close): a serializable read of them here first waits for a close.",
	}, func() float64 { return float64(len(s.staleClosed())) }))
	s.quota.store = s.store
	for _, fc := range s.closeFwd {
		fc.f = s.store.ForwardClose(fc.id)
	}
	if s.clustered() {
		s.tso = tso.NewClient(s.oracle, s.store.TSOBackend())
		s.store.SetTSO(s.tso)
		for _, p := range s.parts {
			p.SetRevisions(s.tso)
		}
		s.meta.SetLeaderIndex(s.store.MetaReadIndex)
	}
	s.hub.SetSource(s.store)
	// Events applied before a restart are in the event logs, not the hub:
	// the partitions' feeds start at the TSO's recovered revision (on a
	// node that joined, at the revision the cluster had then).
	s.hub.SetHistoryStart(max(s.oracle.End(), s.id.JoinedAt) + 1)
	s.store.StartFeeds(s.hub)

	for _, g := range s.groupIDs() {
		var boot *raftpb.ConfState
		var sm raftgroup.StateMachine
		switch g {
		case kvapi.TSOGroup:
			sm = s.oracle
		case kvapi.MetaGroup:
			sm = s.meta
		default:
			if s.parts[g] == nil {
				continue
			}
			sm = s.parts[g]
		}
		has, err := raftgroup.HasState(db, g)
		if err != nil {
			return err
		}
		boot = s.bootConf(g)
		if !has && boot == nil {
			continue
		}
		grp, err := s.host.CreateGroupConf(g, boot, sm)
		if err != nil {
			return err
		}
		sm.(raftgroup.Binder).Bind(grp)
		// A fresh cluster elects its preferred leaders first.
		if s.clustered() && grp.Status().Commit == raftgroup.InitialIndex && preferredLeader(g, s.id.Members) == s.id.MemberID {
			grp.Campaign()
		}
	}
	if !s.id.Bootstrapped {
		s.id.Bootstrapped = true
		if err := s.saveIdentity(); err != nil {
			return err
		}
	}
	if s.clustered() {
		if err := s.servePeers(); err != nil {
			return err
		}
	}
	restarted := false
	for _, g := range s.groupIDs() {
		if st, ok := s.groupStatus(g); ok && st.Commit > raftgroup.InitialIndex {
			restarted = true
		}
	}
	s.host.Start()
	if s.clustered() && restarted {
		s.wg.Add(1)
		go s.advanceElections()
	}
	if !s.clustered() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.waitLeaders(ctx); err != nil {
			return err
		}
	}
	s.store.StartLeaseExpiry(500 * time.Millisecond)
	s.quota.start()
	s.meta.SetOnSplits(s.kickRoutes)
	s.wg.Add(3)
	go s.refreshRoutes()
	go s.reportSplits()
	go s.splitDriver()
	if s.clustered() {
		s.wg.Add(4)
		go s.balanceLeaders()
		go s.publishLeads()
		go s.syncGossipMembers()
		go s.manageReplicas()
		if s.cfg.RebalanceInterval > 0 {
			s.wg.Add(1)
			go s.rebalanceReplicas()
		}
	}
	return nil
}

// advanceElections is etcd's InitialElectionTickAdvance for a restarted
// member: once a peer is reachable, every group that has heard no leader
// yet moves close to its election timeout (raftgroup's AdvanceElection),
// so a cluster restarted as a whole elects its leaders about a second
// sooner. A restarted node whose peers have leaders is refused by their
// pre-vote check and hears its leaders as before.
func (s *Server) advanceElections() {
	defer s.wg.Done()
	peers := map[uint64]bool{}
	for _, id := range s.groupIDs() {
		if st, ok := s.groupStatus(id); ok {
			for _, v := range st.Voters {
				if v != s.id.MemberID {
					peers[v] = true
				}
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		select {
		case <-s.stopc:
			cancel()
		case <-ctx.Done():
		}
	}()
	reached := make(chan uint64, len(peers))
	for id := range peers {
		conn, err := s.peers.Conn(id)
		if err != nil {
			continue
		}
		go func() {
			conn.Connect()
			for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
				if !conn.WaitForStateChange(ctx, st) {
					return
				}
			}
			reached <- id
		}()
	}
	select {
	case <-ctx.Done():
		return
	case id := <-reached:
		n := 0
		for _, g := range s.groupIDs() {
			if grp := s.host.Group(g); grp != nil && grp.Status().Lead == 0 {
				grp.AdvanceElection()
				n++
			}
		}
		s.log.Info("a peer is reachable: advanced the elections of the groups without a leader", "peer", formatID(id), "groups", n)
	}
}

// forwardCloser defers a partition's ForwardClose to the store, which
// exists only after the partitions.
type forwardCloser struct {
	id uint64
	f  func(rev int64)
}

func (fc *forwardCloser) forward(rev int64) {
	if fc.f != nil {
		fc.f(rev)
	}
}

// groupIDs lists every group of the cluster this node knows: the TSO,
// the meta group, the partitions of the map and this node's replicas.
func (s *Server) groupIDs() []uint64 {
	seen := map[uint64]bool{kvapi.TSOGroup: true, kvapi.MetaGroup: true}
	ids := []uint64{kvapi.TSOGroup, kvapi.MetaGroup}
	add := func(id uint64) {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	if s.store != nil {
		for _, rt := range s.store.Routes() {
			add(rt.ID)
		}
	}
	s.partsMu.Lock()
	for id := range s.parts {
		add(id)
	}
	s.partsMu.Unlock()
	slices.Sort(ids[2:])
	return ids
}

// groupStatus returns the status of this node's replica of group.
func (s *Server) groupStatus(id uint64) (raftgroup.Status, bool) {
	g := s.host.Group(id)
	if g == nil {
		return raftgroup.Status{}, false
	}
	return g.Status(), true
}

// alive reports whether node is believed up.
func (s *Server) alive(node uint64) bool {
	return s.membership == nil || node == s.id.MemberID || s.membership.Alive(node)
}

// leaderHint returns the node believed to lead group: this node's replica
// knows, or gossip.
func (s *Server) leaderHint(group uint64) uint64 {
	if g := s.host.Group(group); g != nil {
		if st := g.Status(); st.Lead != 0 {
			return st.Lead
		}
	}
	if s.membership != nil {
		if l, ok := s.membership.LeaderHint(group); ok {
			return l
		}
	}
	return 0
}

// alivePeers lists the other nodes gossip believes up.
func (s *Server) alivePeers() []uint64 {
	if s.membership == nil {
		return nil
	}
	var out []uint64
	for _, n := range s.membership.Nodes() {
		if n.Alive && n.Info.ID != s.id.MemberID {
			out = append(out, n.Info.ID)
		}
	}
	return out
}

// publishLeads gossips the groups this node leads, and its leader load
// (loadbalance.go) as of its leaderships now.
func (s *Server) publishLeads() {
	s.every(200*time.Millisecond, nil, func() {
		leads := s.Leading()
		s.membership.SetLeadsAndLoad(leads, s.ownLoad(leads))
	})
}

// every runs f every interval, and when kick (may be nil) fires, until
// the node stops; it is a goroutine counted in s.wg.
func (s *Server) every(interval time.Duration, kick <-chan struct{}, f func()) {
	defer s.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stopc:
			return
		case <-kick:
		case <-t.C:
		}
		f()
	}
}

// waitLeaders waits until every group of the node serves.
func (s *Server) waitLeaders(ctx context.Context) error {
	if err := s.oracle.WaitReady(ctx); err != nil {
		return fmt.Errorf("server: TSO has no leader: %w", err)
	}
	for {
		ok := s.meta.IsLeader()
		for _, p := range s.parts {
			ok = ok && p.IsLeader()
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server: raft groups have no leader: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// boundListener is a listener New bound before opening the store.
type boundListener struct {
	url string
	l   net.Listener
	tls bool
}

// listen binds the client and metrics listeners before the store opens,
// as etcd does: a client that connects while the node replays its log or
// waits for a leader waits in the connection (served as soon as the node
// is ready) instead of being refused and backing off for seconds.
func (s *Server) listen() error {
	bind := func(urls []string) ([]boundListener, error) {
		var out []boundListener
		for _, u := range urls {
			addr, useTLS, _ := clientListenAddr(u)
			l, err := net.Listen("tcp", addr)
			if err != nil {
				return out, fmt.Errorf("server: listen on %s: %w", u, err)
			}
			s.listeners = append(s.listeners, l)
			out = append(out, boundListener{url: u, l: l, tls: useTLS})
		}
		return out, nil
	}
	var err error
	if s.clientLs, err = bind(s.cfg.ListenClientURLs); err != nil {
		return err
	}
	s.metricsLs, err = bind(s.cfg.ListenMetricsURLs)
	return err
}

func (s *Server) serve() error {
	s.etcd = etcdcompat.New(etcdcompat.Config{
		Registerer:             s.registry,
		Store:                  s.store,
		Hub:                    s.hub,
		Maintenance:            &maintenance{s: s},
		ClusterID:              s.id.ClusterID,
		MemberID:               s.id.MemberID,
		Members:                s.members,
		MemberAdd:              s.memberAdd,
		MemberRemove:           s.memberRemove,
		Term:                   s.metaTerm,
		HasLeader:              s.hasLeader,
		ElectionTimeout:        s.cfg.ElectionTimeout,
		MaxRequestBytes:        s.cfg.MaxRequestBytes,
		MaxTxnOps:              s.cfg.MaxTxnOps,
		MaxInflightWrites:      max(s.cfg.MaxInflightWrites, 0),
		MaxInflightReads:       max(s.cfg.MaxInflightReads, 0),
		QuotaBackendBytes:      s.cfg.QuotaBackendBytes,
		ProgressNotifyInterval: s.cfg.WatchProgressNotifyInterval,
		Auth:                   s.auth,
		Logger:                 s.log,
	})
	s.grpc = grpc.NewServer(s.etcd.ServerOptions()...)
	s.etcd.Register(s.grpc)

	// The metrics listeners serve what etcd's serve: metrics and health,
	// nothing that changes or reveals the cluster's layout (the admin API
	// and pprof are served where client TLS and auth apply).
	metricsMux := http.NewServeMux()
	mux := http.NewServeMux()
	for _, m := range []*http.ServeMux{metricsMux, mux} {
		m.Handle("/metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
		m.HandleFunc("/health", s.handleHealth)
		m.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
		m.HandleFunc("/readyz", s.handleHealth)
	}
	// etcd's /version, which tools probe to learn the API they talk to.
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"etcdserver": etcdcompat.Version, "etcdcluster": etcdcompat.ClusterVersion, "storage": etcdcompat.Version})
	})
	s.registerAdmin(mux)
	if s.cfg.DiskFaults != nil {
		mux.Handle("/debug/diskfault", s.cfg.DiskFaults.Handler())
	}
	if s.cfg.EnablePprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	}
	var tlsConfig *tls.Config
	wrapTLS := func(b boundListener) (net.Listener, error) {
		if !b.tls {
			return b.l, nil
		}
		if tlsConfig == nil {
			var err error
			if tlsConfig, err = s.cfg.clientTLSConfig(); err != nil {
				return nil, err
			}
		}
		return tls.NewListener(b.l, tlsConfig), nil
	}
	var grpcLs []net.Listener
	for _, b := range s.clientLs {
		l, err := wrapTLS(b)
		if err != nil {
			return err
		}
		scheme := "http://"
		if b.tls {
			scheme = "https://"
		}
		s.clientURL = append(s.clientURL, scheme+l.Addr().String())
		m := cmux.New(l)
		grpcLs = append(grpcLs, m.Match(cmux.HTTP2()))
		httpL := m.Match(cmux.Any())
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		s.goServe(func() error { return hs.Serve(httpL) })
		s.goServe(func() error { return m.Serve() })
	}
	for _, b := range s.metricsLs {
		l, err := wrapTLS(b)
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: metricsMux, ReadHeaderTimeout: 10 * time.Second}
		s.goServe(func() error { return hs.Serve(l) })
	}
	s.wg.Add(1)
	go s.serveWhenReady(grpcLs)
	return nil
}

// serveWhenReady serves the etcd API on the client listeners once the
// node is ready: it knows a leader of the meta group and the TSO answers.
// etcd serves clients only once its member is ready (it has a leader and
// has applied its own membership); a node that took client streams
// before it knew a leader refused every watch opened with etcd's
// require-leader metadata, and etcd's client ends such a watch for good
// (kube-apiserver then re-lists). Until then, connections wait (HTTP/2
// clients in their handshake) and /health answers "NOT READY".
func (s *Server) serveWhenReady(grpcLs []net.Listener) {
	defer s.wg.Done()
	start := time.Now()
	for !s.readyToServe() {
		select {
		case <-s.stopc:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	for _, l := range grpcLs {
		s.goServe(func() error { return s.grpc.Serve(l) })
	}
	s.ready.Store(true)
	s.log.Info("serving client requests", "client-urls", s.clientURL, "waited", time.Since(start).Round(time.Millisecond).String(),
		"since-start", time.Since(s.began).Round(time.Millisecond).String())
}

// readyToServe reports whether the node knows a meta leader and can get a
// fresh revision from the TSO.
func (s *Server) readyToServe() bool {
	if !s.hasLeader() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ElectionTimeout)
	defer cancel()
	_, err := s.store.FreshRevision(ctx)
	return err == nil
}

// Ready reports whether the node serves client requests (see
// serveWhenReady).
func (s *Server) Ready() bool { return s.ready.Load() }

func (s *Server) goServe(f func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := f()
		select {
		case <-s.stopc:
			return // a stop closes every listener: nothing to report
		default:
		}
		if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, http.ErrServerClosed) &&
			!errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, cmux.ErrListenerClosed) && !errors.Is(err, cmux.ErrServerClosed) &&
			!strings.Contains(err.Error(), "use of closed") {
			s.log.Warn("listener stopped", "err", err)
		}
	}()
}

// handleHealth answers like etcd's /health: healthy when the node has a
// leader, no alarm, and can serve a linearizable read.
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	reason := ""
	switch {
	case !s.hasLeader():
		reason = "RAFT NO LEADER"
	case !s.ready.Load():
		reason = "NOT READY" // client requests are not served yet
	case len(s.meta.Alarms()) > 0:
		reason = "ALARM " + s.meta.Alarms()[0].Alarm.String()
	default:
		if _, err := s.store.Range(ctx, &pb.RangeRequest{Key: []byte("health")}); err != nil {
			reason = "QGET ERROR:" + err.Error()
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if reason != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "{\"health\":\"false\",\"reason\":%q}", reason)
		return
	}
	_, _ = w.Write([]byte(`{"health":"true","reason":""}`))
}

// HasLeader reports whether the node knows a leader of the meta group:
// watches with etcd's require-leader metadata are served.
func (s *Server) HasLeader() bool { return s.hasLeader() }

// hasLeader reports whether the node knows a leader of the meta group (the
// cluster can serve): its own replica's, or, on a node that has none yet,
// gossip's.
func (s *Server) hasLeader() bool {
	if g := s.host.Group(kvapi.MetaGroup); g != nil {
		return g.Status().Lead != 0
	}
	return s.leaderHint(kvapi.MetaGroup) != 0
}

// metaTerm is the meta group's raft term as this node knows it.
func (s *Server) metaTerm() uint64 {
	if g := s.host.Group(kvapi.MetaGroup); g != nil {
		return g.Status().Term
	}
	return 0
}

// servePeers serves the raft transport and the internal API on the peer
// listen URLs.
func (s *Server) servePeers() error {
	opts := append(rpccodec.PeerServerOptions(), rpccodec.ClusterServerOptions(s.id.ClusterID, s.refusedPeerCall)...)
	creds, _, err := s.cfg.peerCredentials()
	if err != nil {
		return err
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	s.peerGRPC = grpc.NewServer(opts...)
	raftgroup.RegisterService(s.peerGRPC, s.host)
	s.drainCalls = kvapi.RegisterInternalService(s.peerGRPC, countingHandler{s.store, s.internalCalls, s.feedSent})
	for _, u := range s.cfg.ListenPeerURLs {
		addr, err := listenAddr(u)
		if err != nil {
			return err
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("server: listen on %s: %w", u, err)
		}
		s.listeners = append(s.listeners, l)
		if s.peerURL == "" {
			s.peerURL = "http://" + l.Addr().String()
			if creds != nil {
				s.peerURL = "https://" + l.Addr().String()
			}
		}
		s.goServe(func() error { return s.peerGRPC.Serve(l) })
	}
	return nil
}

// countingHandler serves the internal API, counting calls by operation
// and feed messages by kind.
type countingHandler struct {
	*kvapi.Store
	calls *prometheus.CounterVec
	feeds *prometheus.CounterVec
}

func (h countingHandler) HandleCall(ctx context.Context, req *kvapi.CallRequest) ([]byte, error) {
	h.calls.WithLabelValues(req.Op.String()).Inc()
	return h.Store.HandleCall(ctx, req)
}

func (h countingHandler) ServeFeed(stream grpc.ServerStream) error {
	return h.Store.ServeFeed(countingFeed{stream, h.feeds.WithLabelValues("events"), h.feeds.WithLabelValues("closed")})
}

// countingFeed counts the messages a Feed stream sends.
type countingFeed struct {
	grpc.ServerStream
	events, closed prometheus.Counter
}

func (s countingFeed) SendMsg(m any) error {
	if fm, ok := m.(*kvapi.FeedMessage); ok && len(fm.Events) == 0 {
		s.closed.Inc()
	} else {
		s.events.Inc()
	}
	return s.ServerStream.SendMsg(m)
}

// refusedPeerCall counts a peer call from another cluster and logs it, at
// most every 10 seconds (a stale node retries for as long as it runs).
func (s *Server) refusedPeerCall(method, from string) {
	s.refused.Inc()
	now := time.Now().UnixNano()
	last := s.refusedLog.Load()
	if now-last < int64(10*time.Second) || !s.refusedLog.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn("refused a peer request from another cluster (a member of an old cluster at an address this one uses, or a node given the wrong peers)",
		"method", method, "from-cluster", from, "cluster", formatID(s.id.ClusterID))
}

// handOffLeadership transfers the leadership of every group this node
// leads to another voter, and waits (briefly) until it moved: a planned
// stop costs the cluster no election timeout.
func (s *Server) handOffLeadership() {
	deadline := time.Now().Add(3 * time.Second)
	for _, id := range s.groupIDs() {
		g := s.host.Group(id)
		if g == nil || !g.Status().IsLeader {
			continue
		}
		for _, v := range g.Status().Voters {
			if v != s.id.MemberID && s.membership.Alive(v) {
				g.TransferLeadership(v)
				break
			}
		}
	}
	for time.Now().Before(deadline) {
		leading := false
		for _, id := range s.groupIDs() {
			if g := s.host.Group(id); g != nil && g.Status().IsLeader && len(g.Status().Voters) > 1 {
				leading = true
			}
		}
		if !leading {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ClientURLs returns the URLs the node actually listens on (useful with
// port 0).
func (s *Server) ClientURLs() []string { return s.clientURL }

// Registry returns the node's metrics registry.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// Store returns the node's store (for tests and tools in this module).
func (s *Server) Store() *kvapi.Store { return s.store }

// Stop stops serving and closes the store. A clean stop shrinks the TSO
// window, so the next start continues the revision sequence without a gap.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		close(s.stopc)
		if s.host != nil {
			s.host.BeginStop()
		}
		if s.etcd != nil {
			// Watches and lease keep-alives end with "server stopped"
			// (their clients resume elsewhere): graceful stop waits only
			// for the requests under way.
			s.etcd.Close()
		}
		if s.grpc != nil {
			done := make(chan struct{})
			go func() { s.grpc.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				s.grpc.Stop()
			}
		}
		if s.hub != nil {
			s.hub.Stop()
		}
		if s.store != nil {
			s.store.Stop()
		}
		if s.oracle != nil && s.host != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.oracle.Close(ctx); err != nil {
				s.log.Warn("could not shrink the TSO window; the next leader skips revisions", "err", err)
			}
			cancel()
		}
		if s.membership != nil && s.host != nil {
			s.handOffLeadership()
		}
		if s.drainCalls != nil {
			// Calls other nodes forwarded here get their answers before
			// the peer connections close: a write under way when the
			// leadership moved learns its fate (raftgroup's
			// ProposeAsyncFate) instead of breaking its caller's stream.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.drainCalls(ctx); err != nil {
				s.log.Warn("stopping with calls from other nodes still under way; their writes are answered \"leader changed\"", "err", err)
			}
			cancel()
		}
		if s.peerGRPC != nil {
			// Gracefully, for a moment: the answers and the clean ends of
			// the Calls streams drained above are written out before the
			// connections close (Stop drops what is queued). The raft and
			// feed streams do not end by themselves: Stop ends them.
			done := make(chan struct{})
			go func() { s.peerGRPC.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(peerFlushWait):
				s.peerGRPC.Stop()
			}
		}
		s.closeListeners()
		s.wg.Wait()
		s.closeStorage(true)
		s.log.Info("brain node stopped")
	})
}

// peerFlushWait is how long a stopping node's peer server stops gracefully
// before it closes what is still open.
const peerFlushWait = 300 * time.Millisecond

func (s *Server) closeListeners() {
	for _, l := range s.listeners {
		_ = l.Close()
	}
}

// closeStorage stops the replicas and the raft host and closes the store;
// with flush (a clean stop) it first writes the memtables out, so that the
// next start has no write-ahead log to replay (after a crash, replaying up
// to a memtable's worth, 64 MiB, and flushing it takes a restarted node
// about a second before it can serve).
func (s *Server) closeStorage(flush bool) {
	if s.quota != nil {
		s.quota.stop()
	}
	s.partsMu.Lock()
	for _, p := range s.parts {
		p.Close()
	}
	s.partsMu.Unlock()
	if s.host != nil {
		s.host.Stop()
	}
	if s.transport != nil {
		s.transport.Close()
	}
	if s.peers != nil {
		s.peers.Close()
	}
	if s.membership != nil {
		s.membership.Stop()
	}
	if s.auth != nil {
		_ = s.auth.Close()
	}
	if s.db != nil {
		if flush {
			s.flushMemtables(5 * time.Second)
		}
		if err := s.db.Close(); err != nil {
			s.log.Warn("closing storage", "err", err)
		}
		s.db = nil
	}
}

// flushMemtables writes the memtables out, waiting at most d (a full or
// failing disk must not keep the node from stopping).
func (s *Server) flushMemtables(d time.Duration) {
	t0 := time.Now()
	done, err := s.db.AsyncFlush()
	if err != nil {
		s.log.Warn("could not flush the memtables before closing; the next start replays the write-ahead log", "err", err)
		return
	}
	select {
	case <-done:
		s.log.Debug("memtables flushed before closing", "took", time.Since(t0).Round(time.Millisecond).String())
	case <-time.After(d):
		s.log.Warn("the memtables did not flush in time before closing; the next start replays the write-ahead log", "waited", d.String())
	}
}

// Leading returns the groups this node leads.
func (s *Server) Leading() []uint64 {
	var out []uint64
	for _, id := range s.groupIDs() {
		if g := s.host.Group(id); g != nil && g.Status().IsLeader {
			out = append(out, id)
		}
	}
	return out
}

// GroupStatus returns the status of this node's replica of group id, if it
// has one.
func (s *Server) GroupStatus(id uint64) (raftgroup.Status, bool) { return s.groupStatus(id) }

// GroupIDs lists the cluster's raft groups (the TSO, the meta group, the
// partitions).
func (s *Server) GroupIDs() []uint64 { return s.groupIDs() }

// Removed is closed when the node learns it was removed from the cluster
// (etcd's MemberRemove); the process should then stop, as a removed etcd
// member does.
func (s *Server) Removed() <-chan struct{} { return s.removed }

// MemberID returns the node's member ID.
func (s *Server) MemberID() uint64 { return s.id.MemberID }

// MoveLeader hands this node's leadership of group id to node to (the TSO
// first shrinks its window, as on every planned move). It reports whether
// this node led the group.
func (s *Server) MoveLeader(id, to uint64) bool {
	g := s.host.Group(id)
	if g == nil || !g.Status().IsLeader {
		return false
	}
	s.transferLeadership(g, to, "operator")
	return true
}
