package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/brainkv/brain/internal/history"
)

// FaultCost is what one fault cost the workload's clients, measured from
// the history: for writes and for reads, the longest time a client went
// from its first failed operation after the fault began to its next
// success (its unavailability: etcd's clients see the same through any
// endpoint), and how many operations failed, from the fault's start to the
// next fault's.
type FaultCost struct {
	Fault string
	Node  string  // "" for the whole cluster
	At    float64 // seconds on the history's clock
	Held  float64 // seconds until it was healed
	// WritesDown and ReadsDown are the longest unavailability of a
	// client; -1: a client never succeeded again in the run.
	WritesDown, ReadsDown     time.Duration
	WritesFailed, ReadsFailed int
	Writes, Reads             int // operations called in the window
	SlowestWrite, SlowestRead time.Duration
	// WritesBack and ReadsBack measure the cluster rather than a client:
	// for each partition (of the run's initial split points), when the
	// first successful operation called after the fault began returned,
	// after the fault began; the longest over the partitions (-1: none
	// succeeded before the next fault).
	WritesBack, ReadsBack       time.Duration
	unrecoveredW, unrecoveredRd bool
}

// partitionOf returns the index of the partition holding key, of the
// run's initial split points.
func partitionOf(key string) int {
	i := 0
	for i < len(splits) && key >= splits[i] {
		i++
	}
	return i
}

// backAfter measures WritesBack (read false) or ReadsBack: the longest,
// over the partitions that had operations of that kind called in [from,
// to), of the time from from to the return of the first of them that
// succeeded.
func backAfter(ops []history.Op, from, to int64, read bool) time.Duration {
	first := map[int]int64{} // partition -> return of its first success
	tried := map[int]bool{}
	for _, op := range ops {
		if op.Call < from || op.Call >= to || (op.In.Kind == history.Get) != read {
			continue
		}
		p := partitionOf(op.In.Key)
		tried[p] = true
		if op.Out.Unknown {
			continue
		}
		if r, ok := first[p]; !ok || op.Return < r {
			first[p] = op.Return
		}
	}
	longest := time.Duration(0)
	for p := range tried {
		r, ok := first[p]
		if !ok {
			return -1
		}
		longest = max(longest, time.Duration(r-from))
	}
	return longest
}

// faultCosts measures every fault of spans against ops (end: the
// history's last instant).
func faultCosts(ops []history.Op, spans []Span, end int64) []FaultCost {
	byClient := map[int][]history.Op{}
	for _, op := range ops {
		byClient[op.Client] = append(byClient[op.Client], op)
	}
	for _, cops := range byClient {
		slices.SortFunc(cops, func(a, b history.Op) int { return int(a.Call - b.Call) })
	}
	var out []FaultCost
	for i, sp := range spans {
		to := end
		if i+1 < len(spans) {
			to = spans[i+1].Start
		}
		fc := FaultCost{Fault: sp.Fault, Node: sp.Node, At: float64(sp.Start) / 1e9}
		if sp.End > 0 {
			fc.Held = float64(sp.End-sp.Start) / 1e9
		}
		for _, cops := range byClient {
			var firstFail [2]*history.Op // writes, reads
			for j := range cops {
				op := &cops[j]
				// A failed operation counts where it failed (an
				// operation under way when the next fault struck is
				// that fault's), a success where it was called.
				at := op.Call
				if op.Out.Unknown && op.Out.FailedAt > 0 {
					at = op.Out.FailedAt
				}
				if at < sp.Start || at >= to {
					continue
				}
				k := 0
				if op.In.Kind == history.Get {
					k = 1
					fc.Reads++
				} else {
					fc.Writes++
				}
				if !op.Out.Unknown {
					d := time.Duration(op.Return - op.Call)
					if k == 0 {
						fc.SlowestWrite = max(fc.SlowestWrite, d)
					} else {
						fc.SlowestRead = max(fc.SlowestRead, d)
					}
					continue
				}
				if k == 0 {
					fc.WritesFailed++
				} else {
					fc.ReadsFailed++
				}
				if firstFail[k] == nil {
					firstFail[k] = op
				}
			}
			for k, f := range firstFail {
				if f == nil {
					continue
				}
				down, ok := nextSuccess(cops, f, k == 1)
				switch {
				case !ok && k == 0:
					fc.unrecoveredW = true
				case !ok:
					fc.unrecoveredRd = true
				case k == 0:
					fc.WritesDown = max(fc.WritesDown, down)
				default:
					fc.ReadsDown = max(fc.ReadsDown, down)
				}
			}
		}
		fc.WritesBack = backAfter(ops, sp.Start, to, false)
		fc.ReadsBack = backAfter(ops, sp.Start, to, true)
		if fc.unrecoveredW {
			fc.WritesDown = -1
		}
		if fc.unrecoveredRd {
			fc.ReadsDown = -1
		}
		out = append(out, fc)
	}
	return out
}

