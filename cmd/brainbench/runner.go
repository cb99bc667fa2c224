package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// pool is a set of etcd clients, each with its own gRPC connection.
type pool struct {
	clients []*clientv3.Client
}

// dialTimeout bounds connecting to the endpoints.
const dialTimeout = 10 * time.Second

// dial opens cfg.conns() clients to cfg.Endpoints and makes one read on
// each, so that an unreachable endpoint fails fast and no measured
// operation pays for connection setup.
func dial(ctx context.Context, cfg Config) (*pool, error) {
	p := &pool{}
	for range cfg.conns() {
		c, err := clientv3.New(clientv3.Config{
			Endpoints:   cfg.Endpoints,
			DialTimeout: dialTimeout,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			p.close()
			return nil, fmt.Errorf("connect to %v: %w", cfg.Endpoints, err)
		}
		p.clients = append(p.clients, c)
		if err := warmUp(ctx, c); err != nil {
			p.close()
			return nil, fmt.Errorf("connect to %v: %w", cfg.Endpoints, err)
		}
	}
	return p, nil
}

// warmUp makes one read on c.
func warmUp(ctx context.Context, c *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	_, err := c.Get(ctx, "brainbench-ping")
	return err
}

// client returns the client of worker i: workers are spread round-robin.
func (p *pool) client(i int) *clientv3.Client { return p.clients[i%len(p.clients)] }

func (p *pool) close() {
	for _, c := range p.clients {
		c.Close()
	}
}

// worker is the state of one load goroutine. Only its goroutine touches it
// until the load finishes.
type worker struct {
	id        int
	cli       *clientv3.Client
	rng       *rand.Rand
	value     []byte // value-size bytes of filler, stamped per operation
	hist      Histogram
	errors    int64
	conflicts int64 // update: failed compares that were retried
	firstErr  error
	kinds     map[string]int64 // failures (measured or not) by message
	// Operations that ended outside the measured window (--measure-last):
	// successful and failed ones.
	unmeasured, unmeasuredErrors int64
}

func newWorker(cfg Config, p *pool, id int) *worker {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(id)))
	return &worker{id: id, cli: p.client(id), rng: rng, value: filler(rng, cfg.ValueSize)}
}

// filler returns n printable pseudo-random bytes.
func filler(rng *rand.Rand, n int) []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return b
}

// opFunc performs operation number seq (0-based, unique across workers).
type opFunc func(ctx context.Context, w *worker, seq int64) error

// loadStats is what a load loop measured.
type loadStats struct {
	ops       int64 // successful operations
	errors    int64
	conflicts int64
	elapsed   time.Duration
	hist      Histogram
	firstErr  error
	kinds     map[string]int64 // failures (measured or not) by message
	// Under --measure-last: the operations that ended before the measured
	// window or after it (the load's in-flight operations draining),
	// successful and failed; the fields above count the window's only.
	unmeasured, unmeasuredErrors int64
	// cpu holds the nodes' CPU counters around the measured window
	// (cfg.cpu set); cpuErr says why they could not be read.
	cpu    *cpuWindow
	cpuErr error
}

// window is the span of time whose operations a load measures: those that
// end in [from, to). The zero window measures every operation.
type window struct{ from, to time.Time }

func (w window) contains(t time.Time) bool {
	return w.from.IsZero() || (!t.Before(w.from) && t.Before(w.to))
}

// paceFunc returns when, relative to the start of the load, operation seq
// is due; a worker waits until then before it starts the operation's
// clock. A nil paceFunc runs operations back to back.
type paceFunc func(seq int64) time.Duration

