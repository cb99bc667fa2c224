package server

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/brainkv/brain/auth"
	"github.com/brainkv/brain/internal/diskfault"
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
	// ListenMetricsURLs (--listen-metrics-urls) additionally serve /metrics,
	// /health, /livez and /readyz, and nothing else (as etcd's): the admin
	// API and pprof are on the client URLs only.
	ListenMetricsURLs []string
	// MaxRequestBytes (--max-request-bytes); default 1.5 MiB.
	MaxRequestBytes uint
	// MaxTxnOps (--max-txn-ops); default 128.
	MaxTxnOps int
	// MaxInflightWrites and MaxInflightReads (--max-inflight-writes,
	// --max-inflight-reads) shed load past that many requests in service
	// (see etcdcompat.Config); negative: no limit; 0: the default 1000.
	MaxInflightWrites, MaxInflightReads int64
	// QuotaBackendBytes (--quota-backend-bytes): the storage size past which
	// the NOSPACE alarm is raised and writes refused; default 8 GiB (etcd's
	// recommended maximum; its default is 2 GiB).
	QuotaBackendBytes int64
	// HeartbeatInterval (--heartbeat-interval) and ElectionTimeout
	// (--election-timeout), as in etcd; defaults 100ms and 1s.
	HeartbeatInterval time.Duration
	ElectionTimeout   time.Duration
	// MaxSerializableStaleness (--max-serializable-staleness) bounds how
	// stale a serializable read may be while the node reaches the TSO
	// (kvapi.Config.MaxStaleness); default 100ms, negative: no bound.
	MaxSerializableStaleness time.Duration
	// AuthToken (--auth-token) is etcd's: "simple" (default) or
	// "jwt,pub-key=...,priv-key=...,sign-method=...[,ttl=...]".
	AuthToken string
	// AuthTokenTTL (--auth-token-ttl): how long a simple token lives
	// unused; default 300 s.
	AuthTokenTTL time.Duration
	// BcryptCost (--bcrypt-cost) hashes passwords; default 10.
	BcryptCost int
	// WatchProgressNotifyInterval (--watch-progress-notify-interval);
	// default 10m.
	WatchProgressNotifyInterval time.Duration
	// WatchFeedsIdleAfter (--watch-feeds-idle-after): a node merges the
	// events of the partitions its watches cover; one no watch on the
	// node has covered for this long (and, after start, every partition
	// for this long) it stops receiving (and stops asking to close
	// revisions for it) until a watch covers it again. Default 30s;
	// negative: every partition is merged all the time.
	WatchFeedsIdleAfter time.Duration
	// Client TLS, with etcd's flags: https client URLs serve TLS with
	// CertFile/KeyFile (--cert-file, --key-file); with ClientCertAuth
	// (--client-cert-auth) a client must present a certificate signed by
	// a CA in TrustedCAFile (--trusted-ca-file).
	CertFile, KeyFile, TrustedCAFile string
	ClientCertAuth                   bool
	// Peer TLS, with etcd's flags: with PeerCertFile/PeerKeyFile
	// (--peer-cert-file, --peer-key-file) every peer URL must be https and
	// all traffic between nodes (raft, the internal API) is TLS, verified
	// against PeerTrustedCAFile (--peer-trusted-ca-file) both ways; with
	// PeerClientCertAuth (--peer-client-cert-auth) a node must present a
	// certificate from that CA to be served.
	PeerCertFile, PeerKeyFile, PeerTrustedCAFile string
	PeerClientCertAuth                           bool

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
	// MemTableBytes (--memtable-bytes) is the storage memtable size;
	// default 64 MiB.
	MemTableBytes uint64
	// EmergencyBallastBytes (--emergency-ballast-bytes) is the size of the
	// file a node keeps in its data directory and deletes by itself when
	// it starts on a full disk, so that replaying its write-ahead log has
	// room (ballast.go); BallastAuto: 1% of the disk, at least
	// MemTableBytes, at most 256 MiB and 5% of the disk. 0: none (the
	// zero Config, as tests use it; brainnode's default is BallastAuto).
	EmergencyBallastBytes int64
	// ValueSeparationMinBytes (--value-separation-min-bytes): stored values
	// at least this large go to blob files, which compactions do not
	// rewrite (engine.Config's; 0: 256 bytes, negative: none).
	ValueSeparationMinBytes int
	// RaftLogKeep (--raft-log-keep) and RaftTruncateEvery
	// (--raft-truncate-every): a group's log keeps RaftLogKeep applied
	// entries after a truncation, which runs once RaftTruncateEvery more
	// have been applied (raftgroup.Config's LogKeepEntries and
	// TruncateEvery; 0: raftgroup's defaults). Entries truncated before
	// the memtable holding them is flushed never reach an sstable.
	RaftLogKeep, RaftTruncateEvery uint64
	// Replicas (--replicas) is how many replicas each partition, the TSO
	// and the meta group have (fewer if the cluster has fewer members);
	// default 3.
	Replicas int
	// Placement (--placement) is how partitions' replicas are laid out
	// over the members: "copysets" (default) or "ring" (see placement.go);
	// fixed when the cluster is created.
	Placement string
	// GossipAddr (--gossip-addr) is the host:port memberlist gossips on;
	// default: the first peer listen URL's host, its port + 1. Other
	// members' gossip addresses follow the same rule from their peer URLs.
	GossipAddr string
	// GossipKeyFile (--gossip-key-file) holds a base64 key (16, 24 or 32
	// bytes decoded) that encrypts and authenticates membership gossip;
	// every member needs the same key. With peer TLS, gossip also runs over
	// TLS with the peer certificates (only nodes with a certificate from
	// the peer CA take part), key or not; without either, gossip is plain
	// text. Either way a member's peer address is its configured one, not
	// what gossip says, and only members count.
	GossipKeyFile string
	// LeaderBalanceInterval is how often a node hands leaderships to their
	// preferred nodes or to less loaded ones (spreading leaders and their
	// writes over the cluster); default 5s.
	LeaderBalanceInterval time.Duration
	// FastGossip uses memberlist's local-network timings (tests).
	FastGossip bool
	// TestingLocalSplitKeys (tests only; default defaultLocalSplitKeys)
	// is the most keys a partition splitting by load or size may hold for
	// its new half to be placed anywhere (see keepVoters).
	TestingLocalSplitKeys int
	// Join (--join) is a member's client URL: a node with a new store
	// asks it to add this node to the cluster (etcd's MemberAdd) and joins
	// (implies --initial-cluster-state=existing).
	Join string
	// AllowJoin (--allow-join) makes a one-member store a cluster of one:
	// it serves its peer listener and gossip, so other nodes can --join
	// it. A store keeps it once started with it; a store created with
	// several members (or by a join) is always a cluster. Without it a
	// single node opens no peer or gossip port and refuses MemberAdd.
	AllowJoin bool
	// DeadNodeTimeout (--dead-node-timeout) is how long gossip must have
	// considered a node dead before the leaders of its groups replace its
	// replicas on other nodes; default 1m.
	DeadNodeTimeout time.Duration
	// ReplicaCheckInterval is how often a node checks its replicas (adds,
	// removals, repairs); default 1s.
	ReplicaCheckInterval time.Duration
	// RebalanceInterval (--rebalance-interval) is how often the leader of
	// a partition compares its replicas with the placement over the
	// current members and moves one (rebalance.go); default 10s, negative
	// disables rebalancing.
	RebalanceInterval time.Duration
	// SplitKeys (--split-keys): a partition whose leader holds more keys
	// splits at its middle key; default 250000, negative: never.
	SplitKeys int
	// SplitWriteRate (--split-write-rate): a partition whose leader
	// evaluated more writes per second than this over a SplitWindow
	// splits at the middle of a sample of the keys written, so a hot key
	// range spreads over partitions (and, placed by the leader balancer
	// and the rebalancer, over nodes); default 0: never. With it, a node
	// whose leader load no leadership move can even out splits one of its
	// partitions taking at least a quarter of it for balance
	// (loadbalance.go). Splits can make a
	// multi-key txn that spanned the split key cross-partition (refused):
	// Kubernetes writes one key per txn.
	SplitWriteRate float64
	// SplitWindow (--split-window) is how often leaders check their
	// partitions' size and write rate, and measure the leader load the
	// leader balancer evens out (loadbalance.go); default 10s.
	SplitWindow time.Duration

	// Logger; default: stderr at LogLevel in LogFormat.
	Logger *slog.Logger
	// LogLevel (--log-level): debug, info, warn, error; default info.
	LogLevel string
	// LogFormat (--log-format): text (for people) or json (for log
	// collectors); default text when stderr is a terminal, else json.
	LogFormat string
	// FS is the filesystem (tests use vfs.NewMem()); default the OS's.
	FS vfs.FS
	// DiskFaults, when set, wraps FS with its injector and serves
	// /debug/diskfault on the client URLs (chaos runs only; brainnode sets
	// it when started with BRAIN_DISK_FAULTS=1).
	DiskFaults *diskfault.Injector
}

