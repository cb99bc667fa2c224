// Package brainproc starts brainnode processes for tests and connects
// kube-apiserver's etcd client to them.
//
// Every test gets a fresh brainnode: its own temporary data directory and
// free loopback ports. The process is stopped with SIGTERM when the test
// ends and its log is printed if the test failed.
package brainproc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
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

	"k8s.io/apiserver/pkg/storage"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
)

// EnvBinary names the environment variable holding the path of a prebuilt
// brainnode binary. When it is unset, Binary builds one from the repository.
const EnvBinary = "BRAINNODE"

var binary string

// Setup is called from TestMain. It resolves the brainnode binary: the path
// in $BRAINNODE, or else a binary built with "go build" from the repository
// root (two directories above the test module). The returned function
// removes a binary it built.
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

// Node is a running brainnode.
type Node struct {
	Endpoint string
	DataDir  string

	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	waitErr error
}

// portLock serializes port picking and startup within one test binary so
// that two nodes do not pick the same free port.
var portLock sync.Mutex

// Start starts a brainnode for t and stops it when t ends.
func Start(t testing.TB, opts Options) *Node {
	t.Helper()
	if binary == "" {
		t.Fatal("brainproc.Setup was not called from TestMain")
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		n, err := start(t, opts)
		if err == nil {
			return n
		}
		lastErr = err
		t.Logf("brainnode start attempt %d failed: %v", attempt+1, err)
	}
	t.Fatalf("cannot start brainnode: %v", lastErr)
	return nil
}

func start(t testing.TB, opts Options) (*Node, error) {
	portLock.Lock()
	defer portLock.Unlock()

	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	dir := t.TempDir()
	n := &Node{
		Endpoint: "http://127.0.0.1:" + strconv.Itoa(ports[0]),
		DataDir:  filepath.Join(dir, "data"),
		logPath:  filepath.Join(dir, "brainnode.log"),
		exited:   make(chan struct{}),
	}
	logFile, err := os.Create(n.logPath)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--data-dir", n.DataDir,
		"--listen-client-urls", n.Endpoint,
		"--listen-peer-urls", "http://127.0.0.1:" + strconv.Itoa(ports[1]),
	}
	if opts.WatchProgressNotifyInterval > 0 {
		args = append(args, "--watch-progress-notify-interval", opts.WatchProgressNotifyInterval.String())
	}
	n.cmd = exec.Command(binary, args...)
	n.cmd.Stdout = logFile
	n.cmd.Stderr = logFile
	if err := n.cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	go func() {
		n.waitErr = n.cmd.Wait()
		logFile.Close()
		close(n.exited)
	}()

	if err := n.waitReady(30 * time.Second); err != nil {
		n.kill()
		return nil, fmt.Errorf("%v\n--- brainnode log ---\n%s", err, n.log())
	}
	t.Cleanup(func() { n.stop(t) })
	return n, nil
}

// waitReady waits for the "brain node ready" log line and for the client
// port to accept connections.
func (n *Node) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	addr := strings.TrimPrefix(n.Endpoint, "http://")
	for {
		select {
		case <-n.exited:
			return fmt.Errorf("brainnode exited during startup: %v", n.waitErr)
		default:
		}
		if strings.Contains(n.log(), "brain node ready") {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
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

func (n *Node) log() string {
	b, _ := os.ReadFile(n.logPath)
	return string(b)
}

func (n *Node) kill() {
	_ = n.cmd.Process.Kill()
	<-n.exited
}

// stop sends SIGTERM and waits; a node that does not exit in 20s is killed
// and the test fails.
func (n *Node) stop(t testing.TB) {
	select {
	case <-n.exited:
		t.Errorf("brainnode exited before the end of the test: %v\n--- brainnode log ---\n%s", n.waitErr, n.log())
		return
	default:
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
		var ee *exec.ExitError
		if n.waitErr != nil && !(errors.As(n.waitErr, &ee) && ee.Exited() && ee.ExitCode() == 0) {
			t.Errorf("brainnode exited with %v after SIGTERM", n.waitErr)
		}
	case <-time.After(20 * time.Second):
		n.kill()
		t.Errorf("brainnode did not exit within 20s of SIGTERM; killed")
	}
	if t.Failed() {
		t.Logf("--- brainnode log (%s) ---\n%s", n.Endpoint, tail(n.log(), 200))
	}
}

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) > lines {
		parts = append([]string{fmt.Sprintf("... (%d earlier lines)", len(parts)-lines)}, parts[len(parts)-lines:]...)
	}
	return strings.Join(parts, "\n")
}

func freePorts(count int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := 0; i < count; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// NewClient returns kube-apiserver's etcd client connected to n, wrapped
// in the request recorders of k8s.io/apiserver/pkg/storage/testing exactly as
// k8s.io/apiserver/pkg/storage/etcd3/testserver.RunEtcd does. The client is
// closed when t ends (before the node is stopped).
func (n *Node) NewClient(t testing.TB) *kubernetes.Client {
	t.Helper()
	client, err := kubernetes.New(clientv3.Config{
		Endpoints:   []string{n.Endpoint},
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
	kubernetesRecorder := storagetesting.NewKubernetesRecorder(client.Kubernetes)
	client.KV = storagetesting.NewKVRecorder(client.KV, kubernetesRecorder)
	client.Kubernetes = kubernetesRecorder
	return client
}

// RunBrain starts a brainnode for t and returns a client for it, like
// testserver.RunEtcd does for an embedded etcd.
func RunBrain(t testing.TB, opts Options) *kubernetes.Client {
	t.Helper()
	return Start(t, opts).NewClient(t)
}

// WaitForRequestWatchProgressSupport waits (up to 10s) for kube-apiserver's
// process-wide etcd feature checker to decide that the endpoints support
// RequestWatchProgress. etcd3.New starts that check in the background from
// the version brainnode reports in Status; the watch cache serves
// consistent reads only once it is known. Upstream tests race with the
// check; waiting makes the first test of a process deterministic. If the
// check does not come out positive the test is not failed here: the tests
// that depend on it (ConsistentList) report it.
func WaitForRequestWatchProgressSupport(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RequestWatchProgress) {
		if time.Now().After(deadline) {
			t.Logf("RequestWatchProgress still not reported as supported after 10s (brainnode's Status version must be >= 3.4.31 and not 3.5.0-3.5.12)")
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
