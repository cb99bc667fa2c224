package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// overloadCmd measures how a store behaves when offered more writes than
// it can take: first its maximum (closed loop), then an open-loop offer of
// --factor times that, while a probe checks that the node still answers
// reads and Status promptly.
func overloadCmd() *cobra.Command {
	cfg := Config{Endpoints: []string{"127.0.0.1:2379"}, Clients: 64, Conns: 8, ValueSize: 256, KeyPrefix: "/brainbench/overload/", Keys: 10000, OpTimeout: 5 * time.Second}
	var phase time.Duration
	var factor float64
	var maxOutstanding int64
	cmd := &cobra.Command{
		Use:   "overload",
		Short: "offer --factor times the measured maximum write rate and probe the node's responsiveness",
		Long: `overload measures a store's maximum put rate with --clients closed-loop
writers for --phase, then offers --factor times that rate open loop for
--phase (each write its own request, at most --max-outstanding at once).
Meanwhile a probe reads a key and asks Status every 100 ms. It reports the
writes acknowledged, refused with "too many requests" (load shedding), and
failed otherwise, and the probe's latency: a node that stays responsive
answers the probe fast throughout.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runOverload(cmd.Context(), cfg, phase, factor, maxOutstanding, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Endpoints, "endpoints", cfg.Endpoints, "etcd endpoints, comma separated")
	f.IntVar(&cfg.Clients, "clients", cfg.Clients, "closed-loop writers measuring the maximum")
	f.IntVar(&cfg.Conns, "conns", cfg.Conns, "gRPC connections")
	f.IntVar(&cfg.ValueSize, "value-size", cfg.ValueSize, "value size in bytes")
	f.DurationVar(&phase, "phase", 20*time.Second, "length of each phase")
	f.Float64Var(&factor, "factor", 2, "offered rate as a multiple of the measured maximum")
	f.Int64Var(&maxOutstanding, "max-outstanding", 5000, "bound on writes in flight in the open-loop phase (a write that would exceed it is counted as not sent)")
	return cmd
}

type overloadResult struct {
	acked, shed, failed, notSent atomic.Int64
	firstErr                     atomic.Value
}

func runOverload(ctx context.Context, cfg Config, phase time.Duration, factor float64, maxOutstanding int64, out, progress io.Writer) error {
	p, err := dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.close()
	value := string(filler(rand.New(rand.NewPCG(1, 2)), cfg.ValueSize))
	key := func(i int64) string { return fmt.Sprintf("%s%08d", cfg.KeyPrefix, i%int64(cfg.Keys)) }

	// Phase 1: the maximum, closed loop.
	var seq atomic.Int64
	var max1 overloadResult
	pctx, cancel := context.WithTimeout(ctx, phase)
	var wg sync.WaitGroup
	for w := 0; w < cfg.Clients; w++ {
		wg.Add(1)
		go func(c *clientv3.Client) {
			defer wg.Done()
			for pctx.Err() == nil {
				octx, ocancel := context.WithTimeout(pctx, cfg.OpTimeout)
				_, err := c.Put(octx, key(seq.Add(1)), value)
				ocancel()
				max1.count(err, pctx)
			}
		}(p.client(w))
	}
	start := time.Now()
	stopProgress := reportEvery(progress, "measuring the maximum", start, &max1)
	wg.Wait()
	cancel()
	stopProgress()
	maxRate := float64(max1.acked.Load()) / time.Since(start).Seconds()
	if maxRate < 1 {
		return fmt.Errorf("measuring the maximum: no write acknowledged (%d failed, first: %v)", max1.failed.Load(), max1.firstErr.Load())
	}

	// Phase 2: factor x maximum, open loop, with the probe.
	offered := maxRate * factor
	var over overloadResult
	var probe Histogram
	var probeFails atomic.Int64
	pctx, cancel = context.WithTimeout(ctx, phase)
	defer cancel()
	// The probe has a connection of its own, as a health checker would.
	pc, err := dial(ctx, Config{Endpoints: cfg.Endpoints, Conns: 1, Clients: 1})
	if err != nil {
		return err
	}
	defer pc.close()
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		c := pc.client(0)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
			octx, ocancel := context.WithTimeout(ctx, 2*time.Second)
			t0 := time.Now()
			_, err := c.Get(octx, key(0))
			if err == nil {
				_, err = c.Status(octx, c.Endpoints()[0])
			}
			ocancel()
			if err != nil {
				probeFails.Add(1)
				continue
			}
			probe.Record(time.Since(t0))
		}
	}()
	var outstanding atomic.Int64
	var sent int64
	start = time.Now()
	stopProgress = reportEvery(progress, fmt.Sprintf("offering %.0f writes/s", offered), start, &over)
	tick := time.NewTicker(5 * time.Millisecond)
	for pctx.Err() == nil {
		<-tick.C
		due := int64(offered * time.Since(start).Seconds())
		for ; sent < due; sent++ {
			if outstanding.Load() >= maxOutstanding {
				over.notSent.Add(1)
				continue
			}
			outstanding.Add(1)
			wg.Add(1)
			go func(c *clientv3.Client, i int64) {
				defer wg.Done()
				defer outstanding.Add(-1)
				octx, ocancel := context.WithTimeout(ctx, cfg.OpTimeout)
				_, err := c.Put(octx, key(i), value)
				ocancel()
				over.count(err, ctx)
			}(p.client(int(sent)), seq.Add(1))
		}
	}
	tick.Stop()
	elapsed := time.Since(start)
	wg.Wait()
	<-probeDone
	stopProgress()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	_, statusErr := p.client(0).Status(sctx, p.client(0).Endpoints()[0])
	scancel()

	alive := "yes"
	if statusErr != nil {
		alive = "NO: " + statusErr.Error()
	}
	fmt.Fprintf(out, "maximum (closed loop, %d clients, %v): %.0f writes/s\n", cfg.Clients, phase, maxRate)
	fmt.Fprintf(out, "offered (open loop, %.1fx, %v):      %.0f writes/s, %d writes\n", factor, phase, offered, sent)
	fmt.Fprintf(out, "  acknowledged:                      %d (%.0f/s)\n", over.acked.Load(), float64(over.acked.Load())/elapsed.Seconds())
	fmt.Fprintf(out, "  refused, too many requests:        %d\n", over.shed.Load())
	fmt.Fprintf(out, "  failed otherwise (timeouts, ...):  %d", over.failed.Load())
	if e := over.firstErr.Load(); e != nil {
		fmt.Fprintf(out, " (first: %v)", e)
	}
	fmt.Fprintf(out, "\n  not sent (client bound reached):   %d\n", over.notSent.Load())
	fmt.Fprintf(out, "probe (Get + Status every 100 ms):   %d answered, %d failed; p50 %v p99 %v max %v\n",
		probe.Count(), probeFails.Load(), probe.Percentile(0.5).Round(time.Microsecond), probe.Percentile(0.99).Round(time.Microsecond), probe.Max().Round(time.Microsecond))
	fmt.Fprintf(out, "node answering Status afterwards:    %s\n", alive)
	return nil
}

// count classifies one write's outcome; errors after the phase ended
// (ctx done) are not the store's.
func (r *overloadResult) count(err error, phase context.Context) {
	switch {
	case err == nil:
		r.acked.Add(1)
	case errors.Is(err, rpctypes.ErrTooManyRequests):
		r.shed.Add(1)
	case phase.Err() != nil:
	default:
		r.failed.Add(1)
		r.firstErr.CompareAndSwap(nil, err.Error())
	}
}

// reportEvery prints r's counts once a second until the returned func is
// called.
func reportEvery(w io.Writer, what string, start time.Time, r *overloadResult) func() {
	if w == nil {
		w = os.Stderr
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(w, "%s: %4.0fs acked %d shed %d failed %d\n", what, time.Since(start).Seconds(), r.acked.Load(), r.shed.Load(), r.failed.Load())
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
