package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// watchPlan is what the writers and the watchers of one watch benchmark
// share.
type watchPlan struct {
	prefix   string   // every key written starts with it; the watchers watch it
	keys     []string // write seq goes to keys[seq%len(keys)]
	writes   int64    // number of writes
	interval float64  // nanoseconds between scheduled writes
	// revs[seq] is the revision the put of seq returned, 0 until it
	// succeeded.
	revs []atomic.Int64
	// delivered counts the events accepted by all watchers, for progress.
	delivered atomic.Int64
}

// newWatchPlan sizes the write load: cfg.Rate writes per second for
// cfg.Duration, capped at cfg.Total if that is set.
func newWatchPlan(cfg Config) *watchPlan {
	writes := int64(float64(cfg.Rate) * cfg.Duration.Seconds())
	if cfg.Total > 0 && (writes == 0 || cfg.Total < writes) {
		writes = cfg.Total
	}
	plan := &watchPlan{
		prefix:   groupPrefix(cfg.KeyPrefix, "watch-"+runID()),
		keys:     make([]string, min(int64(cfg.Keys), writes)),
		writes:   writes,
		interval: float64(time.Second) / float64(cfg.Rate),
		revs:     make([]atomic.Int64, writes),
	}
	for i := range plan.keys {
		plan.keys[i] = plan.prefix + zeroPad(int64(i))
	}
	return plan
}

// key returns the index in plan.keys of the key write seq goes to.
func (p *watchPlan) key(seq int64) int { return int(seq % int64(len(p.keys))) }

// validateWatch checks the settings RunWatch needs beyond validate's.
func (c *Config) validateWatch() error {
	if err := c.validate(); err != nil {
		return err
	}
	switch {
	case c.Watchers < 1:
		return errors.New("--watchers must be at least 1")
	case c.Rate < 1:
		return errors.New("--rate must be at least 1")
	case c.DrainTimeout <= 0:
		return errors.New("--drain-timeout must be positive")
	case int64(float64(c.Rate)*c.Duration.Seconds()) == 0 && c.Total == 0:
		return errors.New("--rate × --duration is less than one write")
	}
	return nil
}

// RunWatch measures watch fan-out the way kube-apiserver watches: it opens
// cfg.Watchers watches with prev_kv on one prefix, each on its own gRPC
// stream, then writes cfg.Rate values per second for cfg.Duration with the
// write time in each value. It reports the events delivered per second
// over all watchers and the delivery lag, and verifies that every watcher
// got every successful write exactly once, in revision order, with the
// previous value of the key as prev_kv.
func RunWatch(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.validateWatch(); err != nil {
		return Result{}, err
	}
	p, err := dial(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	defer p.close()
	plan := newWatchPlan(cfg)
	start, err := p.clients[0].Get(ctx, plan.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return Result{}, fmt.Errorf("read current revision: %w", err)
	}
	ws, stop, err := startWatchers(ctx, cfg, p, plan, start.Header.Revision+1)
	if err != nil {
		return Result{}, err
	}
	defer stop()
	writeStart := time.Now()
	stopProgress := startProgress(cfg.Progress, "watch/events", "events/s", plan.writes*int64(len(ws)), &plan.delivered)
	writes := runWrites(ctx, cfg, p, plan)
	drain(ctx, cfg, ws, writes.ops)
	stopProgress()
	stop()
	return watchResult(cfg, plan, ws, &writes, writeStart), ctx.Err()
}

// startWatchers opens the watches, spread round-robin over the pool, and
// waits until the server has confirmed every one. The returned stop
// cancels them and waits for their goroutines; it may be called twice.
func startWatchers(ctx context.Context, cfg Config, p *pool, plan *watchPlan, rev int64) ([]*watcher, func(), error) {
	wctx, cancel := context.WithCancel(ctx)
	ws := make([]*watcher, cfg.Watchers)
	for i := range ws {
		ws[i] = newWatcher(i, plan)
		// clientv3 shares one gRPC stream among the watches whose contexts
		// carry the same outgoing metadata: distinct metadata gives each
		// watcher a stream of its own, as separate apiservers would have.
		sctx := metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(wctx), "brainbench-watcher", strconv.Itoa(i))
		wch := p.client(i).Watch(sctx, plan.prefix, clientv3.WithPrefix(), clientv3.WithPrevKV(),
			clientv3.WithRev(rev), clientv3.WithCreatedNotify())
		go ws[i].run(wctx, wch)
	}
	stop := func() {
		cancel()
		for _, w := range ws {
			<-w.done
		}
	}
	if err := awaitCreated(ctx, ws, 30*time.Second); err != nil {
		stop()
		return nil, nil, err
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "[watch] %d watchers established from revision %d\n", len(ws), rev)
	}
	return ws, stop, nil
}

