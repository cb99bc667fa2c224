package testutil

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/freeport"
	"github.com/brainkv/brain/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Quiet is a logger that drops everything below errors; set BRAIN_TEST_LOG=1
// to see a node's logs.
func Quiet() *slog.Logger {
	if os.Getenv("BRAIN_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))
}

// StartBrain starts an in-process brain node on a free loopback port with
// its data in a temporary directory, stopped when the test ends. Fields of
// cfg that are set are kept.
func StartBrain(t testing.TB, cfg server.Config) *server.Server {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.ListenClientURLs == nil {
		cfg.ListenClientURLs = []string{"http://127.0.0.1:0"}
	}
	if cfg.ListenPeerURLs == nil {
		cfg.ListenPeerURLs = []string{"http://127.0.0.1:0"}
	}
	if cfg.Logger == nil {
		cfg.Logger = Quiet()
	}
	s, err := server.New(cfg)
	if err != nil {
		t.Fatalf("start brain: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Endpoint returns a node's host:port.
func Endpoint(s *server.Server) string {
	u, _ := url.Parse(s.ClientURLs()[0])
	return u.Host
}

// FreePort returns a loopback port nobody listens on now (see package
// freeport).
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FreePortPair returns a loopback port p such that p and p+1 are free (a
// node's peer port and, by convention, its gossip port).
func FreePortPair(t testing.TB) int {
	t.Helper()
	p, err := freeport.Pair()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// StartEtcd starts an in-process etcd 3.6 (the reference) on free loopback
// ports, stopped when the test ends. It returns its client endpoint.
func StartEtcd(t testing.TB) string {
	t.Helper()
	return StartEtcdCluster(t, 1)[0]
}

// StartEtcdCluster starts an in-process etcd 3.6 cluster of n members on
// free loopback ports, stopped when the test ends, and returns their client
// endpoints once every member is ready.
func StartEtcdCluster(t testing.TB, n int) []string {
	t.Helper()
	return StartEtcdClusterWith(t, n, nil)
}

// StartEtcdClusterWith is StartEtcdCluster with every member's
// configuration passed through configure (nil: as is).
func StartEtcdClusterWith(t testing.TB, n int, configure func(*embed.Config)) []string {
	t.Helper()
	cfgs := make([]*embed.Config, n)
	var initial []string
	for i := range cfgs {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("e%d", i+1)
		cfg.Dir = t.TempDir()
		cfg.LogLevel = "error"
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)))
		pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", FreePort(t)))
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
		initial = append(initial, cfg.Name+"="+pu.String())
		if configure != nil {
			configure(cfg)
		}
		cfgs[i] = cfg
	}
	// Members block in StartEtcd until a quorum has started: start them
	// concurrently.
	etcds := make([]*embed.Etcd, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		cfg.InitialCluster = strings.Join(initial, ",")
		wg.Add(1)
		go func() {
			defer wg.Done()
			etcds[i], errs[i] = embed.StartEtcd(cfg)
		}()
	}
	wg.Wait()
	for _, e := range etcds {
		if e != nil {
			t.Cleanup(e.Close)
		}
	}
	var eps []string
	for i, e := range etcds {
		if errs[i] != nil {
			t.Fatalf("start etcd %s: %v", cfgs[i].Name, errs[i])
		}
		select {
		case <-e.Server.ReadyNotify():
		case <-time.After(30 * time.Second):
			t.Fatalf("etcd %s did not become ready", cfgs[i].Name)
		}
		eps = append(eps, cfgs[i].ListenClientUrls[0].Host)
	}
	return eps
}

// Dial opens a raw gRPC connection to an endpoint.
func Dial(t testing.TB, endpoint string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30), grpc.MaxCallSendMsgSize(1<<30)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Client returns an etcd clientv3 client for endpoint.
func Client(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ArtifactPath names a file a test writes only when it fails (such as
// porcupine's visualization) and that must outlive the test's temp dir:
// under $BRAIN_TEST_ARTIFACTS, else the system temp dir.
func ArtifactPath(t testing.TB, name string) string {
	dir := os.Getenv("BRAIN_TEST_ARTIFACTS")
	if dir == "" {
		dir = os.TempDir()
	}
	safe := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return filepath.Join(dir, fmt.Sprintf("%s-%d-%s", safe, time.Now().UnixNano(), name))
}
