package server_test

import (
	"context"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/brainkv/brain/internal/history"
	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestClusterServesFromEveryNode writes through every node of a 3-node
// cluster and reads and watches through every node.
func TestClusterServesFromEveryNode(t *testing.T) {
	c := testutil.StartCluster(t, 3, server.Config{InitialSplitPoints: []string{"c", "m", "t"}})
	var clients []*clientv3.Client
	for i := range c.Nodes {
		clients = append(clients, testutil.Client(t, c.Endpoint(i)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Wait for the cluster to serve.
	for {
		if _, err := clients[0].Put(ctx, "warm", "up"); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	start, _ := clients[2].Get(ctx, "x")
	wch := clients[2].Watch(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(start.Header.Revision+1), clientv3.WithPrevKV())
	var last int64
	keys := []string{"a", "d", "n", "u"}
	for i := 0; i < 60; i++ {
		k := keys[i%len(keys)]
		p, err := clients[i%3].Put(ctx, k, fmt.Sprint(i))
		if err != nil {
			t.Fatalf("put %d via node %d: %v", i, i%3, err)
		}
		if p.Header.Revision <= last {
			t.Fatalf("revision %d after %d", p.Header.Revision, last)
		}
		last = p.Header.Revision
		// Every node reads its own and others' writes (linearizable reads).
		for j, cl := range clients {
			g, err := cl.Get(ctx, k)
			if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != fmt.Sprint(i) {
				t.Fatalf("read %s via node %d after write %d: %v %v", k, j, i, g, err)
			}
			if g.Header.Revision < last {
				t.Fatalf("node %d read header %d below acknowledged %d", j, g.Header.Revision, last)
			}
		}
	}
	seen := 0
	for seen < 60 {
		select {
		case wr := <-wch:
			seen += len(wr.Events)
		case <-ctx.Done():
			t.Fatalf("watch on node 3 saw %d of 60 events", seen)
		}
	}
	// Leaders end up spread: every node leads something.
	deadline := time.Now().Add(15 * time.Second)
	for {
		leads := map[string]int{}
		for i, s := range c.Nodes {
			leads[fmt.Sprint(i)] = len(s.Leading())
		}
		if leads["0"] > 0 && leads["1"] > 0 && leads["2"] > 0 {
			t.Logf("leaderships per node: %v", leads)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leaders not spread: %v", leads)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestClusterLinearizableUnderNodeRestarts runs the concurrent checker
// against a 3-node cluster while nodes 2 and 3 are stopped and restarted
// one at a time (a stopped node may lead the TSO, the meta group and
// partitions): clients use every endpoint, as kube-apiserver does; a watch
// on node 1 (which stays up) must see the whole history without a gap or
// duplicate; watches on the other nodes resume on another node from the
// last revision they saw and must see exactly the rest.
func TestClusterLinearizableUnderNodeRestarts(t *testing.T) {
	checkClusterUnderRestarts(t, 3, 3)
}

// TestClusterRemoteFeedsUnderNodeRestarts is the same check on 4 nodes
// with 3 replicas per group: every node lacks replicas of some partitions,
// so its watches merge feeds streamed from other nodes, which must
// survive the restarts of the nodes serving them.
func TestClusterRemoteFeedsUnderNodeRestarts(t *testing.T) {
	checkClusterUnderRestarts(t, 4, 3)
}

func checkClusterUnderRestarts(t *testing.T, nodes, replicas int) {
	seed := *concSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (rerun with -conc.seed=%d)", seed, seed)
	c := testutil.StartCluster(t, nodes, server.Config{InitialSplitPoints: concSplits, Replicas: replicas})
	if local, all := len(c.Nodes[0].Store().Partitions()), len(concSplits)+1; nodes > replicas && local == all {
		t.Fatalf("node 1 has all %d partitions; the test needs it to lack some", all)
	}
	all := clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()}
	newClient := func(eps ...string) *clientv3.Client {
		cfg := all
		if len(eps) > 0 {
			cfg.Endpoints = eps
		}
		cl, err := clientv3.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	warm := newClient(c.Endpoint(0))
	rec := history.NewRecorder()
	for i := 0; ; i++ {
		if out := history.Do(rec, warm, 99, history.Input{Kind: history.Put, Key: "/warm", Value: fmt.Sprint("warm-", i)}, time.Second); !out.Unknown {
			break
		}
		if i > 300 {
			t.Fatal("the cluster did not start serving")
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Watches need every node to know a leader (etcd's require-leader).
	for deadline := time.Now().Add(10 * time.Second); ; {
		ready := true
		for _, n := range c.Nodes {
			ready = ready && n.HasLeader()
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("some node does not know a leader")
		}
		time.Sleep(20 * time.Millisecond)
	}

	ctx, stopWatches := context.WithCancel(context.Background())
	var wwg sync.WaitGroup
	ref := &history.Watch{Name: "reference@n1", Key: "\x00", End: "\x00", Start: 1, PrevKV: true}
	wwg.Add(1)
	go func() {
		defer wwg.Done()
		if err := history.RecordWatch(ctx, newClient(c.Endpoint(0)), ref, 0); err != nil && ctx.Err() == nil {
			t.Errorf("reference watch on the node that stays up failed: %v", err)
		}
	}()
	var resuming []*history.Watch
	for i, node := range []int{1, 2} {
		w := &history.Watch{Name: fmt.Sprintf("resuming@n%d", node+1), Key: "\x00", End: "\x00", Start: 1, PrevKV: i == 0}
		if i == 1 {
			w.Key, w.End = "/registry/events/", "/registry/pods/"
		}
		resuming = append(resuming, w)
		// A client of this node that fails over to another (clientv3 resumes
		// the watch there from the last revision), and explicit resumption
		// on other nodes if the stream ends.
		clients := []*clientv3.Client{newClient(c.Endpoint(node), c.Endpoint((node+1)%nodes)), newClient(c.Endpoint(0))}
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			history.RecordResumingWatch(ctx, clients, w, 20*time.Millisecond)
		}()
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for cl := 0; cl < 9; cl++ {
		wg.Add(1)
		go func(cl int) {
			defer wg.Done()
			kv := newClient()
			wl := history.NewWorkload(seed+int64(cl), concKeys, 30, 20, 40)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				in := wl.Next(fmt.Sprintf("c%d-%d", cl, i))
				wl.Observe(in, history.Do(rec, kv, cl, in, 5*time.Second))
			}
		}(cl)
	}
	rng := rand.New(rand.NewSource(seed))
	for round := 0; round < 4; round++ {
		time.Sleep(time.Duration(300+rng.Intn(700)) * time.Millisecond)
		node := 1 + rng.Intn(nodes-1)
		t.Logf("round %d: stopping n%d (it leads %v)", round, node+1, c.Nodes[node].Leading())
		c.Stop(node)
		time.Sleep(time.Duration(500+rng.Intn(1000)) * time.Millisecond)
		c.Start(node)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	ops := rec.Ops()

	fctx, fcancel := context.WithTimeout(context.Background(), 30*time.Second)
	g, err := warm.Get(fctx, "x")
	fcancel()
	if err != nil {
		t.Fatal(err)
	}
	final := g.Header.Revision
	waitWatches(t, append([]*history.Watch{ref}, resuming...), final)
	stopWatches()
	wwg.Wait()

	unknown := 0
	for _, op := range ops {
		if op.Out.Unknown {
			unknown++
		}
	}
	html := testutil.ArtifactPath(t, "porcupine.html")
	res, err := history.CheckLinearizable(ops, 2*time.Minute, html)
	if err != nil {
		t.Fatal(err)
	}
	if res != porcupine.Ok {
		t.Errorf("porcupine: history of %d operations is %v (seed %d; visualization: %s)", len(ops), res, seed, html)
	}
	for _, err := range history.CheckRevisions(ops) {
		t.Error(err)
	}
	for _, err := range history.CheckHistory(ref, ops) {
		t.Error(err)
	}
	for _, w := range resuming {
		for _, err := range history.CheckWatch(w, ref) {
			t.Error(err)
		}
	}
	t.Logf("%d operations (%d with unknown outcome), final revision %d, watches resumed at %v and %v",
		len(ops), unknown, final, resuming[0].Resumed, resuming[1].Resumed)
}

// TestOtherClusterRefused starts a new two-node cluster whose first member
// has the address (and so the member ID) of a stopped member of a running
// three-node cluster, as when a cluster is re-created on the same hosts
// while an old member still runs. The old cluster's leaders keep sending
// that member raft messages for groups of the same IDs with commit
// indexes the new member's logs do not have; before peers checked cluster
// IDs the new member panicked ("tocommit(8) is out of range"). Now it
// refuses them (and the old cluster's gossip), both clusters serve, and
// the refusals are counted.
func TestOtherClusterRefused(t *testing.T) {
	old := testutil.StartCluster(t, 3, server.Config{InitialSplitPoints: []string{"m"}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	oc := testutil.Client(t, old.Endpoint(1))
	for i := 0; i < 50; i++ {
		if _, err := putRetry(ctx, oc, fmt.Sprintf("k%d", i%7), "old"); err != nil {
			t.Fatal(err)
		}
	}
	old.Stop(0)

	// The new cluster: the old n1's name and peer URL (so its member ID),
	// a fresh data directory, and a second member.
	dir := t.TempDir()
	a := old.Configs[0]
	a.DataDir = filepath.Join(dir, "n1")
	b := a
	b.Name = "nb"
	b.DataDir = filepath.Join(dir, "nb")
	peerB := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePortPair(t))
	b.ListenPeerURLs, b.InitialAdvertisePeerURLs = []string{peerB}, []string{peerB}
	b.ListenClientURLs = []string{fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))}
	a.InitialCluster = "n1=" + a.InitialAdvertisePeerURLs[0] + ",nb=" + peerB
	b.InitialCluster = a.InitialCluster
	var nodes []*server.Server
	for _, cfg := range []server.Config{a, b} {
		s, err := server.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Stop()
		nodes = append(nodes, s)
	}
	nc := testutil.Client(t, strings.TrimPrefix(a.ListenClientURLs[0], "http://"))
	// Both clusters write while the old one's leaders try to reach n1.
	for i := 0; i < 40; i++ {
		if _, err := putRetry(ctx, nc, fmt.Sprintf("k%d", i%5), "new"); err != nil {
			t.Fatalf("new cluster: %v", err)
		}
		if _, err := putRetry(ctx, oc, fmt.Sprintf("k%d", i%5), "old"); err != nil {
			t.Fatalf("old cluster: %v", err)
		}
		time.Sleep(25 * time.Millisecond)
	}
	g, err := nc.Get(ctx, "k", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range g.Kvs {
		if string(kv.Value) != "new" {
			t.Fatalf("new cluster holds %s=%s", kv.Key, kv.Value)
		}
	}
	if len(g.Kvs) != 5 {
		t.Fatalf("new cluster holds %d keys, want 5", len(g.Kvs))
	}
	resp, err := http.Get(a.ListenClientURLs[0] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`(?m)^brain_peer_requests_refused_total (\d+)`).FindSubmatch(body)
	if m == nil || string(m[1]) == "0" {
		t.Fatalf("the new n1 refused no peer requests from the old cluster: %q", m)
	}
	t.Logf("new n1 refused %s peer requests from the old cluster", m[1])
}

// putRetry puts, retrying while the cluster elects leaders.
func putRetry(ctx context.Context, c *clientv3.Client, k, v string) (*clientv3.PutResponse, error) {
	for {
		p, err := c.Put(ctx, k, v)
		if err == nil || ctx.Err() != nil {
			return p, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
