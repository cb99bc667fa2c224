package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/brainkv/brain/migrate"
	"github.com/brainkv/brain/server"
	"github.com/spf13/cobra"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func migrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create a brain data directory from an etcd store (a snapshot file or a live member)",
		Long: `Create a brain data directory from an etcd store, keeping every key's
value, create and mod revisions, version and lease, etcd's history since its
last compaction, and its revision: the new store continues after etcd's last
revision, so watchers and Kubernetes resourceVersions carry over.

Stop the writers (kube-apiserver) first: writes made to etcd after the copy
are not carried over.`,
	}
	var rc server.RestoreConfig
	var peers, splits []string
	flags := func(c *cobra.Command) {
		f := c.Flags()
		f.StringVar(&rc.DataDir, "data-dir", "default.brain", "Data directory to create.")
		f.StringVar(&rc.Name, "name", "default", "Member name of the new node.")
		f.StringSliceVar(&peers, "initial-advertise-peer-urls", []string{"http://127.0.0.1:2380"}, "Peer URLs of the new node.")
		f.StringVar(&rc.InitialClusterToken, "initial-cluster-token", "etcd-cluster", "Cluster token of the new node.")
		f.StringSliceVar(&splits, "initial-split-points", server.DefaultSplitPoints, "Keys at which the keyspace is split into partitions.")
	}
	run := func(etcdFile string) error {
		rc.InitialAdvertisePeerURLs = peers
		if _, err := os.Stat(rc.DataDir); err == nil {
			return fmt.Errorf("data dir %s already exists", rc.DataDir)
		}
		tmp, err := os.CreateTemp(filepath.Dir(filepath.Clean(rc.DataDir)), ".brain-migrate-*.snap")
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name())
		bar := newProgress("reading etcd's keys")
		st, err := migrate.FromEtcdSnapshot(etcdFile, tmp, splits, func(done, total int64) { bar.set(done, total) })
		bar.done()
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		rc.SnapshotPath = tmp.Name()
		bar = newProgress("writing brain's store")
		rc.Progress = func(n int64) { bar.set(n, st.Versions) }
		if _, err := server.Restore(rc); err != nil {
			return err
		}
		bar.done()
		fmt.Fprintf(os.Stderr, "migrated %d keys (%d versions, %d leases) at revision %d (compacted at %d) into %s\n",
			st.Keys, st.Versions, st.Leases, st.Header.Revision, st.Header.CompactRevision, rc.DataDir)
		return nil
	}

	fromSnapshot := &cobra.Command{
		Use:   "from-snapshot FILE",
		Short: "Import an etcd snapshot file (etcdctl snapshot save) or a stopped member's member/snap/db",
		Args:  cobra.ExactArgs(1),
		RunE:  func(_ *cobra.Command, args []string) error { return run(args[0]) },
	}
	flags(fromSnapshot)

	var endpoints []string
	var endpoint, cacert, cert, key string
	var timeout, dialTimeout time.Duration
	fromEndpoint := &cobra.Command{
		Use:   "from-endpoint",
		Short: "Copy a live etcd member's data (its snapshot stream) and import it",
		Args:  cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			if endpoint != "" {
				endpoints = []string{endpoint}
			}
			file, err := fetchSnapshot(endpoints, cacert, cert, key, dialTimeout, timeout)
			if err != nil {
				return err
			}
			defer os.Remove(file)
			return run(file)
		},
	}
	flags(fromEndpoint)
	f := fromEndpoint.Flags()
	f.StringSliceVar(&endpoints, "endpoints", []string{"http://127.0.0.1:2379"}, "etcd members' client URLs; the first that answers is copied.")
	f.StringVar(&endpoint, "endpoint", "", "The etcd member to copy (one client URL); the same as --endpoints with one URL.")
	_ = f.MarkHidden("endpoint")
	f.StringVar(&cacert, "cacert", "", "CA bundle to verify the etcd member's certificate.")
	f.StringVar(&cert, "cert", "", "Client certificate for the etcd member.")
	f.StringVar(&key, "key", "", "Client key for the etcd member.")
	f.DurationVar(&dialTimeout, "dial-timeout", 5*time.Second, "Give up on a member that does not answer within this long.")
	f.DurationVar(&timeout, "timeout", 30*time.Minute, "Give up the copy after this long.")
	cmd.AddCommand(fromSnapshot, fromEndpoint)
	return cmd
}

// fetchSnapshot saves a live etcd member's snapshot stream to a temporary
// file and returns its path. The first of endpoints that answers a status
// request within dialTimeout is copied; timeout bounds the copy.
func fetchSnapshot(endpoints []string, cacert, cert, key string, dialTimeout, timeout time.Duration) (string, error) {
	if len(endpoints) == 0 {
		return "", fmt.Errorf("--endpoints: no etcd member given")
	}
	var tlsCfg *tls.Config
	if cacert != "" || cert != "" {
		var err error
		if tlsCfg, err = (transport.TLSInfo{TrustedCAFile: cacert, CertFile: cert, KeyFile: key}).ClientConfig(); err != nil {
			return "", err
		}
	}
	var errs []error
	for _, ep := range endpoints {
		fmt.Fprintf(os.Stderr, "contacting etcd at %s (--dial-timeout %v)\n", ep, dialTimeout)
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: dialTimeout, TLS: tlsCfg, Logger: zap.NewNop()})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		sctx, scancel := context.WithTimeout(context.Background(), dialTimeout)
		st, err := cli.Status(sctx, ep)
		scancel()
		if err != nil {
			cli.Close()
			if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded {
				err = fmt.Errorf("no answer within --dial-timeout %v (is etcd running there, and reachable?): %s", dialTimeout, status.Convert(err).Message())
			}
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		file, err := copySnapshot(cli, ep, st, timeout)
		cli.Close()
		return file, err
	}
	return "", fmt.Errorf("no etcd member answered: %w", errors.Join(errs...))
}

// copySnapshot streams the snapshot of the member at ep (whose status is
// st) into a temporary file.
func copySnapshot(cli *clientv3.Client, ep string, st *clientv3.StatusResponse, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		return "", fmt.Errorf("etcd at %s: %w", ep, err)
	}
	defer rc.Close()
	f, err := os.CreateTemp("", "etcd-*.db")
	if err != nil {
		return "", err
	}
	bar := newProgress(fmt.Sprintf("copying etcd %s at revision %d from %s", st.Version, st.Header.Revision, ep))
	_, err = io.Copy(f, &countingReader{r: rc, fn: func(n int64) { bar.set(n, st.DbSize) }})
	bar.done()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("copying etcd's snapshot: %w", err)
	}
	return f.Name(), nil
}

type countingReader struct {
	r  io.Reader
	n  int64
	fn func(int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.fn(c.n)
	return n, err
}
