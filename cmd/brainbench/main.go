package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := rootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "brainbench",
		Short: "brainbench drives Kubernetes-shaped load against an etcd v3 endpoint",
		Long: `brainbench drives Kubernetes-shaped load against any etcd v3 endpoint
(brain or etcd) and reports throughput and latency percentiles.

Each benchmark is bounded by --total operations and/or --duration. Progress
goes to stderr once a second; results go to stdout as a table, or as one
JSON object per benchmark with --json.`,
		SilenceUsage: true,
	}
	root.AddCommand(
		benchCmd("create", "kube create: txn put-if-absent of unique keys", defaultsKV, RunCreate, both(addWindowFlags, addCPUFlags)),
		benchCmd("update", "kube GuaranteedUpdate: get, then compare-mod-revision-and-put, on a pre-populated key space", defaultsKV, RunUpdate, both(addUpdateFlags, addWindowFlags, addCPUFlags)),
		benchCmd("put", "plain puts of random keys of the key space", defaultsKV, RunPut, both(addWindowFlags, addCPUFlags)),
		benchCmd("get", "linearizable gets of random keys of a pre-populated key space", defaultsKV, RunGet, both(addWindowFlags, addCPUFlags)),
		benchCmd("list", "kube paginated list of a pre-populated prefix (one op = one full list)", defaultsList, RunList, both(addListFlags, addWindowFlags, addCPUFlags)),
		benchCmd("watch", "watch fan-out: many prev_kv watches on a prefix under a steady write rate", defaultsWatch, RunWatch, addWatchFlags),
		allCmd(),
		compareCmd(),
		freePortsCmd(),
		waitCmd(),
		overloadCmd(),
		cpuTableCmd(),
		costTableCmd(),
	)
	return root
}

// defaults are the per-command defaults of the flags whose sensible value
// differs between benchmarks.
type defaults struct {
	total    int64
	duration time.Duration
	keys     int
}

var (
	defaultsKV    = defaults{total: 10000, keys: 10000}
	defaultsList  = defaults{total: 100, keys: 10000}
	defaultsWatch = defaults{duration: 10 * time.Second, keys: 1000}
)

// output holds the flags that select how results are printed.
type output struct {
	json    bool
	jsonOut string
	quiet   bool
}

// addCommonFlags registers the flags every benchmark takes.
func addCommonFlags(cmd *cobra.Command, cfg *Config, out *output, d defaults) {
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Endpoints, "endpoints", cfg.Endpoints, "etcd endpoints, comma separated")
	f.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent workers")
	f.IntVar(&cfg.Conns, "conns", cfg.Conns, "gRPC connections the workers are spread over")
	f.Int64Var(&cfg.Total, "total", d.total, "operations to run (0: run for --duration)")
	f.DurationVar(&cfg.Duration, "duration", d.duration, "time to run (0: run --total operations); with both, whichever ends first")
	f.IntVar(&cfg.ValueSize, "value-size", cfg.ValueSize, "value size in bytes")
	f.StringVar(&cfg.KeyPrefix, "key-prefix", cfg.KeyPrefix, "prefix of every key written")
	f.StringSliceVar(&cfg.Resources, "resources", nil, "spread the keys of create, update and put over /registry/<resource>/bench/ for these resources (e.g. configmaps,events,leases,pods), as kube writes many resources; list and watch keep --key-prefix")
	f.IntVar(&cfg.ResourceWatchers, "resource-watchers", 0, "while create, update and put run, keep this many watches open on each resource's prefix (/registry/<resource>/), each on one endpoint, spread over them, as kube-apiservers do (one per apiserver); reports the events they received")
	f.BoolVar(&cfg.HashedNames, "hashed-names", false, "name the keys of create, update and put by a scramble of their number, so writes land anywhere under the prefix (as generated object names do) rather than at its end")
	f.IntVar(&cfg.Keys, "keys", d.keys, "key space size")
	f.Int64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
	f.DurationVar(&cfg.OpTimeout, "op-timeout", cfg.OpTimeout, "deadline of one operation")
	f.Int64Var(&cfg.MaxErrors, "max-errors", cfg.MaxErrors, "stop issuing operations once more than this many have failed")
	f.BoolVar(&out.json, "json", false, "print results as JSON, one object per benchmark")
	f.StringVar(&out.jsonOut, "json-out", "", "also append JSON results to this file")
	f.BoolVar(&out.quiet, "quiet", false, "no progress lines on stderr")
}

func addUpdateFlags(cmd *cobra.Command, cfg *Config) {
	cmd.Flags().IntVar(&cfg.MaxRetries, "max-retries", cfg.MaxRetries, "conflict retries of one update before it counts as an error")
}

// addWindowFlags registers the flags of a steady-state measurement: a
// load run for --duration whose last --measure-last only is measured.
func addWindowFlags(cmd *cobra.Command, cfg *Config) {
	f := cmd.Flags()
	f.DurationVar(&cfg.MeasureLast, "measure-last", 0, "measure only the operations that end in the last this much of --duration (needs --total 0): the load before it is a ramp the store adapts to (splits, leader moves); 0: measure the whole run")
	f.StringVar(&cfg.WindowFile, "window-file", "", "with --measure-last: create this file when the measured window begins, for a script to sample the store's own counters at the same moment")
}

