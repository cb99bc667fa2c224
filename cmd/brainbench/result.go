package main

import (
	"time"
)

// Result is the outcome of one benchmark; it is what --json prints, one
// object per benchmark.
type Result struct {
	Name      string   `json:"name"`
	Endpoints []string `json:"endpoints"`
	Clients   int      `json:"clients"`
	Conns     int      `json:"conns"`
	ValueSize int      `json:"value_size"`

	// Ops counts successful operations (watch: events delivered, summed
	// over watchers); Errors counts failed ones.
	Ops    int64 `json:"ops"`
	Errors int64 `json:"errors"`
	// FirstError describes the first failure, if any (measured or not).
	FirstError string `json:"first_error,omitempty"`
	// ErrorKinds counts the failures (measured or not) by error message.
	ErrorKinds map[string]int64 `json:"error_kinds,omitempty"`
	// Seconds is the measured wall time; Throughput is Ops per second.
	Seconds    float64 `json:"seconds"`
	Throughput float64 `json:"throughput"`
	// Unit names what Throughput counts: "ops/s" or "events/s".
	Unit string `json:"unit"`
	// Latency percentiles in milliseconds: per operation, or for watch the
	// delivery lag (receive time minus the write time in the value).
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`

	// UnmeasuredOps and UnmeasuredErrors (--measure-last) are the
	// successful and failed operations that ended outside the measured
	// window: in the ramp before it, or draining after it.
	UnmeasuredOps    int64 `json:"unmeasured_ops,omitempty"`
	UnmeasuredErrors int64 `json:"unmeasured_errors,omitempty"`

	Conflicts   int64 `json:"conflicts,omitempty"`     // update: retried compares
	KeysPerList int64 `json:"keys_per_list,omitempty"` // list: keys in the last full list
	Pages       int64 `json:"pages_per_list,omitempty"`

	// OfferedRate is --rate (operations per second offered; 0: as fast
	// as the workers go); CPU is what the nodes spent (--cpu).
	OfferedRate int       `json:"offered_rate,omitempty"`
	CPU         *CPUStats `json:"cpu,omitempty"`

	Watch *WatchStats `json:"watch,omitempty"`
	// ResourceWatches: the watches kube-apiservers keep open while they
	// write (--resource-watchers).
	ResourceWatches *ResourceWatchStats `json:"resource_watches,omitempty"`
}

// ResourceWatchStats are what the resource watches received.
type ResourceWatchStats struct {
	Watches int `json:"watches"`
	// Events were delivered, summed over the watches; Want is one per
	// successful write and watch of its resource (failed writes may add
	// more).
	Events     int64  `json:"events"`
	Want       int64  `json:"want"`
	FirstError string `json:"first_error,omitempty"`
}

// WatchStats are the watch benchmark's extra figures.
type WatchStats struct {
	Watchers    int     `json:"watchers"`
	Writes      int64   `json:"writes"`       // successful writes
	WriteErrors int64   `json:"write_errors"` // failed writes
	TargetRate  int     `json:"target_rate"`
	WriteRate   float64 `json:"write_rate"` // achieved writes/s
	WriteP99    float64 `json:"write_p99_ms"`
	// Verified is true when every watcher saw every successful write
	// exactly once, in revision order, with the right prev_kv.
	Verified     bool     `json:"verified"`
	BadWatchers  int      `json:"bad_watchers"`
	VerifyErrors []string `json:"verify_errors,omitempty"`
}

// Failed reports whether the benchmark had errors or failed verification.
func (r *Result) Failed() bool {
	return r.Errors+r.UnmeasuredErrors > 0 || (r.Watch != nil && !r.Watch.Verified)
}

// newResult fills the common fields from cfg and a load's measurements.
func newResult(name string, cfg Config, s *loadStats) Result {
	r := Result{
		Name:      name,
		Endpoints: cfg.Endpoints,
		Clients:   cfg.Clients,
		Conns:     cfg.conns(),
		ValueSize: cfg.ValueSize,
		Ops:       s.ops,
		Errors:    s.errors,
		Conflicts: s.conflicts,

		UnmeasuredOps:    s.unmeasured,
		UnmeasuredErrors: s.unmeasuredErrors,
		Seconds:          s.elapsed.Seconds(),
		Unit:             "ops/s",
	}
	if s.firstErr != nil {
		r.FirstError = s.firstErr.Error()
	}
	r.ErrorKinds = s.kinds
	if r.Seconds > 0 {
		r.Throughput = float64(r.Ops) / r.Seconds
	}
	r.setLatency(&s.hist)
	return r
}

// setLatency copies the percentiles of h into r.
func (r *Result) setLatency(h *Histogram) {
	r.P50 = ms(h.Percentile(0.50))
	r.P90 = ms(h.Percentile(0.90))
	r.P99 = ms(h.Percentile(0.99))
	r.Max = ms(h.Max())
	r.Mean = ms(h.Mean())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
