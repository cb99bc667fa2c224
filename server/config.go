package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Config is a node's configuration. Field names follow etcd's flags where
// etcd has the same notion. Zero fields take their defaults.
type Config struct {
	// Name is the member name (--name); default "default".
	Name string
	// DataDir is the data directory (--data-dir); default "default.brain".
	DataDir string
	// ListenClientURLs (--listen-client-urls) serve the etcd API, /health
	// and /metrics; default http://127.0.0.1:2379.
	ListenClientURLs []string
	// AdvertiseClientURLs (--advertise-client-urls) are reported to
	// clients; default: the listen URLs.
	AdvertiseClientURLs []string
	// ListenPeerURLs (--listen-peer-urls); default http://127.0.0.1:2380.
	ListenPeerURLs []string
	// InitialAdvertisePeerURLs (--initial-advertise-peer-urls); default:
	// the peer listen URLs.
	InitialAdvertisePeerURLs []string
	// InitialCluster (--initial-cluster) is "name=peerURL,...";
	// default "<name>=<first advertised peer URL>".
	InitialCluster string
	// InitialClusterState (--initial-cluster-state): "new" or "existing".
	InitialClusterState string
	// InitialClusterToken (--initial-cluster-token); default "etcd-cluster".
	InitialClusterToken string
	// ListenMetricsURLs (--listen-metrics-urls) additionally serve /metrics
	// and /health.
	ListenMetricsURLs []string
	// MaxRequestBytes (--max-request-bytes); default 1.5 MiB.
	MaxRequestBytes uint
	// MaxTxnOps (--max-txn-ops); default 128.
	MaxTxnOps int
	// QuotaBackendBytes (--quota-backend-bytes): the storage size past which
	// the NOSPACE alarm is raised and writes refused; default 8 GiB (etcd's
	// recommended maximum; its default is 2 GiB).
	QuotaBackendBytes int64
	// HeartbeatInterval (--heartbeat-interval) and ElectionTimeout
	// (--election-timeout), as in etcd; defaults 100ms and 1s.
	HeartbeatInterval time.Duration
	ElectionTimeout   time.Duration
	// WatchProgressNotifyInterval (--watch-progress-notify-interval);
	// default 10m.
	WatchProgressNotifyInterval time.Duration
	// EnablePprof (--enable-pprof) serves /debug/pprof on client URLs.
	EnablePprof bool

	// brain-only settings.

	// InitialSplitPoints (--initial-split-points) are the keys at which the
	// keyspace is split into partitions when the store is created; they are
	// persisted and later changes are ignored. Default: four partitions that
	// separate Kubernetes' busiest resources.
	InitialSplitPoints []string
	// TSOWindow (--tso-window) is how many revisions one TSO log write
	// reserves; default 1000.
	TSOWindow int64
	// RaftWorkers (--raft-workers) drive the raft groups; default 4.
	RaftWorkers int
	// CacheBytes (--cache-bytes) is the storage block cache; default 128 MiB.
	CacheBytes int64
	// Replicas (--replicas) is how many replicas each partition, the TSO
	// and the meta group have (fewer if the cluster has fewer members);
	// default 3.
	Replicas int
	// GossipAddr (--gossip-addr) is the host:port memberlist gossips on;
	// default: the first peer listen URL's host, its port + 1. Other
	// members' gossip addresses follow the same rule from their peer URLs.
	GossipAddr string
	// LeaderBalanceInterval is how often a node hands leaderships to their
	// preferred nodes (spreading leaders over the cluster); default 5s.
	LeaderBalanceInterval time.Duration
	// FastGossip uses memberlist's local-network timings (tests).
	FastGossip bool

	// Logger; default: JSON to stderr at LogLevel.
	Logger *slog.Logger
	// LogLevel (--log-level): debug, info, warn, error; default info.
	LogLevel string
	// FS is the filesystem (tests use vfs.NewMem()); default the OS's.
	FS vfs.FS
}

// DefaultSplitPoints separate the resources a Kubernetes cluster writes
// most: events, leases (node heartbeats) and pods get partitions of their
// own, everything else shares the first.
var DefaultSplitPoints = []string{"/registry/events/", "/registry/leases/", "/registry/pods/"}

