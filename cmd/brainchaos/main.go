package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/brainkv/brain/chaos"
	"github.com/spf13/cobra"
)

func main() {
	os.Exit(run())
}

func run() int {
	var (
		cfg       chaos.Config
		faults    string
		workloads string
		race      bool
		bug       string
		code      int
	)
	cmd := &cobra.Command{
		Use:   "brainchaos",
		Short: "Run faults against a local brain cluster and check the history",
		Long: `brainchaos starts a cluster of brainnode processes on loopback ports, runs
workloads from clients of every node while it injects faults, heals the
cluster, and checks the recorded history (linearizability, revisions,
watches, lists). It prints its seed, writes a report directory and exits 1
if it found a violation (2 if the run itself failed).`,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("seed") {
				cfg.Seed = time.Now().UnixNano() % 1_000_000
			}
			if cfg.Out == "" {
				cfg.Out = filepath.Join("chaos-report", fmt.Sprint(cfg.Seed))
			}
			cfg.Faults = split(faults)
			cfg.Workloads = split(workloads)
			cfg.Progress = os.Stderr
			if bug != "" {
				cfg.Env = append(cfg.Env, "BRAIN_INJECT_BUG="+bug)
			}
			if cfg.Bin == "" {
				bin, err := buildBrainnode(cfg.System, race, bug != "")
				if err != nil {
					return err
				}
				defer os.RemoveAll(filepath.Dir(bin))
				cfg.Bin = bin
			}
			fmt.Fprintf(os.Stderr, "brainchaos: seed %d, report in %s\n", cfg.Seed, cfg.Out)
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, err := chaos.Run(ctx, cfg)
			if err != nil {
				return err
			}
			fmt.Printf("what the faults cost the clients (%s/availability.txt):\n%s%s\n", cfg.Out, chaos.AvailabilitySummary(res.Costs), res.Staleness)
			fmt.Println(res.Summary())
			for _, v := range res.Violations {
				fmt.Println("VIOLATION:", v)
			}
			if len(res.Violations) > 0 {
				code = 1
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&cfg.Duration, "duration", 2*time.Minute, "how long faults are injected")
	f.Int64Var(&cfg.Seed, "seed", 0, "seed of the fault schedule and workloads (default: random, printed)")
	f.IntVar(&cfg.Nodes, "nodes", 3, "cluster size")
	f.IntVar(&cfg.Clients, "clients", 4, "clients per workload")
	f.StringVar(&faults, "faults", "", "faults to draw from (default: "+strings.Join(chaos.FaultNames, ",")+"; with --netns also "+strings.Join(chaos.NetFaultNames, ",")+"; only when named: "+strings.Join(chaos.PlacementFaultNames, ",")+")")
	f.BoolVar(&cfg.Netns, "netns", false, "run each node in a network namespace of its own (root; enables the network faults)")
	f.StringVar(&workloads, "workloads", strings.Join(chaos.WorkloadNames, ","), "workloads to mix")
	f.StringVar(&cfg.Out, "out", "", "report directory (default chaos-report/<seed>)")
	f.StringVar(&cfg.Bin, "brainnode", "", "brainnode binary, or etcdref's with --system etcd (default: build ./cmd/brainnode or ./cmd/etcdref)")
	f.StringVar(&cfg.System, "system", chaos.SystemBrain, "the system under test: brain, or etcd (etcd's own server, ./cmd/etcdref) on the same schedule to compare with; etcd runs the faults "+strings.Join(chaos.EtcdFaultNames, ",")+" (and the network faults)")
	f.BoolVar(&race, "race", false, "build brainnode with the race detector")
	f.StringVar(&bug, "inject-bug", "", "checker self-test: build brainnode with the chaosbugs tag and inject this known bug")
	if err := cmd.Execute(); err != nil {
		return 2
	}
	return code
}

func split(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// buildBrainnode builds ./cmd/brainnode of the module this runs in (for
// system etcd, ./cmd/etcdref).
func buildBrainnode(system string, race, bugs bool) (string, error) {
	dir, err := os.MkdirTemp("", "brainchaos")
	if err != nil {
		return "", err
	}
	pkg, modDir := "./cmd/brainnode", ""
	if system == chaos.SystemEtcd {
		// etcdref is a module of its own (it runs etcd 3.7; the main
		// module's tests compare with etcd 3.6's embed).
		pkg, modDir = ".", "cmd/etcdref"
	}
	bin := filepath.Join(dir, "brainnode")
	if modDir != "" {
		bin = filepath.Join(dir, "etcdref")
	}
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	if bugs {
		args = append(args, "-tags", "chaosbugs")
	}
	fmt.Fprintf(os.Stderr, "brainchaos: go %s %s\n", strings.Join(args, " "), pkg)
	c := exec.Command("go", append(args, pkg)...)
	if modDir != "" {
		c.Dir = modDir
		c.Env = append(os.Environ(), "GOWORK=off")
	}
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	if err := c.Run(); err != nil {
		return "", fmt.Errorf("building %s (run brainchaos from the repository root): %w", pkg, err)
	}
	return bin, nil
}
