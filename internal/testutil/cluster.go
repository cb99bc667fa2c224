package testutil

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/server"
)

// Cluster is an in-process brain cluster on loopback ports.
type Cluster struct {
	t       testing.TB
	Configs []server.Config
	Nodes   []*server.Server // nil for a stopped node
}

// StartCluster starts n nodes with the given base configuration (fields set
// in base are kept; names, ports and data directories are assigned).
func StartCluster(t testing.TB, n int, base server.Config) *Cluster {
	t.Helper()
	dir := t.TempDir()
	c := &Cluster{t: t}
	logs := FailureLogger(t)
	var initial []string
	for i := 0; i < n; i++ {
		cfg := base
		cfg.Name = fmt.Sprintf("n%d", i+1)
		cfg.DataDir = filepath.Join(dir, cfg.Name)
		scheme := "http"
		if base.PeerCertFile != "" {
			scheme = "https"
		}
		peer := fmt.Sprintf("%s://127.0.0.1:%d", scheme, FreePortPair(t))
		cfg.ListenPeerURLs = []string{peer}
		cfg.InitialAdvertisePeerURLs = []string{peer}
		cfg.ListenClientURLs = []string{fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))}
		cfg.FastGossip = true
		if cfg.HeartbeatInterval == 0 {
			cfg.HeartbeatInterval = 50 * time.Millisecond
			cfg.ElectionTimeout = 500 * time.Millisecond
		}
		if cfg.LeaderBalanceInterval == 0 {
			cfg.LeaderBalanceInterval = 500 * time.Millisecond
		}
		if cfg.Logger == nil {
			cfg.Logger = logs.With("node", cfg.Name)
		}
		initial = append(initial, cfg.Name+"="+peer)
		c.Configs = append(c.Configs, cfg)
	}
	for i := range c.Configs {
		c.Configs[i].InitialCluster = strings.Join(initial, ",")
	}
	c.Nodes = make([]*server.Server, n)
	for i := range c.Configs {
		c.Start(i)
	}
	t.Cleanup(c.StopAll)
	return c
}

// Start starts (or restarts) node i.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	s, err := server.New(c.Configs[i])
	if err != nil {
		c.t.Fatalf("start %s: %v", c.Configs[i].Name, err)
	}
	c.Nodes[i] = s
}

// Stop stops node i cleanly.
func (c *Cluster) Stop(i int) {
	if c.Nodes[i] != nil {
		c.Nodes[i].Stop()
		c.Nodes[i] = nil
	}
}

// StopAll stops every running node.
func (c *Cluster) StopAll() {
	for i := range c.Nodes {
		c.Stop(i)
	}
}

// Endpoint returns node i's client endpoint.
func (c *Cluster) Endpoint(i int) string {
	return strings.TrimPrefix(c.Configs[i].ListenClientURLs[0], "http://")
}

// Endpoints returns every node's client endpoint.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for i := range c.Configs {
		eps = append(eps, c.Endpoint(i))
	}
	return eps
}

// Join starts a new node that joins the cluster through node via's client
// URL (--join) and returns its index.
func (c *Cluster) Join(via int, base server.Config) int {
	c.t.Helper()
	dir := filepath.Dir(c.Configs[0].DataDir)
	cfg := c.Configs[0]
	cfg.Name = fmt.Sprintf("n%d", len(c.Configs)+1)
	cfg.DataDir = filepath.Join(dir, cfg.Name)
	peer := fmt.Sprintf("http://127.0.0.1:%d", FreePortPair(c.t))
	cfg.ListenPeerURLs = []string{peer}
	cfg.InitialAdvertisePeerURLs = []string{peer}
	cfg.ListenClientURLs = []string{fmt.Sprintf("http://127.0.0.1:%d", FreePort(c.t))}
	cfg.InitialCluster = cfg.Name + "=" + peer
	cfg.Join = "http://" + c.Endpoint(via)
	cfg.Logger = base.Logger
	if cfg.Logger == nil {
		cfg.Logger = Quiet().With("node", cfg.Name)
	}
	c.Configs = append(c.Configs, cfg)
	c.Nodes = append(c.Nodes, nil)
	c.Start(len(c.Configs) - 1)
	return len(c.Configs) - 1
}
