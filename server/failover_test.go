package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/brainkv/brain/chaos"
	"github.com/brainkv/brain/internal/history"
	"github.com/brainkv/brain/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestFailoverKillAndPause runs a 3-node cluster of brainnode processes
// with the default timeouts under a write load from clients of every
// endpoint, kills -9 the node leading the TSO (and restarts it), then
// pauses (SIGSTOP) the node leading the most groups (and resumes it). It
// reports the longest gap between acknowledged writes after each fault
// (the unavailability window), and checks that the history is
// linearizable, that nothing acknowledged was lost, and that a watch
// failing over between nodes saw everything exactly once.
func TestFailoverKillAndPause(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes; skipped with -short")
	}
	cl := startProcCluster(t, 3)
	eps := cl.Endpoints()
	newClient := func() *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: time.Second, Logger: zap.NewNop(),
			DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: time.Second}) // 10 s: gRPC raises any lower keepalive time to it
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	rec := history.NewRecorder()
	warm := newClient()
	for i := 0; ; i++ {
		if !history.Do(rec, warm, 99, history.Input{Kind: history.Put, Key: "/warm", Value: fmt.Sprint("warm-", i)}, time.Second).Unknown {
			break
		}
		if i > 600 {
			t.Fatal("the cluster did not start serving")
		}
		time.Sleep(50 * time.Millisecond)
	}

	ctx, stopWatch := context.WithCancel(context.Background())
	watch := &history.Watch{Name: "failover-watch", Key: "\x00", End: "\x00", Start: 1, PrevKV: true}
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		history.RecordResumingWatch(ctx, []*clientv3.Client{newClient()}, watch, 50*time.Millisecond)
	}()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for cl := 0; cl < 6; cl++ {
		wg.Add(1)
		go func(cl int) {
			defer wg.Done()
			kv := newClient()
			wl := history.NewWorkload(int64(cl), concKeys, 10, 60, 20)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				in := wl.Next(fmt.Sprintf("c%d-%d", cl, i))
				wl.Observe(in, history.Do(rec, kv, cl, in, 2*time.Second))
			}
		}(cl)
	}
	time.Sleep(2 * time.Second)
	var victim *chaos.Node
	for i := 0; i < 50 && victim == nil; i++ {
		if victim = cl.Leader("1"); victim == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if victim == nil {
		t.Fatal("no node leads the TSO")
	}
	t.Logf("kill -9 %s, leading %v", victim.Name, victim.Leads())
	killAt := rec.Now()
	cl.Kill(victim)
	time.Sleep(3 * time.Second)
	if err := cl.Start(victim); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	busiest := cl.Busiest()
	t.Logf("SIGSTOP %s, leading %v", busiest.Name, busiest.Leads())
	pauseAt := rec.Now()
	cl.Pause(busiest)
	time.Sleep(4 * time.Second)
	cl.Resume(busiest)
	resumeAt := rec.Now()
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	ops := rec.Ops()

	// Unavailability: the longest gap between acknowledged writes.
	var acks []int64
	for _, op := range ops {
		if op.IsWrite() {
			acks = append(acks, op.Return)
		}
	}
	sort.Slice(acks, func(i, j int) bool { return acks[i] < acks[j] })
	gap := func(from, to int64) time.Duration {
		var longest int64
		prev := from
		for _, a := range acks {
			if a < from {
				continue
			}
			if a > to {
				break
			}
			longest = max(longest, a-prev)
			prev = a
		}
		return time.Duration(longest)
	}
	killGap := gap(killAt, killAt+int64(3*time.Second))
	pauseGap := gap(pauseAt, resumeAt)
	t.Logf("unavailability after kill -9 of the TSO leader: %v; during the pause of the busiest leader: %v", killGap.Round(time.Millisecond), pauseGap.Round(time.Millisecond))
	if killGap > 15*time.Second || pauseGap > 15*time.Second {
		t.Errorf("writes did not resume")
	}

	final, err := warm.Get(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	waitWatches(t, []*history.Watch{watch}, final.Header.Revision)
	stopWatch()
	<-wdone
	ref := &history.Watch{Name: "reference", Key: "\x00", End: "\x00", Start: 1, PrevKV: true}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan struct{})
	go func() { defer close(rdone); _ = history.RecordWatch(rctx, newClient(), ref, 20*time.Millisecond) }()
	waitWatches(t, []*history.Watch{ref}, final.Header.Revision)
	rcancel()
	<-rdone

	html := testutil.ArtifactPath(t, "porcupine.html")
	res, err := history.CheckLinearizable(ops, 2*time.Minute, html)
	if err != nil {
		t.Fatal(err)
	}
	if res != porcupine.Ok {
		t.Errorf("porcupine: %v (visualization: %s)", res, html)
	}
	for _, err := range history.CheckRevisions(ops) {
		t.Error(err)
	}
	for _, err := range history.CheckHistory(ref, ops) {
		t.Error(err)
	}
	for _, err := range history.CheckWatch(watch, ref) {
		t.Error(err)
	}
	unknown := 0
	for _, op := range ops {
		if op.Out.Unknown {
			unknown++
		}
	}
	t.Logf("%d operations, %d acknowledged writes, %d of unknown outcome, final revision %d", len(ops), len(acks), unknown, final.Header.Revision)
	if t.Failed() {
		keep := testutil.ArtifactPath(t, "history.json")
		if b, err := json.Marshal(struct {
			Ops   []history.Op
			Watch *history.Watch
			Ref   *history.Watch
		}{ops, watch, ref}); err == nil && os.WriteFile(keep, b, 0o644) == nil {
			t.Logf("history: %s", keep)
		}
	}
}

