package main

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// cpuTableCmd summarises bench/cpu.sh's rounds.
func cpuTableCmd() *cobra.Command {
	var etcdVersion string
	cmd := &cobra.Command{
		Use:   "cpu-table FILE...",
		Short: "summarise --cpu results of brain and etcd (files named brain-N.jsonl and etcd-N.jsonl, N nodes, one result per benchmark and round): medians and brain/etcd ratios",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rows, err := cpuRows(args)
			if err != nil {
				return err
			}
			printCPUTable(cmd.OutOrStdout(), rows, etcdVersion)
			return nil
		},
	}
	cmd.Flags().StringVar(&etcdVersion, "etcd-version", "", "the etcd version the etcd side ran, for the table's heading")
	return cmd
}

// cpuRow is one benchmark at one cluster size: every round of each system.
type cpuRow struct {
	nodes int
	name  string
	rate  int
	runs  map[string][]Result // system -> rounds
}

// cpuRows reads the files into rows, ordered by size and benchmark.
func cpuRows(files []string) ([]*cpuRow, error) {
	byKey := map[string]*cpuRow{}
	var rows []*cpuRow
	for _, f := range files {
		base := strings.TrimSuffix(filepath.Base(f), ".jsonl")
		system, n, ok := strings.Cut(base, "-")
		nodes, err := strconv.Atoi(n)
		if !ok || err != nil || (system != "brain" && system != "etcd") {
			return nil, fmt.Errorf("%s: want a file named brain-N.jsonl or etcd-N.jsonl", f)
		}
		rs, err := readResults(f)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			if r.CPU == nil {
				return nil, fmt.Errorf("%s: %s has no CPU figures (run with --cpu)", f, r.Name)
			}
			key := fmt.Sprintf("%d/%s", nodes, r.Name)
			row := byKey[key]
			if row == nil {
				row = &cpuRow{nodes: nodes, name: r.Name, rate: r.OfferedRate, runs: map[string][]Result{}}
				byKey[key] = row
				rows = append(rows, row)
			}
			row.runs[system] = append(row.runs[system], r)
		}
	}
	order := map[string]int{"create": 0, "update": 1, "put": 2, "get": 3, "list": 4}
	slices.SortStableFunc(rows, func(a, b *cpuRow) int {
		if a.nodes != b.nodes {
			return a.nodes - b.nodes
		}
		return order[a.name] - order[b.name]
	})
	return rows, nil
}

// median of the values f takes over rs (0 for none).
func median(rs []Result, f func(Result) float64) float64 {
	if len(rs) == 0 {
		return 0
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func printCPUTable(out io.Writer, rows []*cpuRow, etcdVersion string) {
	etcd := "etcd"
	if etcdVersion != "" {
		etcd += " " + etcdVersion
	}
	fmt.Fprintf(out, "CPU per acknowledged operation, medians of the rounds (brain vs %s); capacity with equal cores per node follows the busiest node: projected = %s busiest / brain busiest; net: less the node's idle CPU over the window\n\n", etcd, etcd)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\top\toffered/s\trounds\tbrain ack/s\tetcd ack/s\tbrain busiest µs\tetcd busiest µs\tbrain/etcd\tprojected capacity\tbrain net µs\tetcd net µs\tbrain total µs\tetcd total µs\tbrain p99 ms\tetcd p99 ms\t")
	for _, r := range rows {
		b, e := r.runs["brain"], r.runs["etcd"]
		bb := median(b, func(x Result) float64 { return x.CPU.BusiestUsPerOp })
		eb := median(e, func(x Result) float64 { return x.CPU.BusiestUsPerOp })
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d/%d\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t\n",
			r.nodes, r.name, r.rate, len(b), len(e),
			median(b, func(x Result) float64 { return x.Throughput }), median(e, func(x Result) float64 { return x.Throughput }),
			bb, eb, ratio(bb, eb), ratio(eb, bb),
			median(b, func(x Result) float64 { return x.CPU.BusiestNetUsPerOp }), median(e, func(x Result) float64 { return x.CPU.BusiestNetUsPerOp }),
			median(b, func(x Result) float64 { return x.CPU.TotalUsPerOp }), median(e, func(x Result) float64 { return x.CPU.TotalUsPerOp }),
			median(b, func(x Result) float64 { return x.P99 }), median(e, func(x Result) float64 { return x.P99 }))
	}
	tw.Flush()
	// Each node's share, so that a hot node shows.
	fmt.Fprintln(out, "\nper node, µs per op (median of the rounds, nodes in endpoint order; idle: cores used without load)")
	for _, r := range rows {
		for _, sys := range []string{"brain", "etcd"} {
			rs := r.runs[sys]
			if len(rs) == 0 {
				continue
			}
			var parts []string
			for i := range rs[0].CPU.Nodes {
				us := median(rs, func(x Result) float64 { return x.CPU.Nodes[min(i, len(x.CPU.Nodes)-1)].UsPerOp })
				idle := median(rs, func(x Result) float64 { return x.CPU.Nodes[min(i, len(x.CPU.Nodes)-1)].IdleCores })
				parts = append(parts, fmt.Sprintf("%.0f (idle %.3f)", us, idle))
			}
			fmt.Fprintf(out, "%d %s %s: %s\n", r.nodes, r.name, sys, strings.Join(parts, ", "))
		}
	}
}