// nextSuccess returns how long after failed's call the same client's next
// successful operation of the same kind (read or write) returned.
func nextSuccess(cops []history.Op, failed *history.Op, read bool) (time.Duration, bool) {
	for _, op := range cops {
		if op.Call <= failed.Call || op.Out.Unknown || (op.In.Kind == history.Get) != read {
			continue
		}
		return time.Duration(op.Return - failed.Call), true
	}
	return 0, false
}

// availabilityReport is the report's availability.txt: one line per fault.
func availabilityReport(system string, costs []FaultCost) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s, per fault. back: the longest, over the partitions, from the fault to the return of the first\n", system)
	fmt.Fprintf(&b, "# write (read) called after it that succeeded; down: the longest a client went from its first failed\n")
	fmt.Fprintf(&b, "# write (read) to its next success (2 s at least when a request timed out); failed/all until the next\n")
	fmt.Fprintf(&b, "# fault; the slowest success.\n")
	fmt.Fprintf(&b, "%8s %-18s %-4s %6s | %8s %8s %10s %9s | %8s %8s %10s %9s\n", "at_s", "fault", "node", "held_s",
		"w_back", "w_down", "w_failed", "w_slowest", "r_back", "r_down", "r_failed", "r_slowest")
	for _, c := range costs {
		fmt.Fprintf(&b, "%8.1f %-18s %-4s %6.1f | %8s %8s %10s %9s | %8s %8s %10s %9s\n", c.At, c.Fault, orDash(c.Node), c.Held,
			down(c.WritesBack), down(c.WritesDown), fmt.Sprintf("%d/%d", c.WritesFailed, c.Writes), c.SlowestWrite.Round(time.Millisecond),
			down(c.ReadsBack), down(c.ReadsDown), fmt.Sprintf("%d/%d", c.ReadsFailed, c.Reads), c.SlowestRead.Round(time.Millisecond))
	}
	return b.String()
}

// AvailabilitySummary gives, per kind of fault, the median and the worst
// of each measure.
func AvailabilitySummary(costs []FaultCost) string {
	kinds := map[string][]FaultCost{}
	var names []string
	for _, c := range costs {
		if _, ok := kinds[c.Fault]; !ok {
			names = append(names, c.Fault)
		}
		kinds[c.Fault] = append(kinds[c.Fault], c)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		var w, r, wb, rb []time.Duration
		failed := 0
		for _, c := range kinds[n] {
			w, r = append(w, c.WritesDown), append(r, c.ReadsDown)
			wb, rb = append(wb, c.WritesBack), append(rb, c.ReadsBack)
			failed += c.WritesFailed + c.ReadsFailed
		}
		fmt.Fprintf(&b, "%-18s x%-2d writes back median %s worst %s (a client down median %s worst %s), reads back median %s worst %s (down %s, %s), %d ops failed\n",
			n, len(kinds[n]), down(median(wb)), down(worst(wb)), down(median(w)), down(worst(w)),
			down(median(rb)), down(worst(rb)), down(median(r)), down(worst(r)), failed)
	}
	return b.String()
}

// median of ds, where -1 (never up again) counts as the longest.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.SortFunc(s, func(a, b time.Duration) int {
		if a < 0 || b < 0 {
			return int(b>>63) - int(a>>63) // a negative sorts last
		}
		return int(a - b)
	})
	return s[len(s)/2]
}

func worst(ds []time.Duration) time.Duration {
	w := time.Duration(0)
	for _, d := range ds {
		if d < 0 {
			return -1
		}
		w = max(w, d)
	}
	return w
}

func down(d time.Duration) string {
	switch {
	case d < 0:
		return "never-up"
	case d == 0:
		return "0"
	}
	return d.Round(10 * time.Millisecond).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
