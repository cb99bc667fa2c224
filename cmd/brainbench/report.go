package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"text/tabwriter"
)

// printTable writes results as an aligned table, then the details that
// do not fit in it: failures, conflicts, list sizes and watch verdicts.
func printTable(out io.Writer, results []Result) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "benchmark\tops\terrors\tseconds\tthroughput\tunit\tp50 ms\tp90 ms\tp99 ms\tmax ms\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.1f\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t\n",
			r.Name, r.Ops, r.Errors, r.Seconds, r.Throughput, r.Unit, r.P50, r.P90, r.P99, r.Max)
	}
	tw.Flush()
	for _, r := range results {
		printDetails(out, &r)
	}
}

// printDetails writes the per-benchmark notes below the table.
func printDetails(out io.Writer, r *Result) {
	if r.FirstError != "" {
		fmt.Fprintf(out, "%s: %d errors, first: %s\n", r.Name, r.Errors+r.UnmeasuredErrors, r.FirstError)
	}
	// The kinds of failure, most frequent first (the first error alone
	// hid which one most creates of a benchmark round failed with).
	kinds := make([]string, 0, len(r.ErrorKinds))
	for k := range r.ErrorKinds {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		a, b := r.ErrorKinds[kinds[i]], r.ErrorKinds[kinds[j]]
		return a > b || a == b && kinds[i] < kinds[j]
	})
	for _, k := range kinds {
		fmt.Fprintf(out, "%s: %d failed with: %s\n", r.Name, r.ErrorKinds[k], k)
	}
	if r.UnmeasuredOps+r.UnmeasuredErrors > 0 {
		fmt.Fprintf(out, "%s: measured the last %.2f s; %d operations (%d failed) ended outside it\n", r.Name, r.Seconds, r.UnmeasuredOps+r.UnmeasuredErrors, r.UnmeasuredErrors)
	}
	if c := r.CPU; c != nil {
		rate := "back to back"
		if r.OfferedRate > 0 {
			rate = fmt.Sprintf("offered %d/s", r.OfferedRate)
		}
		fmt.Fprintf(out, "%s: CPU per op (%s, %.0f/s acknowledged): cluster %.0f µs, busiest node %.0f µs (%s)\n",
			r.Name, rate, r.Throughput, c.TotalUsPerOp, c.BusiestUsPerOp, c.Busiest)
		for _, n := range busiestFirst(c.Nodes) {
			idle := ""
			if c.IdleSeconds > 0 {
				idle = fmt.Sprintf(", idle %.3f cores", n.IdleCores)
			}
			fmt.Fprintf(out, "%s:   %s: %.0f µs/op, %.3f cores%s\n", r.Name, n.Metrics, n.UsPerOp, n.Cores, idle)
		}
	}
	if r.Conflicts > 0 {
		fmt.Fprintf(out, "%s: %d conflicts retried\n", r.Name, r.Conflicts)
	}
	if r.KeysPerList > 0 {
		fmt.Fprintf(out, "%s: %d keys in %d pages per list (%.0f keys/s)\n", r.Name, r.KeysPerList, r.Pages, r.Throughput*float64(r.KeysPerList))
	}
	if w := r.ResourceWatches; w != nil {
		fmt.Fprintf(out, "%s: %d resource watches received %d events (%d expected)\n", r.Name, w.Watches, w.Events, w.Want)
		if w.FirstError != "" {
			fmt.Fprintf(out, "%s: resource watch failed: %s\n", r.Name, w.FirstError)
		}
	}
	if w := r.Watch; w != nil {
		fmt.Fprintf(out, "%s: %d watchers, %d writes (%d failed) at %.0f/s (target %d/s), write p99 %.2f ms\n",
			r.Name, w.Watchers, w.Writes, w.WriteErrors, w.WriteRate, w.TargetRate, w.WriteP99)
		if w.Verified {
			fmt.Fprintf(out, "%s: verified: every watcher got every write exactly once, in revision order, with correct prev_kv\n", r.Name)
		} else {
			fmt.Fprintf(out, "%s: VERIFICATION FAILED for %d of %d watchers:\n", r.Name, w.BadWatchers, w.Watchers)
			for _, e := range w.VerifyErrors {
				fmt.Fprintf(out, "  %s\n", e)
			}
		}
	}
}

// printJSON writes one JSON object per result, one per line.
func printJSON(out io.Writer, results []Result) error {
	enc := json.NewEncoder(out)
	for _, r := range results {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// readResults reads a file of JSON results, one object per line.
func readResults(path string) ([]Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rs []Result
	dec := json.NewDecoder(bufio.NewReader(f))
	for dec.More() {
		var r Result
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// printComparison writes, for each benchmark in a, its figures next to
// b's and the a/b ratios of throughput and p99 latency. A throughput
// ratio above 1 and a p99 ratio below 1 favour a.
func printComparison(out io.Writer, nameA, nameB string, a, b []Result) {
	byName := make(map[string]*Result, len(b))
	for i := range b {
		byName[b[i].Name] = &b[i]
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "benchmark\tunit\t%[1]s thru\t%[2]s thru\tthru %[1]s/%[2]s\t%[1]s p99 ms\t%[2]s p99 ms\tp99 %[1]s/%[2]s\t%[1]s err\t%[2]s err\tnotes\t\n", nameA, nameB)
	for _, ra := range a {
		rb, ok := byName[ra.Name]
		if !ok {
			fmt.Fprintf(tw, "%s\t%s\t%.1f\t-\t-\t%.2f\t-\t-\t%d\t-\tmissing for %s\t\n", ra.Name, ra.Unit, ra.Throughput, ra.P99, ra.Errors, nameB)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%s\t%.2f\t%.2f\t%s\t%d\t%d\t%s\t\n",
			ra.Name, ra.Unit, ra.Throughput, rb.Throughput, ratio(ra.Throughput, rb.Throughput),
			ra.P99, rb.P99, ratio(ra.P99, rb.P99), ra.Errors, rb.Errors, notes(nameA, nameB, &ra, rb))
	}
	tw.Flush()
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// notes flags failed verifications.
func notes(nameA, nameB string, a, b *Result) string {
	s := ""
	for _, x := range []struct {
		name string
		r    *Result
	}{{nameA, a}, {nameB, b}} {
		if x.r.Watch != nil && !x.r.Watch.Verified {
			s += x.name + " watch verification FAILED; "
		}
	}
	if s == "" {
		return "ok"
	}
	return s[:len(s)-2]
}