// runLoad runs op on cfg.Clients workers until cfg.Total operations have
// been issued or cfg.Duration has passed, whichever comes first. Failed
// operations are counted, not retried; once more than cfg.MaxErrors have
// failed, no more are issued. With cfg.MeasureLast, only the operations
// that end in the last MeasureLast of the Duration are measured (the load
// before it is a ramp the system under test adapts to), and
// cfg.WindowFile is created when that window begins. Without a Duration,
// MeasureLast and WindowFile are ignored and every operation is measured:
// the populate and watch-write phases of a --measure-last run rely on that.
func runLoad(ctx context.Context, name string, cfg Config, p *pool, op opFunc, pace paceFunc) loadStats {
	workers := make([]*worker, cfg.Clients)
	for i := range workers {
		workers[i] = newWorker(cfg, p, i)
	}
	var issued, done, failed atomic.Int64
	start := time.Now()
	var deadline time.Time
	if cfg.Duration > 0 {
		deadline = start.Add(cfg.Duration)
	}
	var win window
	if cfg.MeasureLast > 0 && !deadline.IsZero() {
		win = window{from: deadline.Add(-cfg.MeasureLast), to: deadline}
		if cfg.WindowFile != "" {
			mark := time.AfterFunc(time.Until(win.from), func() { markWindow(cfg.WindowFile, cfg.Progress, name) })
			defer mark.Stop()
		}
	}
	cpu := startCPU(ctx, cfg.cpu, win)
	stopProgress := startProgress(cfg.Progress, name, "ops/s", cfg.Total, &done)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil && (deadline.IsZero() || time.Now().Before(deadline)) && failed.Load() <= cfg.MaxErrors {
				seq := issued.Add(1) - 1
				if cfg.Total > 0 && seq >= cfg.Total {
					return
				}
				if pace != nil && !sleepUntil(ctx, start.Add(pace(seq))) {
					return
				}
				if !runOp(ctx, cfg.OpTimeout, w, seq, op, win) {
					failed.Add(1)
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if !win.from.IsZero() {
		// The window's span, or as much of it as the load lasted (it
		// stops early once MaxErrors operations failed).
		elapsed = max(0, min(elapsed, win.to.Sub(start))-win.from.Sub(start))
	}
	stopProgress()
	s := collect(workers, elapsed)
	s.cpu, s.cpuErr = cpu.finish(ctx)
	return s
}

// cpuRecorder samples a probe at the start and end of a load's measured
// window: the whole load, or the --measure-last window (sampled by timers
// at its edges, or at the load's end if it ended early).
type cpuRecorder struct {
	probe        *cpuProbe
	mu           sync.Mutex
	w            cpuWindow
	err          error
	begin, end   *time.Timer
	began, ended bool
}

func startCPU(ctx context.Context, probe *cpuProbe, win window) *cpuRecorder {
	r := &cpuRecorder{probe: probe}
	if probe == nil {
		return r
	}
	if win.from.IsZero() {
		r.sampleBegin(ctx)
		return r
	}
	r.begin = time.AfterFunc(time.Until(win.from), func() { r.sampleBegin(ctx) })
	r.end = time.AfterFunc(time.Until(win.to), func() { r.sampleEnd(ctx) })
	return r
}

func (r *cpuRecorder) sampleBegin(ctx context.Context) {
	v, err := r.probe.sample(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.w.before, r.w.from, r.began = v, time.Now(), true
	if err != nil && r.err == nil {
		r.err = err
	}
}

func (r *cpuRecorder) sampleEnd(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return
	}
	v, err := r.probe.sample(ctx)
	r.w.after, r.w.to, r.ended = v, time.Now(), true
	if err != nil && r.err == nil {
		r.err = err
	}
}

// finish returns the window's samples once both are taken (sampling the
// end now if the load ended before its timer).
func (r *cpuRecorder) finish(ctx context.Context) (*cpuWindow, error) {
	if r.probe == nil {
		return nil, nil
	}
	if r.begin != nil && r.begin.Stop() {
		return nil, fmt.Errorf("--cpu: the load ended before its measured window began")
	}
	if r.end != nil {
		r.end.Stop()
	}
	r.sampleEnd(ctx) // no-op if the timer took it
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return nil, r.err
	}
	if !r.began {
		return nil, fmt.Errorf("--cpu: the window's first sample is missing")
	}
	w := r.w
	return &w, nil
}

// markWindow creates path, saying that the measured window begins now (a
// script brackets its own measurements of the system with it); a failure
// is reported on progress, or stderr.
func markWindow(path string, progress io.Writer, name string) {
	f, err := os.Create(path)
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		if progress == nil {
			progress = os.Stderr
		}
		fmt.Fprintf(progress, "[%s] --window-file: %v\n", name, err)
	}
}

// sleepUntil waits until t; it returns false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// runOp runs one operation under its own deadline and records the result
// if it ended in win; it reports whether the operation succeeded.
func runOp(ctx context.Context, timeout time.Duration, w *worker, seq int64, op opFunc, win window) bool {
	opCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.Now()
	err := op(opCtx, w, seq)
	end := time.Now()
	lat := end.Sub(t)
	if err != nil {
		if w.firstErr == nil {
			w.firstErr = fmt.Errorf("op %d: %w", seq, err)
		}
		if w.kinds == nil {
			w.kinds = make(map[string]int64)
		}
		w.kinds[err.Error()]++
	}
	if !win.contains(end) {
		if err != nil {
			w.unmeasuredErrors++
			return false
		}
		w.unmeasured++
		return true
	}
	if err != nil {
		w.errors++
		return false
	}
	w.hist.Record(lat)
	return true
}

// collect merges the workers' measurements.
func collect(workers []*worker, elapsed time.Duration) loadStats {
	s := loadStats{elapsed: elapsed}
	for _, w := range workers {
		s.hist.Merge(&w.hist)
		s.errors += w.errors
		s.conflicts += w.conflicts
		s.unmeasured += w.unmeasured
		s.unmeasuredErrors += w.unmeasuredErrors
		if s.firstErr == nil {
			s.firstErr = w.firstErr
		}
		for k, n := range w.kinds {
			if s.kinds == nil {
				s.kinds = make(map[string]int64)
			}
			s.kinds[k] += n
		}
	}
	s.ops = int64(s.hist.Count())
	return s
}

// startProgress prints a line to out every second with the count done so
// far and its rate over the last second, in unit, until the returned function is
// called. A nil out disables it.
func startProgress(out io.Writer, name, unit string, total int64, done *atomic.Int64) (stop func()) {
	if out == nil {
		return func() {}
	}
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		start := time.Now()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		var last int64
		lastT := start
		for {
			select {
			case <-quit:
				return
			case now := <-tick.C:
				n := done.Load()
				rate := float64(n-last) / now.Sub(lastT).Seconds()
				fmt.Fprintf(out, "[%s] %5.1fs  done %s  %.0f %s\n", name, now.Sub(start).Seconds(), progressCount(n, total), rate, unit)
				last, lastT = n, now
			}
		}
	}()
	return func() {
		close(quit)
		<-finished
	}
}

func progressCount(n, total int64) string {
	if total > 0 {
		return fmt.Sprintf("%d/%d", n, total)
	}
	return fmt.Sprint(n)
}