// EnsureDefaults fills zero fields.
func (c *Config) EnsureDefaults() {
	if c.Name == "" {
		c.Name = "default"
	}
	if c.DataDir == "" {
		c.DataDir = "default.brain"
	}
	if len(c.ListenClientURLs) == 0 {
		c.ListenClientURLs = []string{"http://127.0.0.1:2379"}
	}
	if len(c.AdvertiseClientURLs) == 0 {
		c.AdvertiseClientURLs = c.ListenClientURLs
	}
	if len(c.ListenPeerURLs) == 0 {
		c.ListenPeerURLs = []string{"http://127.0.0.1:2380"}
	}
	if len(c.InitialAdvertisePeerURLs) == 0 {
		c.InitialAdvertisePeerURLs = c.ListenPeerURLs
	}
	if c.InitialCluster == "" {
		c.InitialCluster = c.Name + "=" + c.InitialAdvertisePeerURLs[0]
	}
	if c.InitialClusterState == "" {
		c.InitialClusterState = "new"
	}
	if c.InitialClusterToken == "" {
		c.InitialClusterToken = "etcd-cluster"
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 1.5 * 1024 * 1024
	}
	if c.MaxTxnOps == 0 {
		c.MaxTxnOps = 128
	}
	if c.QuotaBackendBytes == 0 {
		c.QuotaBackendBytes = 8 << 30
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 100 * time.Millisecond
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = time.Second
	}
	if c.WatchProgressNotifyInterval == 0 {
		c.WatchProgressNotifyInterval = 10 * time.Minute
	}
	if c.InitialSplitPoints == nil {
		c.InitialSplitPoints = DefaultSplitPoints
	}
	if c.TSOWindow == 0 {
		c.TSOWindow = 1000
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.Replicas == 0 {
		c.Replicas = 3
	}
	if c.LeaderBalanceInterval == 0 {
		c.LeaderBalanceInterval = 5 * time.Second
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	for _, u := range append(append([]string(nil), c.ListenClientURLs...), c.ListenMetricsURLs...) {
		if _, err := listenAddr(u); err != nil {
			errs = append(errs, err)
		}
	}
	if c.HeartbeatInterval*5 > c.ElectionTimeout {
		errs = append(errs, fmt.Errorf("--election-timeout (%v) should be at least 5 times --heartbeat-interval (%v)", c.ElectionTimeout, c.HeartbeatInterval))
	}
	if c.InitialClusterState != "new" && c.InitialClusterState != "existing" {
		errs = append(errs, fmt.Errorf("--initial-cluster-state must be \"new\" or \"existing\", not %q", c.InitialClusterState))
	}
	members, err := parseInitialCluster(c.InitialCluster)
	if err != nil {
		errs = append(errs, err)
	} else {
		if _, ok := members[c.Name]; !ok {
			errs = append(errs, fmt.Errorf("--initial-cluster %q has no member named %q (--name)", c.InitialCluster, c.Name))
		}
		for name, urls := range members {
			for _, u := range urls {
				if _, err := listenAddr(u); err != nil {
					errs = append(errs, fmt.Errorf("--initial-cluster member %s: %w", name, err))
				}
			}
		}
	}
	if c.Replicas < 1 {
		errs = append(errs, fmt.Errorf("--replicas must be at least 1"))
	}
	if c.InitialClusterState == "existing" {
		errs = append(errs, errors.New("--initial-cluster-state=existing (joining a cluster) is not supported by this build"))
	}
	sps := append([]string(nil), c.InitialSplitPoints...)
	if !sort.StringsAreSorted(sps) {
		errs = append(errs, errors.New("--initial-split-points must be in ascending order"))
	}
	for i, s := range sps {
		if s == "" {
			errs = append(errs, errors.New("--initial-split-points must not contain the empty key"))
		}
		if i > 0 && sps[i-1] == s {
			errs = append(errs, fmt.Errorf("--initial-split-points repeats %q", s))
		}
	}
	if c.TSOWindow < 1 {
		errs = append(errs, fmt.Errorf("--tso-window must be positive"))
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("--log-level must be debug, info, warn or error, not %q", c.LogLevel))
	}
	return errors.Join(errs...)
}

// listenAddr returns host:port of an http URL.
func listenAddr(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("invalid URL %q: %w", raw, err)
	}
	switch u.Scheme {
	case "http", "unix":
	case "https", "unixs":
		return "", fmt.Errorf("URL %q: TLS listeners are not supported by this build", raw)
	default:
		return "", fmt.Errorf("URL %q: scheme must be http", raw)
	}
	if u.Host == "" {
		return "", fmt.Errorf("URL %q has no host:port", raw)
	}
	return u.Host, nil
}

// parseInitialCluster parses "name=url,name=url".
func parseInitialCluster(s string) (map[string][]string, error) {
	out := make(map[string][]string)
	for _, part := range strings.Split(s, ",") {
		name, u, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == "" || u == "" {
			return nil, fmt.Errorf("--initial-cluster entry %q is not name=peerURL", part)
		}
		out[name] = append(out[name], u)
	}
	return out, nil
}
