package raftgroup

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Host. Zero fields take their defaults.
type Config struct {
	// NodeID is this node's raft ID; required, non-zero.
	NodeID uint64
	// TickInterval is the length of one raft tick; default 100ms (etcd's
	// --heartbeat-interval default).
	TickInterval time.Duration
	// ElectionTicks is the election timeout in ticks; default 10 (one second,
	// etcd's --election-timeout default).
	ElectionTicks int
	// HeartbeatTicks is the heartbeat interval in ticks; default 1.
	HeartbeatTicks int
	// Workers is the number of worker goroutines driving groups; default 4.
	// Rounds are mostly waiting on the WAL sync, so a few more workers than
	// cores keeps the disk busy.
	Workers int
	// MaxGroupsPerRound bounds how many groups one worker processes in one
	// round (one sync); default 64.
	MaxGroupsPerRound int
	// MaxSizePerMsg bounds the bytes of entries in one append message;
	// default 1 MiB.
	MaxSizePerMsg uint64
	// MaxInflightMsgs bounds in-flight append messages per follower; default
	// 256.
	MaxInflightMsgs int
	// LogKeepEntries is how many applied entries stay in the log after a
	// truncation; default 64. TruncateEvery is how many applied entries
	// beyond that trigger a truncation; default 64. A short log is cheap
	// storage: an entry deleted while the memtable holding it is not yet
	// flushed never reaches an sstable (with 512 and 1024, every create's
	// log entry was flushed and compacted before its deletion caught up,
	// about half the bytes a node flushed). A leader keeps whatever its
	// followers still need; only a follower that trails a new leader by
	// more than the log it kept needs a snapshot.
	LogKeepEntries uint64
	TruncateEvery  uint64
	// MaxFollowerLag is how many entries a follower may lag before the
	// leader truncates the log past it regardless; default 100000.
	MaxFollowerLag uint64
	// SnapshotTimeout bounds sending one snapshot; default 5 minutes.
	SnapshotTimeout time.Duration
	// NewReplica, if set, creates the state machine of a group this node
	// does not host when a peer sends a message for it (a replica being
	// added here); the replica starts empty and is caught up by snapshot.
	// It returns nil to refuse.
	NewReplica func(group uint64) (StateMachine, error)
	// TombstoneTTL is how long messages for a removed replica are dropped
	// rather than re-creating it; default 10s.
	TombstoneTTL time.Duration
	// FateGrace bounds how long a leader that lost leadership keeps the
	// proposers of Group.ProposeAsyncFate waiting for their commands'
	// fate; default two election timeouts.
	FateGrace time.Duration
	// Logger is the structured logger; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the host's metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

// EnsureDefaults fills zero fields with defaults.
func (c *Config) EnsureDefaults() {
	if c.TickInterval == 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = 1
	}
	if c.FateGrace == 0 {
		c.FateGrace = 2 * time.Duration(c.ElectionTicks) * c.TickInterval
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.MaxGroupsPerRound == 0 {
		c.MaxGroupsPerRound = 64
	}
	if c.MaxSizePerMsg == 0 {
		c.MaxSizePerMsg = 1 << 20
	}
	if c.MaxInflightMsgs == 0 {
		c.MaxInflightMsgs = 256
	}
	if c.LogKeepEntries == 0 {
		c.LogKeepEntries = 64
	}
	if c.TruncateEvery == 0 {
		c.TruncateEvery = 64
	}
	if c.MaxFollowerLag == 0 {
		c.MaxFollowerLag = 100000
	}
	if c.SnapshotTimeout == 0 {
		c.SnapshotTimeout = 5 * time.Minute
	}
	if c.TombstoneTTL == 0 {
		c.TombstoneTTL = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem with the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeID == 0 {
		errs = append(errs, errors.New("raftgroup: NodeID must be non-zero"))
	}
	if c.HeartbeatTicks >= c.ElectionTicks {
		errs = append(errs, fmt.Errorf("raftgroup: HeartbeatTicks (%d) must be less than ElectionTicks (%d)", c.HeartbeatTicks, c.ElectionTicks))
	}
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("raftgroup: Workers (%d) must be positive", c.Workers))
	}
	return errors.Join(errs...)
}
