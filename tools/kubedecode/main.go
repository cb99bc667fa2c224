package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{Use: "kubedecode", Short: "Print kube-apiserver's stored objects as YAML or JSON", SilenceUsage: true}
	var endpoints []string
	var prefix, keysOnly bool
	var output string
	var rev int64
	var cacert, cert, key string
	get := &cobra.Command{
		Use:   "get KEY",
		Short: "Decode the value of KEY (with --prefix, of every key under it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
			if cacert != "" || cert != "" {
				tls, err := transport.TLSInfo{TrustedCAFile: cacert, CertFile: cert, KeyFile: key}.ClientConfig()
				if err != nil {
					return err
				}
				cfg.TLS = tls
			}
			cli, err := clientv3.New(cfg)
			if err != nil {
				return err
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			opts := []clientv3.OpOption{}
			if prefix {
				opts = append(opts, clientv3.WithPrefix())
			}
			if rev > 0 {
				opts = append(opts, clientv3.WithRev(rev))
			}
			resp, err := cli.Get(ctx, args[0], opts...)
			if err != nil {
				return err
			}
			if len(resp.Kvs) == 0 {
				return fmt.Errorf("%s: not found (revision %d)", args[0], resp.Header.Revision)
			}
			out := cmd.OutOrStdout()
			for i, kv := range resp.Kvs {
				if keysOnly {
					fmt.Fprintln(out, string(kv.Key))
					continue
				}
				d, err := decodeValue(kv.Value)
				if err != nil {
					return fmt.Errorf("%s: %w", kv.Key, err)
				}
				b, err := render(d, output)
				if err != nil {
					return err
				}
				if output == "yaml" {
					if i > 0 {
						fmt.Fprintln(out, "---")
					}
					fmt.Fprintf(out, "# %s (mod revision %d, %s)\n", kv.Key, kv.ModRevision, d.Encoding)
				}
				fmt.Fprintln(out, string(b))
			}
			return nil
		},
	}
	f := get.Flags()
	f.StringSliceVar(&endpoints, "endpoints", []string{"127.0.0.1:2379"}, "brain (or etcd) client endpoints")
	f.BoolVar(&prefix, "prefix", false, "decode every key with this prefix")
	f.BoolVar(&keysOnly, "keys-only", false, "print only the keys")
	f.StringVarP(&output, "output", "o", "yaml", "output format: yaml or json")
	f.Int64Var(&rev, "rev", 0, "read at this revision (0: the latest)")
	f.StringVar(&cacert, "cacert", "", "CA bundle verifying the servers' certificates (TLS)")
	f.StringVar(&cert, "cert", "", "client certificate (servers with --client-cert-auth)")
	f.StringVar(&key, "key", "", "client key")
	root.AddCommand(get)
	return root
}
