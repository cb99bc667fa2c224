package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/brainkv/brain/chaos"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestRequireLeaderWatchesRideThroughRestarts is kube-apiserver's view of
// node restarts in kubeadm's layout: every node has a client of its own
// (one endpoint) with a watch opened as kube-apiserver opens them
// (clientv3.WithRequireLeader), while each node in turn is killed -9 and
// restarted, then stopped cleanly and restarted. etcd's client ends such
// a watch for good when the server answers "no leader"; etcd's member
// never does during another member's restart nor in its own first seconds
// (it serves clients only once it has a leader). No watch may end, and
// each must deliver every acknowledged write in order.
//
// Without the readiness gate a restarted node took the client's resumed
// watch before it knew its meta leader and refused it with "no leader" in
// nearly every restart.
func TestRequireLeaderWatchesRideThroughRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes; skipped with -short")
	}
	cl := startProcCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := cl.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	newClient := func(eps ...string) *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	writer := newClient(cl.Endpoints()...)
	start, err := writer.Put(ctx, "/registry/pods/start", "0")
	if err != nil {
		t.Fatal(err)
	}
	from := start.Header.Revision + 1

	// One require-leader watch per node, through that node alone.
	type watchLog struct {
		node string
		c    *clientv3.Client
		mu   sync.Mutex
		revs []int64 // event revisions, in delivery order
		last int64   // highest revision covered (events and progress)
		err  error   // why the watch ended, if it did
	}
	wctx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	var logs []*watchLog
	var wwg sync.WaitGroup
	for _, n := range cl.Nodes {
		wl := &watchLog{node: n.Name, c: newClient(n.Endpoint())}
		logs = append(logs, wl)
		wch := wl.c.Watch(clientv3.WithRequireLeader(wctx), "/registry/", clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithProgressNotify())
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			for wr := range wch {
				wl.mu.Lock()
				if err := wr.Err(); err != nil {
					wl.err = err
					wl.mu.Unlock()
					return
				}
				for _, ev := range wr.Events {
					wl.revs = append(wl.revs, ev.Kv.ModRevision)
					wl.last = max(wl.last, ev.Kv.ModRevision)
				}
				if wr.IsProgressNotify() {
					wl.last = max(wl.last, wr.Header.Revision)
				}
				wl.mu.Unlock()
			}
		}()
	}

	// A steady write load through every node, recording what was acked.
	var acked sync.Map // revision -> key
	stop := make(chan struct{})
	var lwg sync.WaitGroup
	for w := 0; w < 3; w++ {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("/registry/pods/w%d-%d", w, i%40)
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				resp, err := writer.Put(pctx, key, fmt.Sprint(i))
				pcancel()
				if err == nil {
					acked.Store(resp.Header.Revision, key)
				} else {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}

	ended := func() error {
		for _, wl := range logs {
			wl.mu.Lock()
			err := wl.err
			wl.mu.Unlock()
			if err != nil {
				return fmt.Errorf("the watch through %s ended: %w", wl.node, err)
			}
		}
		return nil
	}
	restart := func(n *chaos.Node, how string) {
		t.Helper()
		switch how {
		case "kill":
			cl.Kill(n)
		default:
			cl.Terminate(n)
		}
		time.Sleep(time.Second)
		began := time.Now()
		if err := cl.Start(n); err != nil {
			t.Fatal(err)
		}
		if err := cl.WaitHealthy(ctx, n); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s restarted, healthy after %v", how, n.Name, time.Since(began).Round(time.Millisecond))
		time.Sleep(time.Second) // its clients resume their watches
		if err := ended(); err != nil {
			t.Fatalf("after the %s of %s: %v", how, n.Name, err)
		}
	}
	for _, how := range []string{"kill", "stop"} {
		for _, n := range cl.Nodes {
			restart(n, how)
		}
	}
	close(stop)
	lwg.Wait()
	final, err := writer.Get(ctx, "/registry/pods/start")
	if err != nil {
		t.Fatal(err)
	}
	target := final.Header.Revision
	// Every watch must cover the final revision: ask for progress until
	// it does.
	for _, wl := range logs {
		for {
			wl.mu.Lock()
			last, err := wl.last, wl.err
			wl.mu.Unlock()
			if err != nil {
				t.Fatalf("the watch through %s ended: %v", wl.node, err)
			}
			if last >= target {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("the watch through %s covers %d, the store is at %d", wl.node, last, target)
			}
			_ = wl.c.RequestProgress(clientv3.WithRequireLeader(wctx))
			time.Sleep(50 * time.Millisecond)
		}
	}
	stopWatches()
	wwg.Wait()

	var want []int64
	acked.Range(func(k, _ any) bool {
		if r := k.(int64); r >= from && r <= target {
			want = append(want, r)
		}
		return true
	})
	for _, wl := range logs {
		seen := make(map[int64]bool, len(wl.revs))
		prev := int64(0)
		for _, r := range wl.revs {
			if r <= prev {
				t.Errorf("the watch through %s delivered revision %d after %d", wl.node, r, prev)
				break
			}
			prev = r
			seen[r] = true
		}
		missing := 0
		for _, r := range want {
			if !seen[r] {
				missing++
			}
		}
		if missing > 0 {
			t.Errorf("the watch through %s missed %d of %d acknowledged writes", wl.node, missing, len(want))
		}
		t.Logf("the watch through %s delivered %d events up to revision %d", wl.node, len(wl.revs), prev)
	}
	if len(want) < 100 {
		t.Errorf("only %d writes were acknowledged", len(want))
	}
}
