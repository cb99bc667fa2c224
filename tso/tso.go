package tso

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"
)

// ErrNotLeader is returned by Next on a replica that is not the serving
// leader.
var ErrNotLeader = errors.New("tso: not leader")

// InitialRevision is the revision of a fresh, empty store.
const InitialRevision = 1

// Config configures an Oracle.
type Config struct {
	// WindowSize is how many revisions one raft extension reserves; default
	// 1000. Larger means fewer log writes and larger gaps after a crash.
	WindowSize int64
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

func (c *Config) ensureDefaults() {
	if c.WindowSize == 0 {
		c.WindowSize = 1000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Oracle is the TSO state machine and, on the leader, the allocator.
type Oracle struct {
	cfg     Config
	groupID uint64
	group   *raftgroup.Group
	log     *slog.Logger

	// end is the applied window end W; written by Apply (worker goroutine).
	end atomic.Int64
	// current is the highest revision issued (or, before this replica led,
	// the applied W). Readers use it without the lock.
	current atomic.Int64

	mu struct {
		sync.Mutex
		leader    bool          // protected by mu
		term      uint64        // protected by mu
		next      int64         // next revision to issue; protected by mu
		extending bool          // an extension is in flight; protected by mu
		changed   chan struct{} // closed when end or leadership changes
		closed    bool
	}

	issued  prometheus.Counter
	extends prometheus.Counter
	batch   prometheus.Histogram
}

// New creates the oracle for raft group groupID, loading its applied state.
// Call Bind with the group once it is created.
func New(cfg Config, db *pebble.DB, groupID uint64) (*Oracle, error) {
	cfg.ensureDefaults()
	o := &Oracle{cfg: cfg, groupID: groupID, log: cfg.Logger.With("component", "tso")}
	o.mu.changed = make(chan struct{})
	end := int64(InitialRevision)
	v, closer, err := db.Get(o.stateKey())
	switch err {
	case nil:
		end = int64(binary.BigEndian.Uint64(v))
		closer.Close()
	case pebble.ErrNotFound:
	default:
		return nil, fmt.Errorf("tso: load state: %w", err)
	}
	o.end.Store(end)
	o.current.Store(end)
	o.issued = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_tso_revisions_issued_total", Help: "Revisions issued by this node's TSO leader."})
	o.extends = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_tso_window_extensions_total", Help: "TSO window extensions written through raft."})
	o.batch = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "brain_tso_batch_size", Help: "Revisions handed out per TSO request.", Buckets: prometheus.ExponentialBuckets(1, 2, 10)})
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(o.issued, o.extends, o.batch)
	}
	return o, nil
}

// Bind attaches the oracle to its raft group.
func (o *Oracle) Bind(g *raftgroup.Group) { o.group = g }

func (o *Oracle) stateKey() []byte { return engine.GroupKey(o.groupID, "tso") }

// Current returns the highest revision issued so far. Every revision a
// write has been acknowledged with is <= Current().
func (o *Oracle) Current() int64 { return o.current.Load() }

// Next issues n consecutive revisions and returns the first.
func (o *Oracle) Next(ctx context.Context, n int64) (int64, error) {
	if n <= 0 {
		return 0, fmt.Errorf("tso: Next(%d): n must be positive", n)
	}
	o.mu.Lock()
	for {
		if o.mu.closed || !o.mu.leader {
			o.mu.Unlock()
			return 0, ErrNotLeader
		}
		end := o.end.Load()
		if o.mu.next+n-1 <= end {
			first := o.mu.next
			o.mu.next += n
			o.current.Store(o.mu.next - 1)
			// Extend ahead of need so writers rarely wait on the log.
			if end-o.mu.next < o.cfg.WindowSize/2 {
				o.extendLocked(end)
			}
			o.mu.Unlock()
			o.issued.Add(float64(n))
			o.batch.Observe(float64(n))
			return first, nil
		}
		o.extendLocked(max(end, o.mu.next+n-1))
		ch := o.mu.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		o.mu.Lock()
	}
}

