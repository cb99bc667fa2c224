package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/etcdcompat"
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
	"google.golang.org/grpc"
)

// Raft group IDs.
const (
	tsoGroupID       = 1
	metaGroupID      = 2
	firstPartitionID = 100
)

// Server is one brain node.
type Server struct {
	cfg      Config
	log      *slog.Logger
	registry *prometheus.Registry
	db       *pebble.DB
	id       *identity
	host     *raftgroup.Host
	tso      *tso.Oracle
	meta     *meta.Meta
	parts    []*partition.Partition
	store    *kvapi.Store
	hub      *etcdcompat.Hub
	etcd     *etcdcompat.Server
	grpc     *grpc.Server
	quota    *quota

	listeners []net.Listener
	clientURL []string // the addresses actually bound
	wg        sync.WaitGroup
	stopOnce  sync.Once
}

// New opens (or creates) the node's store and starts it: when New returns,
// every raft group has a leader and the node serves.
func New(cfg Config) (*Server, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = newLogger(cfg.LogLevel)
	}
	s := &Server{cfg: cfg, log: log, registry: prometheus.NewRegistry()}
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := s.open(); err != nil {
		s.closeStorage()
		return nil, err
	}
	if err := s.serve(); err != nil {
		s.Stop()
		return nil, err
	}
	s.log.Info("brain node ready", "name", s.id.Name, "member-id", fmt.Sprintf("%x", s.id.MemberID),
		"client-urls", s.clientURL, "data-dir", cfg.DataDir, "partitions", len(s.parts), "revision", s.store.CurrentRevision())
	return s, nil
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(strings.ToUpper(level)))
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

func (s *Server) open() error {
	cfg := s.cfg
	if err := cfg.FS.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("server: create data dir: %w", err)
	}
	db, err := engine.Open(engine.Config{Dir: filepath.Join(cfg.DataDir, "pebble"), FS: cfg.FS, CacheBytes: cfg.CacheBytes, Logger: s.log})
	if err != nil {
		return err
	}
	s.db = db
	if s.id, err = loadIdentity(db); err != nil {
		return err
	}
	if s.id == nil {
		s.id = &identity{
			Name:        cfg.Name,
			PeerURLs:    cfg.InitialAdvertisePeerURLs,
			SplitPoints: append([]string(nil), cfg.InitialSplitPoints...),
		}
		s.id.MemberID = memberID(s.id.PeerURLs, cfg.InitialClusterToken)
		s.id.ClusterID = clusterID([]uint64{s.id.MemberID})
		b := db.NewBatch()
		if err := saveIdentity(b, s.id); err != nil {
			return err
		}
		if err := b.Commit(pebble.Sync); err != nil {
			return err
		}
		s.log.Info("created a new store", "data-dir", cfg.DataDir, "split-points", s.id.SplitPoints)
	} else if strings.Join(s.id.SplitPoints, "\x00") != strings.Join(cfg.InitialSplitPoints, "\x00") {
		s.log.Warn("--initial-split-points differ from the store's; using the store's", "store", s.id.SplitPoints)
	}

	s.host, err = raftgroup.NewHost(raftgroup.Config{
		NodeID:         s.id.MemberID,
		TickInterval:   cfg.HeartbeatInterval,
		ElectionTicks:  int(cfg.ElectionTimeout / cfg.HeartbeatInterval),
		HeartbeatTicks: 1,
		Workers:        cfg.RaftWorkers,
		Logger:         s.log,
		Registerer:     s.registry,
	}, db, nil)
	if err != nil {
		return err
	}
	voters := []uint64{s.id.MemberID}
	if s.tso, err = tso.New(tso.Config{WindowSize: cfg.TSOWindow, Logger: s.log, Registerer: s.registry}, db, tsoGroupID); err != nil {
		return err
	}
	// etcd's minimum lease TTL: 1.5 election timeouts, rounded up.
	minTTL := int64((3*cfg.ElectionTimeout/2 + time.Second - 1) / time.Second)
	if s.meta, err = meta.New(meta.Config{MinLeaseTTL: minTTL, Logger: s.log}, db, metaGroupID); err != nil {
		return err
	}
	s.hub = etcdcompat.NewHub(etcdcompat.HubConfig{Registerer: s.registry}, nil)
	pm := partition.NewMetrics(s.registry)
	bounds := append([]string{""}, s.id.SplitPoints...)
	for i, start := range bounds {
		var end []byte
		if i+1 < len(bounds) {
			end = []byte(bounds[i+1])
		}
		p, err := partition.New(partition.Config{
			ID: uint64(firstPartitionID + i), Start: []byte(start), End: end,
			DB: db, Revisions: s.tso, Leases: s.meta, Feed: s.hub, Metrics: pm, Logger: s.log,
		})
		if err != nil {
			return err
		}
		s.parts = append(s.parts, p)
		s.hub.AddPartition(p.ID(), p.Closed())
	}
	s.quota = newQuota(db, s.meta, s.id.MemberID, cfg.QuotaBackendBytes)
	if s.store, err = kvapi.NewStore(kvapi.Config{Partitions: s.parts, TSO: s.tso, Meta: s.meta, Logger: s.log, Quota: s.quota.check}); err != nil {
		return err
	}
	s.hub.SetSource(s.store)
	// Events applied before a restart are in the event logs, not the hub.
	s.hub.SetHistoryStart(s.tso.Current() + 1)

	g, err := s.host.CreateGroup(tsoGroupID, voters, s.tso)
	if err != nil {
		return err
	}
	s.tso.Bind(g)
	if g, err = s.host.CreateGroup(metaGroupID, voters, s.meta); err != nil {
		return err
	}
	s.meta.Bind(g)
	for _, p := range s.parts {
		g, err := s.host.CreateGroup(p.ID(), voters, p)
		if err != nil {
			return err
		}
		p.Bind(g)
	}
	s.host.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.waitLeaders(ctx); err != nil {
		return err
	}
	s.store.StartLeaseExpiry(500 * time.Millisecond)
	s.quota.start()
	return nil
}