// DefaultMaxInflight is the default of --max-inflight-writes and
// --max-inflight-reads.
const DefaultMaxInflight = 1000

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
	if c.MaxInflightWrites == 0 {
		c.MaxInflightWrites = DefaultMaxInflight
	}
	if c.MaxInflightReads == 0 {
		c.MaxInflightReads = DefaultMaxInflight
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
	if c.Placement == "" {
		c.Placement = PlacementCopysets
	}
	if c.LeaderBalanceInterval == 0 {
		c.LeaderBalanceInterval = 5 * time.Second
	}
	if c.DeadNodeTimeout == 0 {
		c.DeadNodeTimeout = time.Minute
	}
	if c.TestingLocalSplitKeys == 0 {
		c.TestingLocalSplitKeys = defaultLocalSplitKeys
	}
	if c.ReplicaCheckInterval == 0 {
		c.ReplicaCheckInterval = time.Second
	}
	if c.RebalanceInterval == 0 {
		c.RebalanceInterval = 10 * time.Second
	}
	if c.SplitKeys == 0 {
		c.SplitKeys = 250000
	}
	if c.SplitWindow <= 0 {
		c.SplitWindow = 10 * time.Second
	}
	if c.Join != "" {
		c.InitialClusterState = "existing"
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
}

// gossipKey reads --gossip-key-file (nil without one).
func (c *Config) gossipKey() ([]byte, error) {
	if c.GossipKeyFile == "" {
		return nil, nil
	}
	b, err := os.ReadFile(c.GossipKeyFile)
	if err != nil {
		return nil, fmt.Errorf("--gossip-key-file: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("--gossip-key-file %s: not base64: %w", c.GossipKeyFile, err)
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("--gossip-key-file %s: the key is %d bytes; want 16, 24 or 32 (e.g. head -c 32 /dev/urandom | base64)", c.GossipKeyFile, n)
	}
	return key, nil
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	if _, err := c.gossipKey(); err != nil {
		errs = append(errs, err)
	}
	if err := auth.ValidateToken(c.AuthToken); err != nil {
		errs = append(errs, err)
	}
	tlsURLs := 0
	for _, u := range append(append([]string(nil), c.ListenClientURLs...), c.ListenMetricsURLs...) {
		if _, tls, err := clientListenAddr(u); err != nil {
			errs = append(errs, err)
		} else if tls {
			tlsURLs++
		}
	}
	if tlsURLs > 0 && (c.CertFile == "" || c.KeyFile == "") {
		errs = append(errs, fmt.Errorf("https client URLs need --cert-file and --key-file"))
	}
	if c.ClientCertAuth && c.TrustedCAFile == "" {
		errs = append(errs, fmt.Errorf("--client-cert-auth needs --trusted-ca-file"))
	}
	if tlsURLs == 0 && (c.CertFile != "" || c.ClientCertAuth) {
		errs = append(errs, fmt.Errorf("--cert-file and --client-cert-auth apply to https client URLs, and --listen-client-urls has none"))
	}
	peerTLS := c.PeerCertFile != "" || c.PeerKeyFile != ""
	if peerTLS && (c.PeerCertFile == "" || c.PeerKeyFile == "" || c.PeerTrustedCAFile == "") {
		errs = append(errs, fmt.Errorf("peer TLS needs --peer-cert-file, --peer-key-file and --peer-trusted-ca-file"))
	}
	if c.PeerClientCertAuth && !peerTLS {
		errs = append(errs, fmt.Errorf("--peer-client-cert-auth needs --peer-cert-file and --peer-key-file"))
	}
	peerURLs := append(append([]string(nil), c.ListenPeerURLs...), c.InitialAdvertisePeerURLs...)
	if m, err := parseInitialCluster(c.InitialCluster); err == nil {
		for _, urls := range m {
			peerURLs = append(peerURLs, urls...)
		}
	}
	slices.Sort(peerURLs)
	for _, u := range slices.Compact(peerURLs) {
		if isHTTPS := strings.HasPrefix(u, "https://"); isHTTPS != peerTLS {
			if peerTLS {
				errs = append(errs, fmt.Errorf("peer URL %q: with peer TLS every peer URL must be https", u))
			} else {
				errs = append(errs, fmt.Errorf("peer URL %q: https peer URLs need --peer-cert-file and --peer-key-file", u))
			}
		}
	}
	if strings.HasPrefix(c.Join, "https://") && c.TrustedCAFile == "" && c.PeerTrustedCAFile == "" {
		errs = append(errs, fmt.Errorf("--join %q: an https member needs --trusted-ca-file (or --peer-trusted-ca-file) to verify it", c.Join))
	}
	if c.LeaderBalanceInterval < 0 {
		errs = append(errs, fmt.Errorf("--leader-balance-interval must be positive, not %v", c.LeaderBalanceInterval))
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
	if c.Placement != PlacementCopysets && c.Placement != PlacementRing {
		errs = append(errs, fmt.Errorf("--placement must be %q or %q, not %q", PlacementCopysets, PlacementRing, c.Placement))
	}
	if c.Join != "" {
		if _, err := listenAddr(c.Join); err != nil {
			errs = append(errs, fmt.Errorf("--join: %w", err))
		}
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
	switch c.LogFormat {
	case "", "text", "json":
	default:
		errs = append(errs, fmt.Errorf("--log-format must be text or json, not %q", c.LogFormat))
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("--log-level must be debug, info, warn or error, not %q", c.LogLevel))
	}
	return errors.Join(errs...)
}

// clientListenAddr returns host:port of a client URL, http or https (TLS).
func clientListenAddr(raw string) (addr string, tls bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false, fmt.Errorf("invalid URL %q: %w", raw, err)
	}
	addr, err = listenAddr(raw)
	return addr, u.Scheme == "https", err
}

// listenAddr returns host:port of an http URL.
func listenAddr(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("invalid URL %q: %w", raw, err)
	}
	switch u.Scheme {
	case "http", "https": // TLS or not is decided by the caller
	default:
		return "", fmt.Errorf("URL %q: scheme must be http or https", raw)
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
