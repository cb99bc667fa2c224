package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// Config holds the parameters of a benchmark run. The zero value is not
// usable; start from DefaultConfig.
type Config struct {
	Endpoints []string      // etcd client endpoints, host:port or URLs
	Clients   int           // concurrent workers (writers for watch)
	Conns     int           // gRPC connections the workers are spread over
	Total     int64         // operations per benchmark; 0: bounded by Duration only
	Duration  time.Duration // run time per benchmark; 0: bounded by Total only
	// MeasureLast (--measure-last), with Duration and no Total: only the
	// operations that end in the last MeasureLast of Duration are
	// measured; the load before them is a ramp. WindowFile
	// (--window-file) is created when that window begins.
	MeasureLast time.Duration
	WindowFile  string
	ValueSize   int    // bytes per value
	KeyPrefix   string // every key the benchmark touches starts with this
	// Resources, if set, spread the keys of create, update and put over
	// /registry/<resource>/bench/ for these resources, key i under
	// resource i mod len, as a Kubernetes cluster writes many resources.
	Resources []string
	// HashedNames (--hashed-names): name write keys by a scramble of their
	// number followed by the group, so consecutive writes land anywhere
	// under the prefix (as generated pod names do), not at its end, and
	// every group's keys spread over the same range.
	HashedNames bool
	// ResourceWatchers (--resource-watchers): watches per resource of
	// Resources kept open while create, update and put run, as each
	// kube-apiserver keeps one per resource.
	ResourceWatchers int
	Keys             int           // key space size for update, put, list and watch
	Seed             int64         // seeds the per-worker random generators
	PageSize         int           // list: keys per page
	OpTimeout        time.Duration // deadline of one operation
	// MaxRetries bounds the conflict retries of one update (kube retries
	// forever; a bound keeps the benchmark finite).
	MaxRetries int
	// MaxErrors stops a load early once more operations than this have
	// failed, so that a dead endpoint does not cost Total timeouts.
	MaxErrors int64

	// OpRate (--rate of create, update, put, get and list) is the total
	// operations per second offered, spread over the workers; 0: each
	// worker runs its operations back to back.
	OpRate int
	// CPU (--cpu): read the nodes' process_cpu_seconds_total around the
	// measured window and report CPU per operation per node; MetricsURLs
	// (--metrics-urls) are the /metrics URLs to read (default: each
	// endpoint's); CPUIdle (--cpu-idle) first measures the nodes' CPU
	// without load for this long.
	CPU         bool
	MetricsURLs []string
	CPUIdle     time.Duration
	// cpu is the probe of the run's main load (set by runKV).
	cpu *cpuProbe

	Watchers     int           // watch: number of watch streams
	Rate         int           // watch: writes per second
	DrainTimeout time.Duration // watch: how long to wait for stragglers after the writes

	// Progress receives a status line every second while a benchmark runs;
	// nil disables progress reporting.
	Progress io.Writer
}

// DefaultConfig returns the defaults documented in the command help.
func DefaultConfig() Config {
	return Config{
		Endpoints:    []string{"127.0.0.1:2379"},
		Clients:      64,
		Conns:        16,
		Total:        10000,
		ValueSize:    1024,
		KeyPrefix:    "/registry/configmaps/bench/",
		Keys:         10000,
		Seed:         1,
		PageSize:     500,
		OpTimeout:    30 * time.Second,
		MaxRetries:   100,
		MaxErrors:    100,
		Watchers:     100,
		Rate:         1000,
		DrainTimeout: 30 * time.Second,
	}
}

// watchValueHeader is the size of the header of a watch benchmark value:
// write time in unix nanoseconds, then the write's sequence number, both
// big-endian uint64.
const watchValueHeader = 16

// validate reports the first unusable setting.
func (c *Config) validate() error {
	switch {
	case len(c.Endpoints) == 0:
		return errors.New("--endpoints: need at least one endpoint")
	case c.Clients < 1:
		return errors.New("--clients must be at least 1")
	case c.Conns < 1:
		return errors.New("--conns must be at least 1")
	case c.Total < 0 || c.Duration < 0:
		return errors.New("--total and --duration must not be negative")
	case c.Total == 0 && c.Duration == 0:
		return errors.New("set --total or --duration: every run must be bounded")
	case c.MeasureLast < 0:
		return errors.New("--measure-last must not be negative")
	case c.MeasureLast > 0 && (c.Total != 0 || c.MeasureLast >= c.Duration):
		return errors.New("--measure-last needs --total 0 and a longer --duration: it measures the end of a timed run")
	case c.WindowFile != "" && c.MeasureLast == 0:
		return errors.New("--window-file needs --measure-last")
	case c.ValueSize < watchValueHeader:
		return fmt.Errorf("--value-size must be at least %d bytes", watchValueHeader)
	case c.KeyPrefix == "":
		return errors.New("--key-prefix must not be empty")
	case c.Keys < 1:
		return errors.New("--keys must be at least 1")
	case c.PageSize < 1:
		return errors.New("--page-size must be at least 1")
	case c.OpTimeout <= 0:
		return errors.New("--op-timeout must be positive")
	case c.ResourceWatchers < 0:
		return errors.New("--resource-watchers must not be negative")
	case c.ResourceWatchers > 0 && len(c.Resources) == 0:
		return errors.New("--resource-watchers needs --resources")
	case c.OpRate < 0:
		return errors.New("--rate must not be negative")
	case c.CPUIdle < 0:
		return errors.New("--cpu-idle must not be negative")
	case !c.CPU && (c.CPUIdle > 0 || len(c.MetricsURLs) > 0):
		return errors.New("--cpu-idle and --metrics-urls need --cpu")
	}
	return nil
}

// conns is the number of connections actually opened: never more than
// there are workers.
func (c *Config) conns() int { return min(c.Conns, c.Clients) }

// keyName returns key i of a benchmark's key group: the groups keep the
// benchmarks of one run apart, so that a list does not see the keys a
// create wrote before it.
func keyName(prefix, group string, i int64) string {
	return prefix + group + "-" + zeroPad(i)
}

// writeKey returns key i of a write benchmark's group: under KeyPrefix, or
// spread over Resources.
func (c *Config) writeKey(group string, i int64) string {
	prefix := c.KeyPrefix
	if len(c.Resources) > 0 {
		prefix = "/registry/" + c.Resources[i%int64(len(c.Resources))] + "/bench/"
	}
	if c.HashedNames {
		// A bijection of i: names spread over the key space like
		// generated object names, not in creation order.
		// The scramble goes first, so the keys of every group (warm-up
		// puts, creates) spread over the same range.
		return prefix + fmt.Sprintf("%016x", uint64(i)*0x9E3779B97F4A7C15) + "-" + group
	}
	return keyName(prefix, group, i)
}

// groupPrefix is the prefix shared by all keys of a group.
func groupPrefix(prefix, group string) string { return prefix + group + "-" }

// zeroPad formats i with at least 8 digits, so that keys sort numerically.
func zeroPad(i int64) string {
	s := strconv.FormatInt(i, 10)
	if len(s) >= 8 {
		return s
	}
	return "00000000"[len(s):] + s
}

// runID returns a token unique to this run, used in key groups that must
// not collide with earlier runs against the same store.
func runID() string {
	return strconv.FormatInt(time.Now().UnixNano(), 36)
}