// waitLeaders waits until every group of the node serves.
func (s *Server) waitLeaders(ctx context.Context) error {
	if err := s.tso.WaitReady(ctx); err != nil {
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

func (s *Server) serve() error {
	s.etcd = etcdcompat.New(etcdcompat.Config{
		Store:                  s.store,
		Hub:                    s.hub,
		Maintenance:            &maintenance{s: s},
		ClusterID:              s.id.ClusterID,
		MemberID:               s.id.MemberID,
		Members:                s.members,
		Term:                   func() uint64 { return s.host.Group(metaGroupID).Status().Term },
		HasLeader:              func() bool { return s.meta.IsLeader() },
		MaxRequestBytes:        s.cfg.MaxRequestBytes,
		MaxTxnOps:              s.cfg.MaxTxnOps,
		QuotaBackendBytes:      s.cfg.QuotaBackendBytes,
		ProgressNotifyInterval: s.cfg.WatchProgressNotifyInterval,
		Logger:                 s.log,
	})
	s.grpc = grpc.NewServer(s.etcd.ServerOptions()...)
	s.etcd.Register(s.grpc)

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/health", s.handleHealth)
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", s.handleHealth)
	if s.cfg.EnablePprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	}
	for _, u := range s.cfg.ListenClientURLs {
		addr, _ := listenAddr(u)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("server: listen on %s: %w", u, err)
		}
		s.listeners = append(s.listeners, l)
		s.clientURL = append(s.clientURL, "http://"+l.Addr().String())
		m := cmux.New(l)
		grpcL := m.Match(cmux.HTTP2())
		httpL := m.Match(cmux.Any())
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		s.goServe(func() error { return s.grpc.Serve(grpcL) })
		s.goServe(func() error { return hs.Serve(httpL) })
		s.goServe(func() error { return m.Serve() })
	}
	for _, u := range s.cfg.ListenMetricsURLs {
		addr, _ := listenAddr(u)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("server: listen on %s: %w", u, err)
		}
		s.listeners = append(s.listeners, l)
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		s.goServe(func() error { return hs.Serve(l) })
	}
	return nil
}

func (s *Server) goServe(f func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := f(); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, http.ErrServerClosed) &&
			!errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, cmux.ErrListenerClosed) && !strings.Contains(err.Error(), "use of closed") {
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
	case !s.meta.IsLeader():
		reason = "RAFT NO LEADER"
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

func (s *Server) members() []*pb.Member {
	return []*pb.Member{{
		ID:         s.id.MemberID,
		Name:       s.id.Name,
		PeerURLs:   s.id.PeerURLs,
		ClientURLs: s.cfg.AdvertiseClientURLs,
	}}
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
		if s.grpc != nil {
			done := make(chan struct{})
			go func() { s.grpc.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				s.grpc.Stop()
			}
		}
		for _, l := range s.listeners {
			_ = l.Close()
		}
		s.wg.Wait()
		if s.store != nil {
			s.store.Stop()
		}
		if s.tso != nil && s.host != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.tso.Close(ctx); err != nil {
				s.log.Warn("could not shrink the TSO window; the next start skips revisions", "err", err)
			}
			cancel()
		}
		s.closeStorage()
		s.log.Info("brain node stopped")
	})
}

func (s *Server) closeStorage() {
	if s.quota != nil {
		s.quota.stop()
	}
	for _, p := range s.parts {
		p.Close()
	}
	if s.host != nil {
		s.host.Stop()
	}
	if s.db != nil {
		if err := s.db.Close(); err != nil {
			s.log.Warn("closing storage", "err", err)
		}
		s.db = nil
	}
}