// both returns a flag registration that runs each of fs.
func both(fs ...func(*cobra.Command, *Config)) func(*cobra.Command, *Config) {
	return func(cmd *cobra.Command, cfg *Config) {
		for _, f := range fs {
			f(cmd, cfg)
		}
	}
}

// addCPUFlags registers the flags of a fixed-rate, CPU-per-operation
// measurement.
func addCPUFlags(cmd *cobra.Command, cfg *Config) {
	f := cmd.Flags()
	f.IntVar(&cfg.OpRate, "rate", 0, "operations per second offered, in total over the workers (0: each worker back to back); at a fixed rate CPU per operation is comparable between runs and systems")
	f.BoolVar(&cfg.CPU, "cpu", false, "read every node's process_cpu_seconds_total from /metrics at the start and end of the measured window and report CPU microseconds per operation per node, the cluster total and the busiest node")
	f.StringSliceVar(&cfg.MetricsURLs, "metrics-urls", nil, "with --cpu: the nodes' /metrics URLs (default: http://<endpoint>/metrics for each endpoint)")
	f.DurationVar(&cfg.CPUIdle, "cpu-idle", 0, "with --cpu: first measure each node's CPU for this long without load (reported as idle cores)")
}

func addListFlags(cmd *cobra.Command, cfg *Config) {
	cmd.Flags().IntVar(&cfg.PageSize, "page-size", cfg.PageSize, "keys per list page")
}

func addWatchFlags(cmd *cobra.Command, cfg *Config) {
	f := cmd.Flags()
	f.IntVar(&cfg.Watchers, "watchers", cfg.Watchers, "number of watches, each on its own gRPC stream")
	f.IntVar(&cfg.Rate, "rate", cfg.Rate, "writes per second")
	f.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "how long to wait for watch events after the last write")
}

// benchFunc runs one benchmark.
type benchFunc func(context.Context, Config) (Result, error)

// benchCmd builds the command of one benchmark.
func benchCmd(name, short string, d defaults, run benchFunc, extra func(*cobra.Command, *Config)) *cobra.Command {
	cfg := DefaultConfig()
	var out output
	cmd := &cobra.Command{
		Use:   name,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Progress = out.progress()
			r, err := run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return out.print([]Result{r})
		},
	}
	addCommonFlags(cmd, &cfg, &out, d)
	if extra != nil {
		extra(cmd, &cfg)
	}
	return cmd
}

// allCmd runs create, update, put and list against one endpoint.
func allCmd() *cobra.Command {
	cfg := DefaultConfig()
	var out output
	var listTotal int64
	cmd := &cobra.Command{
		Use:   "all",
		Short: "run create, update, put and list in sequence and print a summary table",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Progress = out.progress()
			rs, err := RunAll(cmd.Context(), cfg, listTotal)
			if len(rs) > 0 {
				if perr := out.print(rs); err == nil {
					err = perr
				}
			}
			return err
		},
	}
	addCommonFlags(cmd, &cfg, &out, defaultsKV)
	addUpdateFlags(cmd, &cfg)
	addListFlags(cmd, &cfg)
	cmd.Flags().Int64Var(&listTotal, "list-total", defaultsList.total, "full lists to run in the list phase (--total applies to the others)")
	return cmd
}

// RunAll runs create, update, put and list in sequence with cfg; the list
// phase runs listTotal lists. It stops at the first benchmark that cannot
// run, returning the results so far.
func RunAll(ctx context.Context, cfg Config, listTotal int64) ([]Result, error) {
	var rs []Result
	for _, b := range []struct {
		run   benchFunc
		total int64
	}{{RunCreate, cfg.Total}, {RunUpdate, cfg.Total}, {RunPut, cfg.Total}, {RunList, listTotal}} {
		c := cfg
		c.Total = b.total
		r, err := b.run(ctx, c)
		if err != nil {
			return rs, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

func (o *output) progress() io.Writer {
	if o.quiet {
		return nil
	}
	return os.Stderr
}

// print writes the results to stdout and the --json-out file, and returns
// an error if a benchmark failed.
func (o *output) print(rs []Result) error {
	if o.json {
		if err := printJSON(os.Stdout, rs); err != nil {
			return err
		}
	} else {
		printTable(os.Stdout, rs)
	}
	if o.jsonOut != "" {
		if err := appendJSON(o.jsonOut, rs); err != nil {
			return err
		}
	}
	var errs []error
	for _, r := range rs {
		if r.Failed() {
			errs = append(errs, fmt.Errorf("benchmark %s failed: %d errors%s", r.Name, r.Errors+r.UnmeasuredErrors, verdict(&r)))
		}
	}
	return errors.Join(errs...)
}

func verdict(r *Result) string {
	if r.Watch != nil && !r.Watch.Verified {
		return ", watch verification failed"
	}
	return ""
}

func appendJSON(path string, rs []Result) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if err := printJSON(f, rs); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