func (o *Oracle) extendLocked(from int64) {
	if o.mu.extending {
		return
	}
	o.mu.extending = true
	o.extends.Inc()
	cmd := encodeCmd(cmdExtend, o.mu.term, from+o.cfg.WindowSize)
	o.group.ProposeAsync(cmd, func(_ any, err error) {
		o.mu.Lock()
		o.mu.extending = false
		if err != nil {
			o.notifyLocked()
		}
		o.mu.Unlock()
	})
}

func (o *Oracle) notifyLocked() {
	close(o.mu.changed)
	o.mu.changed = make(chan struct{})
}

// Close shrinks the window to the last issued revision (so a clean restart
// continues without a gap) and stops issuing.
func (o *Oracle) Close(ctx context.Context) error {
	o.mu.Lock()
	if o.mu.closed {
		o.mu.Unlock()
		return nil
	}
	o.mu.closed = true
	leader, term, last := o.mu.leader, o.mu.term, o.mu.next-1
	o.notifyLocked()
	o.mu.Unlock()
	if !leader {
		return nil
	}
	_, err := o.group.Propose(ctx, encodeCmd(cmdShrink, term, last))
	return err
}

// Commands.
const (
	cmdExtend byte = 1
	cmdShrink byte = 2
)

func encodeCmd(kind byte, term uint64, end int64) []byte {
	b := append(raftgroup.NewCommand(17), kind)
	b = binary.BigEndian.AppendUint64(b, term)
	return binary.BigEndian.AppendUint64(b, uint64(end))
}

// Apply implements raftgroup.StateMachine.
func (o *Oracle) Apply(ac *raftgroup.ApplyContext, e *raftpb.Entry, cmd []byte) any {
	if len(cmd) != 17 {
		o.log.Error("malformed tso command; ignored", "index", e.Index)
		return nil
	}
	kind, term, end := cmd[0], binary.BigEndian.Uint64(cmd[1:9]), int64(binary.BigEndian.Uint64(cmd[9:17]))
	// A command evaluated by a leader of another term is stale: a newer
	// leader may already be issuing from the applied window.
	if term != e.Term {
		return nil
	}
	cur := o.end.Load()
	var next int64
	switch kind {
	case cmdExtend:
		next = max(cur, end)
	case cmdShrink:
		next = min(cur, max(end, InitialRevision))
	default:
		o.log.Error("unknown tso command; ignored", "kind", kind, "index", e.Index)
		return nil
	}
	if next == cur {
		return nil
	}
	if err := ac.Batch.Set(o.stateKey(), engine.PutUint64(nil, uint64(next)), nil); err != nil {
		panic(err)
	}
	ac.AfterCommit(func() {
		o.end.Store(next)
		o.mu.Lock()
		o.notifyLocked()
		o.mu.Unlock()
	})
	return nil
}

// LeadershipChanged implements raftgroup.LeadershipObserver.
func (o *Oracle) LeadershipChanged(leader bool, term uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mu.leader, o.mu.term = leader, term
	if leader {
		o.mu.next = o.end.Load() + 1
		o.current.Store(o.mu.next - 1)
		o.log.Info("tso leader ready", "term", term, "next", o.mu.next)
	}
	o.notifyLocked()
}

// WaitReady blocks until this replica is the serving leader.
func (o *Oracle) WaitReady(ctx context.Context) error {
	for {
		o.mu.Lock()
		leader, ch := o.mu.leader, o.mu.changed
		o.mu.Unlock()
		if leader {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WriteRestoredState writes the state of a TSO restored from a backup taken
// at revision rev: the next revision issued is rev+1.
func WriteRestoredState(b *pebble.Batch, groupID uint64, rev int64) error {
	return b.Set(engine.GroupKey(groupID, "tso"), engine.PutUint64(nil, uint64(rev)), nil)
}
