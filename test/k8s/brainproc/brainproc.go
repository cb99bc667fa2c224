// Package brainproc starts brainnode processes for tests and connects
// kube-apiserver's etcd client to them.
//
// Every test gets a fresh brainnode (or a fresh cluster of
// $BRAIN_K8S_NODES of them): its own temporary data directories and free
// loopback ports. The processes are stopped with SIGTERM when the test
// ends and their logs are printed if the test failed.
//
// It is a module of its own, shared by the conformance modules of every
// kube-apiserver release under test (../ and ../v0.32). It therefore
// depends on nothing of Kubernetes, and requires the oldest etcd client
// those releases use (go.etcd.io/etcd/client/v3 v3.5.16, whose
// client/v3/kubernetes package kube-apiserver 1.32 already uses): Go's
// minimal version selection then leaves each conformance module on the
// etcd client its kube-apiserver release requires. What needs
// k8s.io/apiserver (the request recorders, the feature checker) lives in
// each conformance module.
package brainproc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"
)

// EnvBinary names the environment variable holding the path of a prebuilt
// brainnode binary. When it is unset, Binary builds one from the repository.
const EnvBinary = "BRAINNODE"

var binary string

// Setup is called from TestMain. It resolves the brainnode binary: the path
// in $BRAINNODE, or else a binary built with "go build" from the repository
// root (the nearest parent directory whose go.mod is the brain module).
// The returned function removes a binary it built.
func Setup() (cleanup func(), err error) {
	if p := os.Getenv(EnvBinary); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(abs); err != nil {
			return nil, fmt.Errorf("$%s: %w", EnvBinary, err)
		}
		binary = abs
		return func() {}, nil
	}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "brainnode-bin-")
	if err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "brainnode")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/brainnode")
	cmd.Dir = root
	// The test module's own settings must not leak into the server build.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("building brainnode in %s: %v\n%s", root, err, b)
	}
	binary = out
	return func() { os.RemoveAll(dir) }, nil
}

// repoRoot finds the brain repository root: the nearest parent of the
// working directory whose go.mod declares module github.com/brainkv/brain.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modulePath(b) == "github.com/brainkv/brain" {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the brain repository root (go.mod of github.com/brainkv/brain); set $" + EnvBinary)
		}
		dir = parent
	}
}

