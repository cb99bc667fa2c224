package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		os.Exit(1)
	}
}

// flags are etcdref's settings.
type flags struct {
	name         string
	dataDir      string
	clientURLs   []string
	peerURLs     []string
	advClient    []string
	advPeer      []string
	quotaBytes   int64
	readyTimeout time.Duration
	cluster      string
	pprof        bool
}

func rootCmd() *cobra.Command {
	var fl flags
	cmd := &cobra.Command{
		Use:          "etcdref",
		Short:        "etcdref runs a reference etcd member (embed, the version go.mod pins)",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := fl.config()
			if err != nil {
				return err
			}
			return serve(cfg, fl.readyTimeout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.name, "name", "default", "member name")
	f.StringVar(&fl.dataDir, "data-dir", "default.etcd", "path to the data directory")
	f.StringSliceVar(&fl.clientURLs, "listen-client-urls", []string{"http://127.0.0.1:2379"}, "URLs to serve clients on (also advertised)")
	f.StringSliceVar(&fl.peerURLs, "listen-peer-urls", []string{"http://127.0.0.1:2380"}, "URLs to serve peers on (also advertised)")
	f.StringSliceVar(&fl.advClient, "advertise-client-urls", nil, "client URLs to advertise (default: --listen-client-urls)")
	f.StringSliceVar(&fl.advPeer, "initial-advertise-peer-urls", nil, "peer URLs to advertise (default: --listen-peer-urls)")
	f.Int64Var(&fl.quotaBytes, "quota-backend-bytes", 0, "backend size that raises the NOSPACE alarm (0: etcd's default, 2 GiB)")
	f.DurationVar(&fl.readyTimeout, "ready-timeout", time.Minute, "give up if the server is not ready after this long")
	f.BoolVar(&fl.pprof, "enable-pprof", false, "serve runtime profiling data at /debug/pprof/ on the client URLs")
	f.StringVar(&fl.cluster, "initial-cluster", "", "name=peerURL,... of a new cluster's members (default: this member alone)")
	return cmd
}

// config turns the flags into an embed configuration.
func (fl *flags) config() (*embed.Config, error) {
	clientURLs, err := parseURLs(fl.clientURLs)
	if err != nil {
		return nil, fmt.Errorf("--listen-client-urls: %w", err)
	}
	peerURLs, err := parseURLs(fl.peerURLs)
	if err != nil {
		return nil, fmt.Errorf("--listen-peer-urls: %w", err)
	}
	advClient, advPeer := clientURLs, peerURLs
	if len(fl.advClient) > 0 {
		if advClient, err = parseURLs(fl.advClient); err != nil {
			return nil, fmt.Errorf("--advertise-client-urls: %w", err)
		}
	}
	if len(fl.advPeer) > 0 {
		if advPeer, err = parseURLs(fl.advPeer); err != nil {
			return nil, fmt.Errorf("--initial-advertise-peer-urls: %w", err)
		}
	}
	cfg := embed.NewConfig()
	cfg.Name = fl.name
	cfg.Dir = fl.dataDir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = clientURLs, advClient
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = peerURLs, advPeer
	cfg.InitialCluster = cfg.InitialClusterFromName(fl.name)
	if fl.cluster != "" {
		cfg.InitialCluster = fl.cluster
	}
	cfg.QuotaBackendBytes = fl.quotaBytes
	cfg.EnablePprof = fl.pprof
	cfg.LogLevel = "warn"
	return cfg, cfg.Validate()
}

func parseURLs(ss []string) ([]url.URL, error) {
	if len(ss) == 0 {
		return nil, errors.New("need at least one URL")
	}
	us := make([]url.URL, 0, len(ss))
	for _, s := range ss {
		u, err := url.Parse(s)
		if err != nil {
			return nil, err
		}
		us = append(us, *u)
	}
	return us, nil
}

// serve starts etcd and runs it until a signal or a fatal server error.
func serve(cfg *embed.Config, readyTimeout time.Duration) error {
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(readyTimeout):
		return fmt.Errorf("etcd not ready after %v", readyTimeout)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
		return nil
	case err := <-e.Err():
		return err
	}
}