// awaitCreated waits until every watcher has its created response.
func awaitCreated(ctx context.Context, ws []*watcher, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for _, w := range ws {
		select {
		case <-w.created:
		case <-w.done:
			return fmt.Errorf("watcher %d ended before it was created: %s", w.id, w.firstProblem())
		case <-timer.C:
			return fmt.Errorf("watcher %d not created within %v", w.id, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// runWrites performs the plan's writes on schedule with cfg.Clients
// writers, each value carrying its write time and sequence number.
func runWrites(ctx context.Context, cfg Config, p *pool, plan *watchPlan) loadStats {
	wcfg := cfg
	wcfg.Total, wcfg.Duration = plan.writes, 0
	pace := func(seq int64) time.Duration { return time.Duration(float64(seq) * plan.interval) }
	return runLoad(ctx, "watch/writes", wcfg, p, func(ctx context.Context, w *worker, seq int64) error {
		v := w.value
		binary.BigEndian.PutUint64(v[0:8], uint64(time.Now().UnixNano()))
		binary.BigEndian.PutUint64(v[8:16], uint64(seq))
		resp, err := w.cli.Put(ctx, plan.keys[plan.key(seq)], string(v))
		if err != nil {
			return err
		}
		plan.revs[seq].Store(resp.Header.Revision)
		return nil
	}, pace)
}

// drain waits until every watcher has want events, has failed, or
// cfg.DrainTimeout has passed, then a little longer to catch duplicates.
func drain(ctx context.Context, cfg Config, ws []*watcher, want int64) {
	deadline := time.Now().Add(cfg.DrainTimeout)
	for ctx.Err() == nil && time.Now().Before(deadline) && !allDrained(ws, want) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if cfg.Progress != nil {
		var got int64
		for _, w := range ws {
			got += w.events.Load()
		}
		fmt.Fprintf(cfg.Progress, "[watch] drained: %d/%d events\n", got, want*int64(len(ws)))
	}
}

func allDrained(ws []*watcher, want int64) bool {
	for _, w := range ws {
		if w.events.Load() < want && !w.failed.Load() && !w.finished() {
			return false
		}
	}
	return true
}

// watchResult verifies the watchers and summarizes the run.
func watchResult(cfg Config, plan *watchPlan, ws []*watcher, writes *loadStats, writeStart time.Time) Result {
	r := newResult("watch", cfg, writes)
	var lag Histogram
	var events int64
	var last time.Time
	for _, w := range ws {
		lag.Merge(&w.lag)
		events += w.events.Load()
		if w.lastRecv.After(last) {
			last = w.lastRecv
		}
	}
	r.Ops, r.Unit, r.Throughput = events, "events/s", 0
	r.Seconds = 0
	if events > 0 {
		r.Seconds = last.Sub(writeStart).Seconds()
		r.Throughput = float64(events) / r.Seconds
	}
	r.setLatency(&lag)
	r.Watch = &WatchStats{
		Watchers:    len(ws),
		Writes:      writes.ops,
		WriteErrors: writes.errors,
		TargetRate:  cfg.Rate,
		WriteRate:   float64(writes.ops) / writes.elapsed.Seconds(),
		WriteP99:    ms(writes.hist.Percentile(0.99)),
	}
	verify(plan, ws, r.Watch)
	return r
}
