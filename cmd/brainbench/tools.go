package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// compareCmd prints the ratio table of two --json result files.
func compareCmd() *cobra.Command {
	var names []string
	cmd := &cobra.Command{
		Use:   "compare A.jsonl B.jsonl",
		Short: "compare two JSON result files: throughput and p99 ratios A/B per benchmark",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(names) != 2 {
				return fmt.Errorf("--names takes two names, got %d", len(names))
			}
			a, err := readResults(args[0])
			if err != nil {
				return err
			}
			b, err := readResults(args[1])
			if err != nil {
				return err
			}
			printComparison(os.Stdout, names[0], names[1], a, b)
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&names, "names", []string{"a", "b"}, "names of the two sides")
	return cmd
}

// freePortsCmd prints loopback ports that nobody listens on, for scripts.
func freePortsCmd() *cobra.Command {
	var n int
	cmd := &cobra.Command{
		Use:    "free-ports",
		Short:  "print free loopback TCP ports, one per line",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ports, err := freePorts(n)
			if err != nil {
				return err
			}
			for _, p := range ports {
				fmt.Println(p)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 1, "number of ports (each with port+1 free too)")
	return cmd
}

// freePorts returns n distinct free ports p whose p+1 is free too (a brain
// node gossips on its peer port + 1); it holds them all open while
// choosing so that they differ.
func freePorts(n int) ([]int, error) {
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100*n {
			return nil, errors.New("free-ports: no free port pairs")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		p := l.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		if err != nil {
			continue
		}
		defer l2.Close()
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p+1))
		if err != nil {
			continue
		}
		defer u.Close()
		ports = append(ports, p)
	}
	return ports, nil
}

// waitCmd waits until an endpoint serves reads, for scripts that start a
// server and then benchmark it.
func waitCmd() *cobra.Command {
	var endpoints []string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:    "wait",
		Short:  "wait until the endpoints answer a read",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return waitReady(cmd.Context(), endpoints, timeout)
		},
	}
	cmd.Flags().StringSliceVar(&endpoints, "endpoints", []string{"127.0.0.1:2379"}, "etcd endpoints, comma separated")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}

// waitReady retries a linearizable read until it succeeds or timeout.
func waitReady(ctx context.Context, endpoints []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: timeout, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Get(rctx, "health")
		rcancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v: %w", strings.Join(endpoints, ","), timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
