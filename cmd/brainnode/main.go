package main

import (
	"fmt"
	"github.com/brainkv/brain/internal/diskfault"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/etcdcompat"
	"github.com/brainkv/brain/server"
	"github.com/spf13/cobra"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	var cfg server.Config
	var memoryLimitRatio float64
	cmd := &cobra.Command{
		Use:   "brainnode",
		Short: "brainnode runs an etcd-compatible metadata store node",
		Long: `brainnode runs an etcd-compatible metadata store node.

Without flags it serves a single-node store on 127.0.0.1:2379 with its data
in ./default.brain. Flags follow etcd's names where etcd has the same notion.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if os.Getenv("BRAIN_DISK_FAULTS") == "1" {
				// chaos runs only: disk faults switched at runtime through
				// /debug/diskfault (see internal/diskfault).
				cfg.DiskFaults = new(diskfault.Injector)
			}
			// Its failure is logged; the node runs without a soft limit.
			_, _ = server.SetMemoryLimit(memoryLimitRatio, server.CgroupMemoryLimit, server.NewLogger(cfg.LogLevel, cfg.LogFormat))
			s, err := server.New(cfg)
			if err != nil {
				return err
			}
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
			select {
			case <-sig:
			case <-s.Removed():
			}
			s.Stop()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Name, "name", "default", "Human-readable name for this member.")
	f.StringVar(&cfg.DataDir, "data-dir", "default.brain", "Path to the data directory.")
	f.StringSliceVar(&cfg.ListenClientURLs, "listen-client-urls", []string{"http://127.0.0.1:2379"}, "List of URLs to listen on for client traffic (etcd API, /health, /metrics).")
	f.StringSliceVar(&cfg.AdvertiseClientURLs, "advertise-client-urls", nil, "List of this member's client URLs to advertise (default: --listen-client-urls).")
	f.StringSliceVar(&cfg.ListenPeerURLs, "listen-peer-urls", []string{"http://127.0.0.1:2380"}, "List of URLs to listen on for peer traffic.")
	f.StringSliceVar(&cfg.InitialAdvertisePeerURLs, "initial-advertise-peer-urls", nil, "List of this member's peer URLs to advertise (default: --listen-peer-urls).")
	f.StringVar(&cfg.InitialCluster, "initial-cluster", "", "Initial cluster configuration for bootstrapping, name=peerURL,... (default: this member alone).")
	f.StringVar(&cfg.InitialClusterState, "initial-cluster-state", "new", "Initial cluster state ('new' or 'existing').")
	f.StringVar(&cfg.InitialClusterToken, "initial-cluster-token", "etcd-cluster", "Initial cluster token for the cluster during bootstrap.")
	f.StringSliceVar(&cfg.ListenMetricsURLs, "listen-metrics-urls", nil, "List of additional URLs to serve /metrics, /health, /livez and /readyz on (and nothing else).")
	f.UintVar(&cfg.MaxRequestBytes, "max-request-bytes", etcdcompat.DefaultMaxRequestBytes, "Maximum client request size in bytes the server will accept.")
	f.IntVar(&cfg.MaxTxnOps, "max-txn-ops", 128, "Maximum number of operations permitted in a transaction.")
	f.Int64Var(&cfg.MaxInflightWrites, "max-inflight-writes", server.DefaultMaxInflight, "brain: writes served at once; past it writes are refused with etcd's \"too many requests\" (load shedding). Negative: no limit.")
	f.Int64Var(&cfg.MaxInflightReads, "max-inflight-reads", server.DefaultMaxInflight, "brain: reads (Range) served at once; past it reads are refused with etcd's \"too many requests\". Negative: no limit.")
	f.Float64Var(&memoryLimitRatio, "memory-limit-ratio", server.DefaultMemoryLimitRatio, "brain: set Go's soft memory limit (GOMEMLIMIT) to this fraction of the node's cgroup memory limit (a container's --memory), so the garbage collector works harder before the kernel would kill the node; 0: leave it alone. No effect without a cgroup limit; a GOMEMLIMIT in the environment wins.")
	f.Int64Var(&cfg.QuotaBackendBytes, "quota-backend-bytes", 8<<30, "Raise the NOSPACE alarm and refuse writes when the storage exceeds this size.")
	f.Var(msDuration{d: &cfg.HeartbeatInterval}, "heartbeat-interval", "Time of a heartbeat interval (default 100ms); a plain number is milliseconds, as in etcd.")
	f.Var(msDuration{d: &cfg.ElectionTimeout}, "election-timeout", "Time for an election to timeout (default 1s); a plain number is milliseconds, as in etcd.")
	f.DurationVar(&cfg.WatchProgressNotifyInterval, "watch-progress-notify-interval", 0, "Interval of progress notifications to idle watches that ask for them (default 10m).")
	f.DurationVar(&cfg.MaxSerializableStaleness, "max-serializable-staleness", 0, "brain: a serializable read reads at least what the cluster had acknowledged this long ago, waiting for an idle partition to close it (one TSO round trip when the node has not heard the TSO for as long); if the TSO does not answer within 250 ms the read is served from what the node has (default 100ms; negative: always what the node has, as stale as its idle partitions).")
	f.DurationVar(&cfg.WatchFeedsIdleAfter, "watch-feeds-idle-after", 0, "Stop merging a partition's events on this node once no watch on it has covered the partition for this long, until one does (default 30s; negative, e.g. -1s: merge every partition all the time).")
	f.StringVar(&cfg.CertFile, "cert-file", "", "Path to the client server TLS cert file (for https client URLs).")
	f.StringVar(&cfg.KeyFile, "key-file", "", "Path to the client server TLS key file.")
	f.StringVar(&cfg.TrustedCAFile, "trusted-ca-file", "", "Path to the client server TLS trusted CA cert file.")
	f.BoolVar(&cfg.ClientCertAuth, "client-cert-auth", false, "Enable client cert authentication.")
	f.StringVar(&cfg.AuthToken, "auth-token", "simple", "Specify auth token specific options: simple, or jwt,pub-key=...,priv-key=...,sign-method=...[,ttl=...].")
	cfg.AuthTokenTTL = 300 * time.Second
	f.Var(msDuration{d: &cfg.AuthTokenTTL, unit: time.Second}, "auth-token-ttl", "The lifetime of a simple auth token: seconds, as etcd takes it (300), or a duration (5m).")
	f.IntVar(&cfg.BcryptCost, "bcrypt-cost", 10, "Specify bcrypt algorithm cost factor for auth password hashing.")
	f.StringVar(&cfg.PeerCertFile, "peer-cert-file", "", "Path to the peer server TLS cert file (every peer URL must then be https).")
	f.StringVar(&cfg.PeerKeyFile, "peer-key-file", "", "Path to the peer server TLS key file.")
	f.StringVar(&cfg.PeerTrustedCAFile, "peer-trusted-ca-file", "", "Path to the peer server TLS trusted CA file.")
	f.BoolVar(&cfg.PeerClientCertAuth, "peer-client-cert-auth", false, "Enable peer client cert authentication.")
	f.BoolVar(&cfg.EnablePprof, "enable-pprof", false, "Serve runtime profiling data at /debug/pprof/ on client URLs.")
	f.StringVar(&cfg.LogLevel, "log-level", "info", "Log level: debug, info, warn, error.")
	f.StringVar(&cfg.LogFormat, "log-format", "", "brain: log format: text (for people) or json (for log collectors); default text when stderr is a terminal, else json.")
	f.StringSliceVar(&cfg.InitialSplitPoints, "initial-split-points", server.DefaultSplitPoints, "brain: keys at which a new store splits its keyspace into partitions (ignored once the store exists).")
	f.Int64Var(&cfg.TSOWindow, "tso-window", 1000, "brain: revisions one TSO log write reserves; a crash skips at most this many.")
	f.IntVar(&cfg.RaftWorkers, "raft-workers", 4, "brain: goroutines driving the raft groups.")
	f.Int64Var(&cfg.CacheBytes, "cache-bytes", 128<<20, "brain: storage block cache size in bytes.")
	f.Uint64Var(&cfg.RaftLogKeep, "raft-log-keep", 0, "brain: applied entries a raft group's log keeps after a truncation (0: 64).")
	f.Uint64Var(&cfg.RaftTruncateEvery, "raft-truncate-every", 0, "brain: a raft group's log is truncated once this many more entries have been applied (0: 64).")
	f.Uint64Var(&cfg.MemTableBytes, "memtable-bytes", 64<<20, "brain: storage memtable size in bytes (writes are buffered in memory up to this much before a flush to disk).")
	f.Int64Var(&cfg.EmergencyBallastBytes, "emergency-ballast-bytes", server.BallastAuto, "brain: size of the EMERGENCY_BALLAST file kept in the data directory and deleted by the node when it starts on a full disk, so that replaying its write-ahead log has room (-1: 1% of the disk, at least --memtable-bytes, at most 256 MiB and 5% of the disk; 0: none).")
	f.IntVar(&cfg.ValueSeparationMinBytes, "value-separation-min-bytes", engine.DefaultValueSeparationMinBytes, "brain: stored values at least this large are kept in blob files that compactions move by reference instead of rewriting (-1: every value stays in the sstables).")
	f.IntVar(&cfg.Replicas, "replicas", 3, "brain: replicas of each partition, the TSO and the meta group (fewer if the cluster has fewer members); fixed when the cluster is created.")
	f.StringVar(&cfg.Placement, "placement", server.PlacementCopysets, "brain: how partitions' replicas are laid out over the members: copysets (groups of --replicas nodes that hold the same partitions, so a node exchanges raft traffic with few peers) or ring (each partition on the next --replicas members after its own); fixed when the cluster is created.")
	f.StringVar(&cfg.GossipKeyFile, "gossip-key-file", "", "brain: file holding a base64 key (16, 24 or 32 bytes) that encrypts membership gossip; every member needs the same one.")
	f.StringVar(&cfg.GossipAddr, "gossip-addr", "", "brain: host:port for membership gossip (default: the first peer listen URL's port + 1).")
	f.StringVar(&cfg.Join, "join", "", "brain: client URL of any member; a node with a new store asks it to add this node and joins the cluster (implies --initial-cluster-state=existing).")
	f.BoolVar(&cfg.AllowJoin, "allow-join", false, "brain: a single node (one member) also serves --listen-peer-urls and gossip, so other nodes can --join it; the store keeps this once started with it. Without it a single node opens no peer port and refuses member add.")
	f.DurationVar(&cfg.DeadNodeTimeout, "dead-node-timeout", time.Minute, "brain: how long a node must be down before its replicas are re-created on other nodes (when there are enough).")
	f.DurationVar(&cfg.LeaderBalanceInterval, "leader-balance-interval", 5*time.Second, "brain: how often a node hands the leaderships it holds to their preferred nodes or, by load, to less loaded voters (a load move still waits for two --split-window windows of confirmation).")
	f.DurationVar(&cfg.RebalanceInterval, "rebalance-interval", 10*time.Second, "brain: how often a partition's leader moves a replica toward the placement over the current members, so nodes that joined get their share of replicas and leaderships (negative: never).")
	f.IntVar(&cfg.SplitKeys, "split-keys", 250000, "brain: a partition with more keys than this splits at its middle key (negative: never).")
	f.Float64Var(&cfg.SplitWriteRate, "split-write-rate", 0, "brain: a partition taking more writes per second than this over --split-window splits at the middle of the keys written, so a hot key range spreads over partitions and nodes (0: never); a node whose leader load no leadership move can even out also splits a partition taking a quarter of it or more for balance. A split can make a multi-key txn across the split key cross-partition (refused); Kubernetes writes one key per txn.")
	f.DurationVar(&cfg.SplitWindow, "split-window", 10*time.Second, "brain: how often partition leaders check size and write rate for splits, and measure the write load the leader balancer evens out over the nodes.")
	cmd.AddCommand(statusCmd(), transferLeaderCmd(), moveReplicaCmd(), splitCmd(), snapshotCmd(), migrateCmd(), versionCmd(), gossipKeyCmd())
	cmd.Version = buildVersion()
	cmd.SetVersionTemplate("{{.Version}}\n")
	return cmd
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print brainnode's build (version, commit, Go) and the etcd API version it reports",
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), buildVersion())
		},
	}
}

// buildVersion describes this binary from its build information: the
// module version, the commit it was built from (and whether the tree had
// changes), when, and the Go release, with the etcd API version it
// reports.
func buildVersion() string {
	v, commit, when, modified, goVersion := "(devel)", "", "", false, runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	out := "brainnode " + v
	if commit != "" {
		out += " commit " + commit[:min(12, len(commit))]
		if modified {
			out += " (modified)"
		}
	}
	if when != "" {
		out += " built " + when
	}
	return out + " " + goVersion + ", etcd API " + etcdcompat.Version
}

func snapshotCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Backup files"}
	var rc server.RestoreConfig
	var peers []string
	restore := &cobra.Command{
		Use:   "restore FILE",
		Short: "Create a new data directory from a backup (saved with 'etcdctl snapshot save')",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rc.SnapshotPath = args[0]
			rc.InitialAdvertisePeerURLs = peers
			rc.Progress = func(n int64) { fmt.Fprintf(os.Stderr, "\rrestored %d versions", n) }
			h, err := server.Restore(rc)
			if err != nil {
				return err
			}
			compacted := "never compacted"
			if h.CompactRevision > 0 {
				compacted = fmt.Sprintf("compacted at %d", h.CompactRevision)
			}
			fmt.Fprintf(os.Stderr, "\nrestored revision %d (%s) into %s\n", h.Revision, compacted, rc.DataDir)
			return nil
		},
	}
	f := restore.Flags()
	f.StringVar(&rc.DataDir, "data-dir", "default.brain", "Data directory to create.")
	f.StringVar(&rc.Name, "name", "default", "Member name of the new node.")
	f.StringSliceVar(&peers, "initial-advertise-peer-urls", []string{"http://127.0.0.1:2380"}, "Peer URLs of the new node.")
	f.StringVar(&rc.InitialClusterToken, "initial-cluster-token", "etcd-cluster", "Cluster token of the new node.")
	cmd.AddCommand(restore)
	return cmd
}
