package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/brainkv/brain/internal/freeport"
)

// Node is one brainnode process of a Cluster.
type Node struct {
	Name   string
	Dir    string // data directory; the log is Dir + ".log"
	Host   string // the node's IP: loopback, or its namespace's address
	Client int    // client port
	Peer   int    // peer port (gossip on Peer+1)
	NS     string // its network namespace ("" when on the host's loopback)

	mu     sync.Mutex
	cmd    *exec.Cmd     // protected by mu; nil while down
	exited chan struct{} // closed when cmd has exited; protected by mu
	paused bool          // protected by mu

	// killing is set while the harness kills the process, expectExit
	// while a disk fault may make it stop itself; an exit with neither
	// counts in crashes.
	killing, expectExit atomic.Bool
	crashes             atomic.Int32
}

// goneLocked reports whether n's process has exited on its own.
func (n *Node) goneLocked() bool {
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return true
	default:
		return false
	}
}

// Crashes returns how many times n's process exited without the harness
// killing it or a disk fault that may stop it.
func (n *Node) Crashes() int { return int(n.crashes.Load()) }

// Endpoint is the node's client address.
func (n *Node) Endpoint() string { return fmt.Sprintf("%s:%d", n.Host, n.Client) }

func (n *Node) peerURL() string { return fmt.Sprintf("http://%s:%d", n.Host, n.Peer) }

// LogPath is the file the node's output goes to (appended across restarts).
func (n *Node) LogPath() string { return n.Dir + ".log" }

// Up reports whether the process runs (paused or not).
func (n *Node) Up() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil && !n.goneLocked()
}

// Leads returns the raft groups the node leads ("1" is the TSO; an etcd
// member leading its cluster leads "1"), from its metrics; nil if it does
// not answer within a second.
func (n *Node) Leads() []string {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + n.Endpoint() + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var groups []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "brain_raft_is_leader{") && strings.HasSuffix(line, " 1") {
			groups = append(groups, strings.TrimSuffix(strings.TrimPrefix(line, `brain_raft_is_leader{group="`), `"} 1`))
		}
		if line == "etcd_server_is_leader 1" {
			groups = append(groups, "1")
		}
	}
	sort.Strings(groups)
	return groups
}

// Systems a Cluster runs: brain (brainnode processes) or etcd (etcdref
// processes: etcd's own server built from go.etcd.io/etcd/server/v3/embed),
// so that a fault schedule can be run against the reference too.
const (
	SystemBrain = "brain"
	SystemEtcd  = "etcd"
)

// Cluster is a cluster of brainnode (or etcdref) processes on loopback
// ports.
type Cluster struct {
	Bin string
	// System is SystemBrain (default) or SystemEtcd; Bin must be the
	// system's binary.
	System string
	Nodes  []*Node
	Splits []string
	// Env is added to every node's environment (the bug injection knob of
	// a brainnode built with the chaosbugs tag).
	Env []string

	initial string
	net     *netns // nil on loopback
}

// NewCluster lays out n nodes under dir (not started), on loopback ports.
func NewCluster(bin, dir string, n int, splits []string) (*Cluster, error) {
	return newCluster(bin, dir, n, splits, false)
}

// NewNetnsCluster lays out n nodes under dir, each in a network namespace
// of its own on a bridge (root only), so faults can cut and slow the
// network between them (Isolate, Slow). Close removes the namespaces.
func NewNetnsCluster(bin, dir string, n int, splits []string) (*Cluster, error) {
	return newCluster(bin, dir, n, splits, true)
}

