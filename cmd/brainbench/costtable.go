package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/tabwriter"

	"github.com/google/pprof/profile"
	"github.com/spf13/cobra"
)

// costTableCmd turns CPU profiles taken under a fixed offered rate
// (bench/cpu.sh --profile) into CPU µs per operation by component.
func costTableCmd() *cobra.Command {
	var rate float64
	cmd := &cobra.Command{
		Use:   "cost-table PROFILE...",
		Short: "CPU µs per operation by component (client gRPC, forwarding, TSO, raft, WAL, apply, feeds, gRPC transport, GC, scheduler) from CPU profiles taken at --rate operations/s, one column per profile",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if rate <= 0 {
				return fmt.Errorf("--rate: want the operations/s the profiles were taken at")
			}
			var cols []costColumn
			for _, f := range args {
				c, err := readCostColumn(f, rate)
				if err != nil {
					return err
				}
				cols = append(cols, c)
			}
			printCostTable(cmd.OutOrStdout(), cols)
			return nil
		},
	}
	cmd.Flags().Float64Var(&rate, "rate", 0, "operations/s acknowledged while the profiles were taken (brainbench --rate)")
	return cmd
}

// costComponent is where a CPU sample is charged: the highest-ranked
// component any frame of its stack matches (components are listed in
// rank order), so that a TSO request made inside a client's write counts
// as TSO, and the client API gets only what no component below it took.
type costComponent struct {
	name string
	re   *regexp.Regexp
}

var costComponents = func() []costComponent {
	var cs []costComponent
	for _, c := range [][2]string{
		{"GC", `^runtime\.(gcBgMarkWorker|bgsweep|bgscavenge|gcAssistAlloc|gcStart|markroot)`},
		{"scheduler, netpoll (idle goroutines waking)", `^runtime\.(findRunnable|schedule|park_m|netpoll|sysmon|goexit0|mcall|wakep|startm|notewakeup|stopm)$`},
		{"WAL write + fsync", `pebble/v2/record\.\(\*LogWriter\)|brain/engine\.\(\*walFile\)|storage/wal\.|fileutil\.Fdatasync`},
		{"TSO", `brainkv/brain/tso\.`},
		{"forwarding (calls to other nodes)", `brain/kvapi\.\(\*(callMux|Client)\)|brain/kvapi\.\(\*sendQueue\)`},
		{"apply into the store", `brain/raftgroup\.\(\*Host\)\.applyEntries|etcdserver\.\(\*EtcdServer\)\.(apply|applyAll)|etcdserver/apply\.|storage/mvcc\.|go\.etcd\.io/bbolt`},
		{"raft messages out (encode, send)", `brain/raftgroup\.\(\*(peer|Transport)\)|brain/raftgroup\.\(\*Host\)\.sendMessages|rafthttp\.\(\*(streamWriter|pipeline|peer)\)|rafthttp\.\(\*messageEncoder`},
		{"raft messages in (decode, deliver)", `brain/raftgroup\.hostServer|brain/raftgroup\.\(\*Host\)\.Deliver|rafthttp\.\(\*(streamReader|messageDecoder|msgAppV2Decoder)\)|rafthttp\.\(\*(streamHandler|pipelineHandler)\)`},
		{"feeds and watches", `brain/kvapi\.\(\*(Store|feed\w*)\)\.\w*[Ff]eed|brain/etcdcompat\.\(\*watch|brain/etcdcompat\.watch|brain/watch|v3rpc\.\(\*(watchServer|serverWatchStream)\)|mvcc\.\(\*watchableStore\)`},
		{"partition (txn, latches, reads)", `brainkv/brain/partition\.`},
		{"internal calls served", `brain/kvapi\.\(\*internalServer\)|brain/kvapi\.\(\*Store\)\.HandleCall`},
		{"raft (step, ready, log batch)", `brain/raftgroup\.|etcdserver\.\(\*raftNode\)|go\.etcd\.io/raft/v3`},
		{"client API (etcd gRPC handlers)", `brain/etcdcompat\.|brain/kvapi\.|etcdserver/api/v3rpc\.|etcdserver\.\(\*EtcdServer\)`},
		{"gRPC send (HTTP/2 writer)", `grpc/internal/transport\.\(\*(loopyWriter|bufWriter|controlBuffer)\)`},
		{"gRPC receive and streams", `google\.golang\.org/grpc`},
		{"HTTP (metrics, peers' HTTP)", `^net/http\.`},
		{"Pebble background", `cockroachdb/pebble`},
	} {
		cs = append(cs, costComponent{c[0], regexp.MustCompile(c[1])})
	}
	return cs
}()

const costOther = "other"

// costColumn is one profile: µs per operation by component.
type costColumn struct {
	name  string
	us    map[string]float64
	total float64
}

func readCostColumn(path string, rate float64) (costColumn, error) {
	f, err := os.Open(path)
	if err != nil {
		return costColumn{}, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return costColumn{}, fmt.Errorf("%s: %w", path, err)
	}
	vi := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			vi = i
		}
	}
	if vi < 0 || p.DurationNanos <= 0 {
		return costColumn{}, fmt.Errorf("%s: not a CPU profile with a duration", path)
	}
	ops := rate * float64(p.DurationNanos) / 1e9
	col := costColumn{name: strings.TrimSuffix(filepath.Base(path), ".pprof"), us: map[string]float64{}}
	for _, s := range p.Sample {
		us := float64(s.Value[vi]) / 1e3 / ops
		col.us[chargeSample(s)] += us
		col.total += us
	}
	return col, nil
}

// chargeSample is the component a sample is charged to.
func chargeSample(s *profile.Sample) string {
	best := len(costComponents)
	for _, loc := range s.Location {
		for _, ln := range loc.Line {
			if ln.Function == nil {
				continue
			}
			for i := 0; i < best; i++ {
				if costComponents[i].re.MatchString(ln.Function.Name) {
					best = i
					break
				}
			}
		}
	}
	if best == len(costComponents) {
		return costOther
	}
	return costComponents[best].name
}

func printCostTable(w io.Writer, cols []costColumn) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "µs per op\t")
	for _, c := range cols {
		fmt.Fprintf(tw, "%s\t", c.name)
	}
	fmt.Fprintln(tw)
	names := make([]string, 0, len(costComponents)+1)
	for _, c := range costComponents {
		names = append(names, c.name)
	}
	for _, n := range append(names, costOther) {
		fmt.Fprintf(tw, "%s\t", n)
		for _, c := range cols {
			fmt.Fprintf(tw, "%.0f\t", c.us[n])
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprint(tw, "total\t")
	for _, c := range cols {
		fmt.Fprintf(tw, "%.0f\t", c.total)
	}
	fmt.Fprintln(tw)
	tw.Flush()
}