// TestDeposedLeaderAnswersNoStaleCompare pauses the node leading the
// partition of a key, updates the key through the others (a new leader
// takes over), sends a compare-and-swap that expects the new mod revision
// to the paused node, and resumes it. The paused node still believes it
// leads and holds the old state; a compare that fails there is a read and
// must not be answered from that stale state: the CAS must succeed (or
// fail retryably), never report a failed compare.
func TestDeposedLeaderAnswersNoStaleCompare(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes; skipped with -short")
	}
	cl, err := chaos.NewCluster(brainnodeBinary(t), t.TempDir(), 3, concSplits)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Stop()
	for _, n := range cl.Nodes {
		if err := cl.Start(n); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cl.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	const key, group = "/registry/pods/deposed", "103" // the last partition of concSplits
	for round := 0; round < 3; round++ {
		var old *chaos.Node
		for i := 0; i < 100 && old == nil; i++ {
			if old = cl.Leader(group); old == nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
		if old == nil {
			t.Fatal("no leader of the partition")
		}
		var others []string
		for _, n := range cl.Nodes {
			if n != old {
				others = append(others, n.Endpoint())
			}
		}
		rest := testutil.Client(t, others[0])
		rest.SetEndpoints(others...)
		stale := testutil.Client(t, old.Endpoint())
		if _, err := rest.Put(ctx, key, fmt.Sprint("before-", round)); err != nil {
			t.Fatal(err)
		}
		cl.Pause(old)
		var mod int64
		for mod == 0 && ctx.Err() == nil {
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			if p, err := rest.Put(pctx, key, fmt.Sprint("after-", round)); err == nil {
				mod = p.Header.Revision
			}
			pcancel()
		}
		// The CAS reaches the paused node and is served when it resumes.
		type result struct {
			resp *clientv3.TxnResponse
			err  error
		}
		done := make(chan result, 1)
		go func() {
			tctx, tcancel := context.WithTimeout(ctx, 10*time.Second)
			defer tcancel()
			r, err := stale.Txn(tctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", mod)).
				Then(clientv3.OpPut(key, fmt.Sprint("cas-", round))).Commit()
			done <- result{r, err}
		}()
		time.Sleep(300 * time.Millisecond)
		cl.Resume(old)
		r := <-done
		if r.err == nil && !r.resp.Succeeded {
			t.Fatalf("round %d: the deposed leader answered a failed compare (mod_revision %d expected, the key's) at header %d from its stale state", round, mod, r.resp.Header.Revision)
		}
		t.Logf("round %d: CAS at mod %d through the deposed leader: err=%v succeeded=%v", round, mod, r.err, r.err == nil && r.resp.Succeeded)
		time.Sleep(2 * time.Second) // leaders settle (the balancer may move them back)
	}
}

// startProcCluster starts n brainnode processes (a chaos.Cluster, built
// with -race) with the concurrency tests' split points. When the test ends
// they are killed; if it failed, their logs are kept as artifacts and
// their tails logged.
func startProcCluster(t *testing.T, n int) *chaos.Cluster {
	t.Helper()
	cl, err := chaos.NewCluster(brainnodeBinary(t), t.TempDir(), n, concSplits)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl.Stop()
		if !t.Failed() {
			return
		}
		for _, n := range cl.Nodes {
			b, _ := os.ReadFile(n.LogPath())
			if keep := testutil.ArtifactPath(t, n.Name+".log"); os.WriteFile(keep, b, 0o644) == nil {
				t.Logf("%s log: %s", n.Name, keep)
			}
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s log tail:\n%s", n.Name, b)
		}
	})
	for _, n := range cl.Nodes {
		if err := cl.Start(n); err != nil {
			t.Fatal(err)
		}
	}
	return cl
}