func newCluster(bin, dir string, n int, splits []string, useNetns bool) (*Cluster, error) {
	c := &Cluster{Bin: bin, Splits: splits}
	if useNetns {
		nw, err := newNetns(n)
		if err != nil {
			return nil, err
		}
		c.net = nw
	}
	var initial []string
	for i := 1; i <= n; i++ {
		node := &Node{Name: fmt.Sprintf("n%d", i), Dir: filepath.Join(dir, fmt.Sprintf("n%d", i))}
		if c.net != nil {
			node.Host, node.NS, node.Client, node.Peer = c.net.ip(i), c.net.ns(i), 2379, 2380
		} else {
			var err error
			node.Host = "127.0.0.1"
			if node.Client, err = freePort(); err != nil {
				return nil, err
			}
			if node.Peer, err = freePortPair(); err != nil {
				return nil, err
			}
		}
		c.Nodes = append(c.Nodes, node)
		initial = append(initial, fmt.Sprintf("%s=%s", node.Name, node.peerURL()))
	}
	c.initial = strings.Join(initial, ",")
	return c, nil
}

// Close stops every node and removes the network namespaces, if any.
func (c *Cluster) Close() {
	c.Stop()
	if c.net != nil {
		c.net.remove()
	}
}

// Endpoints are the client addresses of every node.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, n := range c.Nodes {
		eps = append(eps, n.Endpoint())
	}
	return eps
}

// Start starts n's process (a restart keeps its data).
func (c *Cluster) Start(n *Node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil && !n.goneLocked() {
		return nil
	}
	n.killing.Store(false)
	n.expectExit.Store(false)
	args := []string{"--name", n.Name, "--data-dir", n.Dir,
		"--listen-client-urls", "http://" + n.Endpoint(),
		"--listen-peer-urls", n.peerURL(),
		"--initial-advertise-peer-urls", n.peerURL(),
		"--initial-cluster", c.initial}
	if c.System != SystemEtcd {
		args = append(args, "--log-level", "info")
		if len(c.Splits) > 0 {
			args = append(args, "--initial-split-points", strings.Join(c.Splits, ","))
		}
	}
	logf, err := os.OpenFile(n.LogPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.Bin, args...)
	if n.NS != "" {
		// ip netns exec enters the namespace and execs the binary: the
		// process (and its PID, for signals) is brainnode's.
		cmd = exec.Command("ip", append([]string{"netns", "exec", n.NS, c.Bin}, args...)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), c.Env...)
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		if !n.killing.Load() && !n.expectExit.Load() {
			n.crashes.Add(1)
		}
		logf.Close()
		close(exited)
	}()
	n.cmd, n.exited, n.paused = cmd, exited, false
	return nil
}

// Kill kills n with SIGKILL (resuming it first if paused, so it dies now).
func (c *Cluster) Kill(n *Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	n.killing.Store(true)
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	_ = n.cmd.Process.Signal(syscall.SIGCONT)
	// Wait until the process is gone, so its ports are free for a restart.
	select {
	case <-n.exited:
	case <-time.After(10 * time.Second):
	}
	n.cmd, n.paused = nil, false
}

// Terminate stops n cleanly with SIGTERM (a planned restart: the node
// hands its leaderships off first) and waits for it to exit; after 20 s it
// is killed.
func (c *Cluster) Terminate(n *Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	n.killing.Store(true)
	if n.paused {
		_ = n.cmd.Process.Signal(syscall.SIGCONT)
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Signal(syscall.SIGKILL)
		<-n.exited
	}
	n.cmd, n.paused = nil, false
}