func modulePath(gomod []byte) string {
	s := bufio.NewScanner(bytes.NewReader(gomod))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// Options tune a brainnode process.
type Options struct {
	// WatchProgressNotifyInterval is passed as
	// --watch-progress-notify-interval when nonzero.
	WatchProgressNotifyInterval time.Duration
}

// EnvNodes names the environment variable holding how many brainnodes each
// test runs as one cluster (default 1: a single node). With more, the
// client connects to every node, as kube-apiserver does with several
// --etcd-servers.
const EnvNodes = "BRAIN_K8S_NODES"

// Nodes returns the cluster size from $BRAIN_K8S_NODES.
func Nodes() int {
	n, err := strconv.Atoi(os.Getenv(EnvNodes))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// Node is a running brainnode, or a cluster of them.
type Node struct {
	// Endpoint is the first node's client URL; Endpoints are all of them.
	Endpoint  string
	Endpoints []string
	DataDir   string

	procs []*proc
}

// proc is one brainnode process.
type proc struct {
	endpoint string
	cmd      *exec.Cmd
	logPath  string
	exited   chan struct{}
	waitErr  error
}

// portLock serializes port picking and startup within one test binary so
// that two nodes do not pick the same free port.
var portLock sync.Mutex

// Start starts a brainnode (a cluster of Nodes() of them) for t and stops
// it when t ends.
func Start(t testing.TB, opts Options) *Node {
	t.Helper()
	if binary == "" {
		t.Fatal("brainproc.Setup was not called from TestMain")
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		n, err := start(t, opts, Nodes())
		if err == nil {
			return n
		}
		lastErr = err
		t.Logf("brainnode start attempt %d failed: %v", attempt+1, err)
	}
	t.Fatalf("cannot start brainnode: %v", lastErr)
	return nil
}

func start(t testing.TB, opts Options, count int) (*Node, error) {
	portLock.Lock()
	defer portLock.Unlock()

	// A client port and a peer port per node; a node gossips on its peer
	// port + 1, which freePorts keeps free too.
	ports, err := freePorts(2 * count)
	if err != nil {
		return nil, err
	}
	dir := t.TempDir()
	n := &Node{DataDir: filepath.Join(dir, "n1", "data")}
	var initial []string
	for i := 0; i < count; i++ {
		initial = append(initial, fmt.Sprintf("n%d=http://127.0.0.1:%d", i+1, ports[2*i+1]))
	}
	for i := 0; i < count; i++ {
		name := fmt.Sprintf("n%d", i+1)
		peer := "http://127.0.0.1:" + strconv.Itoa(ports[2*i+1])
		p := &proc{
			endpoint: "http://127.0.0.1:" + strconv.Itoa(ports[2*i]),
			logPath:  filepath.Join(dir, name, "brainnode.log"),
			exited:   make(chan struct{}),
		}
		if err := os.MkdirAll(filepath.Dir(p.logPath), 0o755); err != nil {
			return nil, err
		}
		logFile, err := os.Create(p.logPath)
		if err != nil {
			return nil, err
		}
		args := []string{
			"--name", name,
			"--data-dir", filepath.Join(dir, name, "data"),
			"--listen-client-urls", p.endpoint,
			"--listen-peer-urls", peer,
			"--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","),
		}
		if count > 1 {
			// Elections in half a second keep the per-test start short.
			args = append(args, "--heartbeat-interval", "50", "--election-timeout", "500")
		}
		if opts.WatchProgressNotifyInterval > 0 {
			args = append(args, "--watch-progress-notify-interval", opts.WatchProgressNotifyInterval.String())
		}
		p.cmd = exec.Command(binary, args...)
		p.cmd.Stdout = logFile
		p.cmd.Stderr = logFile
		if err := p.cmd.Start(); err != nil {
			logFile.Close()
			n.kill()
			return nil, err
		}
		go func() {
			p.waitErr = p.cmd.Wait()
			logFile.Close()
			close(p.exited)
		}()
		n.procs = append(n.procs, p)
		n.Endpoints = append(n.Endpoints, p.endpoint)
	}
	n.Endpoint = n.Endpoints[0]
	for _, p := range n.procs {
		if err := p.waitReady(30*time.Second, count > 1); err != nil {
			n.kill()
			return nil, fmt.Errorf("%s: %v\n--- brainnode log ---\n%s", p.endpoint, err, p.log())
		}
	}
	t.Cleanup(func() { n.stop(t) })
	return n, nil
}

// waitReady waits for the "serving client requests" log line and for the client
// port to accept connections; a cluster member also waits until /health
// reports it serves (its groups have leaders).
func (p *proc) waitReady(timeout time.Duration, health bool) error {
	deadline := time.Now().Add(timeout)
	addr := strings.TrimPrefix(p.endpoint, "http://")
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("brainnode exited during startup: %v", p.waitErr)
		default:
		}
		if strings.Contains(p.log(), "serving client requests") {
			if health {
				if resp, err := http.Get(p.endpoint + "/health"); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						return nil
					}
				}
			} else if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("brainnode not ready after %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

func (n *Node) kill() {
	for _, p := range n.procs {
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// stop sends SIGTERM to every process and waits; a node that does not exit
// in 20s is killed and the test fails.
func (n *Node) stop(t testing.TB) {
	for _, p := range n.procs {
		select {
		case <-p.exited:
			t.Errorf("brainnode %s exited before the end of the test: %v\n--- brainnode log ---\n%s", p.endpoint, p.waitErr, p.log())
			continue
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range n.procs {
		select {
		case <-p.exited:
			var ee *exec.ExitError
			if p.waitErr != nil && !(errors.As(p.waitErr, &ee) && ee.Exited() && ee.ExitCode() == 0) {
				t.Errorf("brainnode %s exited with %v after SIGTERM", p.endpoint, p.waitErr)
			}
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Errorf("brainnode %s did not exit within 20s of SIGTERM; killed", p.endpoint)
		}
	}
	if t.Failed() {
		for _, p := range n.procs {
			t.Logf("--- brainnode log (%s) ---\n%s", p.endpoint, tail(p.log(), 200))
		}
	}
}

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) > lines {
		parts = append([]string{fmt.Sprintf("... (%d earlier lines)", len(parts)-lines)}, parts[len(parts)-lines:]...)
	}
	return strings.Join(parts, "\n")
}

// freePorts returns count distinct free loopback ports p whose p+1 is free
// too (a brain node gossips on its peer port + 1).
func freePorts(count int) ([]int, error) {
	var ports []int
	var ls []io.Closer
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for tries := 0; len(ports) < count; tries++ {
		if tries > 100*count {
			return nil, errors.New("no free port pairs")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		p := l.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		if err != nil {
			continue
		}
		ls = append(ls, l2)
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p+1))
		if err != nil {
			continue
		}
		ls = append(ls, u)
		ports = append(ports, p)
	}
	return ports, nil
}

// NewClient returns kube-apiserver's etcd client connected to every node
// of n, as kube-apiserver connects with several --etcd-servers, once the
// first node answers Status. The client is closed when t ends (before the
// node is stopped). The conformance modules wrap it in the request
// recorders their k8s.io/apiserver release's tests use.
func (n *Node) NewClient(t testing.TB) *kubernetes.Client {
	t.Helper()
	client, err := kubernetes.New(clientv3.Config{
		Endpoints:   n.Endpoints,
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Status(ctx, n.Endpoint); err != nil {
		t.Fatalf("brainnode at %s does not answer Status: %v", n.Endpoint, err)
	}
	return client
}
