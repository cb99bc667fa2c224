package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// CPU per operation.
//
// Throughput on a small shared host moves by ±20% between runs; the CPU a
// store spends per operation at a fixed offered rate does not. With --cpu,
// brainbench reads every node's process_cpu_seconds_total (brain and etcd
// both export it on their client URLs' /metrics) when the measured window
// begins and when it ends, and divides each node's CPU by the operations
// acknowledged in the window. With --cpu-idle D it first measures each
// node's CPU over D without load (ticks, heartbeats, background work), so
// that a reader can tell the cost of the load from the cost of running.

// CPUStats is the CPU the nodes spent in a benchmark's measured window.
type CPUStats struct {
	Nodes []NodeCPU `json:"nodes"`
	// TotalUsPerOp is the cluster's CPU per acknowledged operation in
	// microseconds (every node's summed); BusiestUsPerOp is the largest
	// node's, which bounds capacity when every node has the same cores.
	TotalUsPerOp   float64 `json:"total_us_per_op"`
	BusiestUsPerOp float64 `json:"busiest_us_per_op"`
	Busiest        string  `json:"busiest"`
	// BusiestNetUsPerOp is the largest NetUsPerOp (with an idle window).
	BusiestNetUsPerOp float64 `json:"busiest_net_us_per_op,omitempty"`
	// IdleSeconds is the length of the idle window (0: not measured).
	IdleSeconds float64 `json:"idle_seconds,omitempty"`
}

// NodeCPU is one node's share.
type NodeCPU struct {
	Metrics string  `json:"metrics"` // the /metrics URL read
	Seconds float64 `json:"cpu_seconds"`
	UsPerOp float64 `json:"us_per_op"`
	// Cores is the CPU the node used per second of the window (1 = one
	// core busy); IdleCores the same without load.
	Cores     float64 `json:"cores"`
	IdleCores float64 `json:"idle_cores,omitempty"`
	// NetUsPerOp is UsPerOp less what the node spends idle over the same
	// time (0 without an idle window): the cost of the load itself.
	NetUsPerOp float64 `json:"net_us_per_op,omitempty"`
}

// cpuProbe reads the nodes' CPU counters.
type cpuProbe struct {
	urls   []string
	client *http.Client
}

// newCPUProbe returns a probe of cfg.MetricsURLs, or of /metrics on every
// endpoint when none are given.
func newCPUProbe(cfg Config) (*cpuProbe, error) {
	urls := cfg.MetricsURLs
	if len(urls) == 0 {
		for _, ep := range cfg.Endpoints {
			switch {
			case strings.HasPrefix(ep, "https://"):
				return nil, fmt.Errorf("--cpu: %s is https; give its metrics URL with --metrics-urls", ep)
			case strings.HasPrefix(ep, "http://"):
				urls = append(urls, strings.TrimSuffix(ep, "/")+"/metrics")
			default:
				urls = append(urls, "http://"+ep+"/metrics")
			}
		}
	}
	return &cpuProbe{urls: urls, client: &http.Client{Timeout: 5 * time.Second}}, nil
}

// sample reads every node's process_cpu_seconds_total, in parallel so
// that the readings are close in time.
func (p *cpuProbe) sample(ctx context.Context) ([]float64, error) {
	out := make([]float64, len(p.urls))
	errs := make([]error, len(p.urls))
	var wg sync.WaitGroup
	for i, u := range p.urls {
		wg.Go(func() { out[i], errs[i] = p.read(ctx, u) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (p *cpuProbe) read(ctx context.Context, url string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("--cpu: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("--cpu: %s: %s", url, resp.Status)
	}
	v, ok, err := parseCPUSeconds(bufio.NewScanner(resp.Body))
	if err != nil {
		return 0, fmt.Errorf("--cpu: %s: %w", url, err)
	}
	if !ok {
		return 0, fmt.Errorf("--cpu: %s has no process_cpu_seconds_total", url)
	}
	return v, nil
}

// parseCPUSeconds finds process_cpu_seconds_total in a Prometheus text
// exposition.
func parseCPUSeconds(sc *bufio.Scanner) (float64, bool, error) {
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, found := strings.CutPrefix(line, "process_cpu_seconds_total")
		if !found || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		if i := strings.IndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return 0, false, fmt.Errorf("malformed line %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("malformed line %q: %w", line, err)
		}
		return v, true, nil
	}
	return 0, false, sc.Err()
}

// cpuWindow is a pair of samples around a window.
type cpuWindow struct {
	before, after []float64
	from, to      time.Time
}

// stats turns the load window w (and the idle window, if measured) into
// CPUStats for ops acknowledged operations.
func (p *cpuProbe) stats(w, idle *cpuWindow, ops int64) *CPUStats {
	s := &CPUStats{}
	secs := w.to.Sub(w.from).Seconds()
	for i, u := range p.urls {
		n := NodeCPU{Metrics: u, Seconds: w.after[i] - w.before[i]}
		if ops > 0 {
			n.UsPerOp = n.Seconds * 1e6 / float64(ops)
		}
		if secs > 0 {
			n.Cores = n.Seconds / secs
		}
		if idle != nil {
			if d := idle.to.Sub(idle.from).Seconds(); d > 0 {
				n.IdleCores = (idle.after[i] - idle.before[i]) / d
				s.IdleSeconds = d
				if ops > 0 {
					n.NetUsPerOp = (n.Seconds - n.IdleCores*secs) * 1e6 / float64(ops)
				}
				s.BusiestNetUsPerOp = max(s.BusiestNetUsPerOp, n.NetUsPerOp)
			}
		}
		s.TotalUsPerOp += n.UsPerOp
		if n.UsPerOp >= s.BusiestUsPerOp {
			s.BusiestUsPerOp, s.Busiest = n.UsPerOp, u
		}
		s.Nodes = append(s.Nodes, n)
	}
	return s
}

// measureIdle samples the nodes over d with no load.
func (p *cpuProbe) measureIdle(ctx context.Context, d time.Duration) (*cpuWindow, error) {
	w := &cpuWindow{from: time.Now()}
	var err error
	if w.before, err = p.sample(ctx); err != nil {
		return nil, err
	}
	if !sleepUntil(ctx, w.from.Add(d)) {
		return nil, ctx.Err()
	}
	w.to = time.Now()
	if w.after, err = p.sample(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

// busiestFirst orders nodes by CPU per op, busiest first (for reports).
func busiestFirst(nodes []NodeCPU) []NodeCPU {
	out := slices.Clone(nodes)
	slices.SortStableFunc(out, func(a, b NodeCPU) int { return cmp.Compare(b.UsPerOp, a.UsPerOp) })
	return out
}