// WaitHealthy waits until n answers /health with status 200.
func (c *Cluster) WaitHealthy(ctx context.Context, n *Node) error {
	hc := http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get("http://" + n.Endpoint() + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s does not serve: %v", n.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Pause stops n with SIGSTOP.
func (c *Cluster) Pause(n *Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil && !n.paused {
		_ = n.cmd.Process.Signal(syscall.SIGSTOP)
		n.paused = true
	}
}

// Resume continues a paused n.
func (c *Cluster) Resume(n *Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil && n.paused {
		_ = n.cmd.Process.Signal(syscall.SIGCONT)
		n.paused = false
	}
}

// DiskFault switches n's disk fault (see internal/diskfault): mode off,
// stall (every write waits delay), fail (syncs fail) or full (writes fail
// with ENOSPC). The node must run with BRAIN_DISK_FAULTS=1. With fail or
// full the node may stop itself; that exit is not counted as a crash.
func (c *Cluster) DiskFault(ctx context.Context, n *Node, mode string, delay time.Duration) error {
	if mode == "fail" || mode == "full" {
		n.expectExit.Store(true)
	}
	u := fmt.Sprintf("http://%s/debug/diskfault?mode=%s&delay=%s", n.Endpoint(), mode, delay)
	hc := http.Client{Timeout: 2 * time.Second}
	var last error
	for range 20 { // a node that just restarted may not listen yet
		if (mode == "fail" || mode == "full") && last != nil && !n.Up() {
			// The fault took effect before the node could answer: its
			// next write failed and it stopped itself, as it should.
			return nil
		}
		resp, err := hc.Post(u, "text/plain", nil)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			return fmt.Errorf("%s: POST %s: %s %s", n.Name, u, resp.Status, body)
		}
		last = err
		sleep(ctx, 500*time.Millisecond)
	}
	return fmt.Errorf("%s: %w", n.Name, last)
}

// Stop kills every node.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		c.Kill(n)
	}
}

func (c *Cluster) index(n *Node) int {
	for i, m := range c.Nodes {
		if m == n {
			return i + 1
		}
	}
	return 0
}

// Isolate cuts n off from the other nodes (both ways, or only what it
// sends when oneWay); its clients still reach it. Namespaced clusters only.
func (c *Cluster) Isolate(n *Node, oneWay bool) error {
	if c.net == nil {
		return fmt.Errorf("network faults need a namespaced cluster")
	}
	return c.net.isolate(c.index(n), oneWay)
}

// Bridge partitions the cluster into two sides that cannot reach each
// other, with bridge alone reaching both (for 3 nodes: the two others
// are cut from each other). Namespaced clusters only.
func (c *Cluster) Bridge(bridge *Node) error {
	if c.net == nil {
		return fmt.Errorf("network faults need a namespaced cluster")
	}
	var others []int
	for _, n := range c.Nodes {
		if n != bridge {
			others = append(others, c.index(n))
		}
	}
	half := len(others) / 2
	var err error
	for _, i := range others[:half] {
		for _, j := range others[half:] {
			err = errors.Join(err, c.net.cut(i, j))
		}
	}
	return err
}

// Slow throttles (2 Mbit/s) and drops (2%) what n sends. Namespaced
// clusters only.
func (c *Cluster) Slow(n *Node) error {
	if c.net == nil {
		return fmt.Errorf("network faults need a namespaced cluster")
	}
	return c.net.slow(c.index(n))
}

// HealNetwork removes n's network faults.
func (c *Cluster) HealNetwork(n *Node) {
	if c.net != nil {
		c.net.heal(c.index(n))
	}
}

// Heal removes network faults, resumes paused nodes and starts the ones
// that are down.
func (c *Cluster) Heal() error {
	for _, n := range c.Nodes {
		c.HealNetwork(n)
		c.Resume(n)
		if err := c.Start(n); err != nil {
			return err
		}
	}
	return nil
}

// WaitServing waits until every node answers /health with status 200.
func (c *Cluster) WaitServing(ctx context.Context) error {
	for _, n := range c.Nodes {
		if err := c.WaitHealthy(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// Leader returns the node leading group ("1": the TSO), or nil.
func (c *Cluster) Leader(group string) *Node {
	for _, n := range c.Nodes {
		for _, g := range n.Leads() {
			if g == group {
				return n
			}
		}
	}
	return nil
}

// Busiest returns the running node leading the most groups.
func (c *Cluster) Busiest() *Node {
	var best *Node
	most := -1
	for _, n := range c.Nodes {
		if !n.Up() {
			continue
		}
		if l := len(n.Leads()); l > most {
			best, most = n, l
		}
	}
	return best
}

func freePort() (int, error) { return freeport.Port() }

// freePortPair returns a port p with p and p+1 free (TCP, and UDP for
// gossip on p+1).
func freePortPair() (int, error) { return freeport.Pair() }
