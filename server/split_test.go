package server_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/server"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// splitWrite is an acknowledged put.
type splitWrite struct {
	key, value string
	rev        int64
}

// splitLoad writes through clients until stop, recording acknowledged
// puts, puts that failed with an error etcd clients retry (Unavailable:
// leader changed, no leader; their outcome is unknown) and any other
// error.
type splitLoad struct {
	mu     sync.Mutex
	acked  []splitWrite
	errs   []error         // errors a client would not retry
	failed map[string]bool // keys of puts whose outcome is unknown
}

func (l *splitLoad) run(ctx context.Context, c *clientv3.Client, writer int, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	r := rand.New(rand.NewPCG(uint64(writer), 7))
	for i := 0; i < 5000; i++ {
		select {
		case <-stop:
			return
		default:
		}
		key := fmt.Sprintf("/registry/pods/k%03d", r.IntN(1000))
		value := fmt.Sprintf("w%d-%d", writer, i)
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		resp, err := c.Put(wctx, key, value)
		cancel()
		l.mu.Lock()
		if err != nil {
			if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
				l.errs = append(l.errs, fmt.Errorf("put %s: %w", key, err))
			}
			l.failed[key] = true
		} else {
			l.acked = append(l.acked, splitWrite{key, value, resp.Header.Revision})
		}
		l.mu.Unlock()
	}
}

// watchAll collects the events of a watch of the pods prefix from rev on
// until it has seen revision upto.
func watchAll(t *testing.T, c *clientv3.Client, from, upto int64) []*clientv3.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var evs []*clientv3.Event
	wc := c.Watch(clientv3.WithRequireLeader(ctx), "/registry/pods/", clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV(), clientv3.WithProgressNotify())
	for {
		wr, ok := <-wc
		if !ok {
			break
		}
		if err := wr.Err(); err != nil {
			// Never "no leader", also right after a restart: a node
			// serves clients only once it knows a leader, and cancels a
			// require-leader watch only after 3 election timeouts
			// without one.
			t.Fatalf("watch from %d: %v", from, err)
		}
		evs = append(evs, wr.Events...)
		if wr.Header.Revision >= upto && (len(evs) > 0 && evs[len(evs)-1].Kv.ModRevision >= upto || wr.IsProgressNotify()) {
			return evs
		}
		if len(wr.Events) == 0 || evs[len(evs)-1].Kv.ModRevision < upto {
			_ = c.RequestProgress(ctx)
		}
		if len(evs) > 0 && evs[len(evs)-1].Kv.ModRevision >= upto {
			return evs
		}
	}
	t.Fatalf("watch from %d ended before revision %d (got %d events)", from, upto, len(evs))
	return nil
}

// checkSplitHistory checks a watch's events against the acknowledged puts:
// revisions strictly increase, every acknowledged put appears once at its
// revision with its value and the previous value as prev_kv, and nothing
// else appears but puts whose outcome is unknown.
func checkSplitHistory(t *testing.T, name string, evs []*clientv3.Event, l *splitLoad, from, upto int64) {
	t.Helper()
	byRev := map[int64]splitWrite{}
	for _, w := range l.acked {
		if w.rev >= from && w.rev <= upto {
			byRev[w.rev] = w
		}
	}
	last := map[string]string{}
	var prevRev int64
	seen := 0
	for _, ev := range evs {
		rev := ev.Kv.ModRevision
		if rev > upto {
			break
		}
		if rev <= prevRev {
			t.Fatalf("%s: event at revision %d after revision %d (order or duplicate)", name, rev, prevRev)
		}
		prevRev = rev
		if ev.Type != mvccpb.PUT {
			t.Fatalf("%s: unexpected %v event at %d", name, ev.Type, rev)
		}
		w, ok := byRev[rev]
		if !ok {
			if !l.failed[string(ev.Kv.Key)] {
				t.Fatalf("%s: event %s=%s at %d matches no acknowledged put", name, ev.Kv.Key, ev.Kv.Value, rev)
			}
		} else {
			seen++
			if string(ev.Kv.Key) != w.key || string(ev.Kv.Value) != w.value {
				t.Fatalf("%s: event at %d is %s=%s, acknowledged put was %s=%s", name, rev, ev.Kv.Key, ev.Kv.Value, w.key, w.value)
			}
		}
		if p, ok := last[string(ev.Kv.Key)]; ok {
			if ev.PrevKv == nil || string(ev.PrevKv.Value) != p {
				// The event's version tells an evaluation that found no
				// previous version (1) from a lost prev_kv (the nodes' logs
				// then show why).
				t.Fatalf("%s: event %s at %d (version %d, created at %d) has prev_kv %v, want value %q", name, ev.Kv.Key, rev, ev.Kv.Version, ev.Kv.CreateRevision, ev.PrevKv, p)
			}
		}
		last[string(ev.Kv.Key)] = string(ev.Kv.Value)
	}
	if seen != len(byRev) {
		var missing []int64
		got := map[int64]bool{}
		for _, ev := range evs {
			got[ev.Kv.ModRevision] = true
		}
		for r := range byRev {
			if !got[r] {
				missing = append(missing, r)
			}
		}
		sort.Slice(missing, func(i, j int) bool { return missing[i] < missing[j] })
		t.Fatalf("%s: watch delivered %d of the %d acknowledged puts in [%d, %d]; missing revisions %v", name, seen, len(byRev), from, upto, missing[:min(len(missing), 20)])
	}
}

// testSplitUnderLoad splits partitions of a cluster (nodes[0] coordinates)
// while writers and watchers run through every node, then checks the
// watches, a watch replaying the whole history after the splits, and the
// final state against the acknowledged writes.
//
// Then it restarts the cluster (restart) and checks that the map and
// the data survive, and that watches replaying the history - now from the
// event logs, the in-memory history being gone - still see every write.
func testSplitUnderLoad(t *testing.T, c *testutil.Cluster) {
	ctx := context.Background()
	nodes, endpoints := c.Nodes, c.Endpoints()
	clients := make([]*clientv3.Client, len(endpoints))
	for i, ep := range endpoints {
		clients[i] = testutil.Client(t, ep)
	}
	start, err := clients[0].Get(ctx, "/registry/pods/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	from := start.Header.Revision + 1
	initialParts := len(nodes[0].Store().Routes())
	load := &splitLoad{failed: map[string]bool{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go load.run(ctx, clients[w%len(clients)], w, stop, &wg)
	}
	// Live watches from before the splits, on every node.
	type live struct {
		wc  clientv3.WatchChan
		mu  sync.Mutex
		evs []*clientv3.Event // protected by mu
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	lives := make([]*live, len(clients))
	for i, c := range clients {
		lives[i] = &live{wc: c.Watch(wctx, "/registry/pods/", clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithPrevKV())}
	}
	var lwg sync.WaitGroup
	for _, lv := range lives {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			for wr := range lv.wc {
				lv.mu.Lock()
				lv.evs = append(lv.evs, wr.Events...)
				lv.mu.Unlock()
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	// Splits: two of the initial partition, then one of a child.
	var children []uint64
	for _, key := range []string{"/registry/pods/k500", "/registry/pods/k250", "/registry/pods/k750"} {
		began := time.Now()
		parent, child, err := nodes[0].Split(ctx, []byte(key))
		if err != nil {
			t.Fatalf("split at %s: %v", key, err)
		}
		t.Logf("split partition %d at %s: new partition %d (%v)", parent, key, child, time.Since(began).Round(time.Millisecond))
		children = append(children, child)
		time.Sleep(300 * time.Millisecond)
	}
	if _, _, err := nodes[0].Split(ctx, []byte("/registry/pods/k500")); err == nil {
		t.Fatalf("split at an existing partition boundary succeeded")
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	load.mu.Lock()
	defer load.mu.Unlock()
	for _, err := range load.errs {
		t.Errorf("write error: %v", err)
	}
	t.Logf("%d writes acknowledged, %d of unknown outcome", len(load.acked), len(load.failed))
	if len(load.acked) < 50 {
		t.Fatalf("only %d writes acknowledged", len(load.acked))
	}
	end, err := clients[0].Get(ctx, "/registry/pods/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	upto := end.Header.Revision
	// The final state is the last acknowledged write of each key.
	want := map[string]splitWrite{}
	for _, w := range load.acked {
		if w.rev > want[w.key].rev {
			want[w.key] = w
		}
	}
	got := map[string]string{}
	for _, kv := range end.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	for k, w := range want {
		if got[k] != w.value && !load.failed[k] {
			t.Fatalf("after splits %s = %q, last acknowledged put wrote %q", k, got[k], w.value)
		}
	}
	if len(got) < len(want) {
		t.Fatalf("after splits %d keys, %d were written", len(got), len(want))
	}
	// Every node routes by the new map.
	for i, n := range nodes {
		deadline := time.Now().Add(10 * time.Second)
		for len(n.Store().Routes()) != initialParts+len(children) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := len(n.Store().Routes()); got != initialParts+len(children) {
			t.Fatalf("node %d routes by %d partitions, want %d", i, got, initialParts+len(children))
		}
	}
	// Live watches saw everything, once, in order.
	for _, c := range clients {
		_ = c.RequestProgress(ctx)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, lv := range lives {
		for {
			lv.mu.Lock()
			n := len(lv.evs)
			done := n > 0 && lv.evs[n-1].Kv.ModRevision >= maxAcked(load.acked)
			lv.mu.Unlock()
			if done || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wcancel()
	lwg.Wait()
	for i, lv := range lives {
		checkSplitHistory(t, fmt.Sprintf("live watch on node %d", i), lv.evs, load, from, upto)
	}
	// A watch from before the splits, started after them, replays the
	// history.
	for i, c := range clients {
		evs := watchAll(t, c, from, maxAcked(load.acked))
		checkSplitHistory(t, fmt.Sprintf("replaying watch on node %d", i), evs, load, from, maxAcked(load.acked))
	}
	for i := range nodes {
		c.Stop(i)
	}
	for i := range nodes {
		c.Start(i)
	}
	for i, n := range c.Nodes {
		if got := len(n.Store().Routes()); got != initialParts+len(children) {
			t.Fatalf("node %d routes by %d partitions after a restart, want %d", i, got, initialParts+len(children))
		}
	}
	for i, cl := range clients {
		var kvs []*mvccpb.KeyValue
		deadline := time.Now().Add(20 * time.Second)
		for {
			// A bounded try: a read that waits (say, for a close the
			// restarted cluster lost) fails here instead of hanging.
			gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := cl.Get(gctx, "/registry/pods/", clientv3.WithPrefix())
			gcancel()
			if err == nil {
				kvs = resp.Kvs
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("get after restart on node %d: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if len(kvs) != len(end.Kvs) {
			t.Fatalf("node %d: %d keys after a restart, %d before", i, len(kvs), len(end.Kvs))
		}
		for j, kv := range kvs {
			if string(kv.Value) != string(end.Kvs[j].Value) || kv.ModRevision != end.Kvs[j].ModRevision {
				t.Fatalf("node %d after a restart: %s=%s@%d, before %s=%s@%d", i, kv.Key, kv.Value, kv.ModRevision, end.Kvs[j].Key, end.Kvs[j].Value, end.Kvs[j].ModRevision)
			}
		}
		// The in-memory history is gone: this replays the event logs.
		evs := watchAll(t, cl, from, maxAcked(load.acked))
		checkSplitHistory(t, fmt.Sprintf("replaying watch on node %d after a restart", i), evs, load, from, maxAcked(load.acked))
	}
}

func maxAcked(ws []splitWrite) int64 {
	var m int64
	for _, w := range ws {
		m = max(m, w.rev)
	}
	return m
}

func TestOnlineSplitUnderLoad(t *testing.T) {
	testSplitUnderLoad(t, testutil.StartCluster(t, 1, server.Config{}))
}

func TestOnlineSplitUnderLoadCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	testSplitUnderLoad(t, testutil.StartCluster(t, 3, server.Config{}))
}

// TestAutomaticSplits: a partition over --split-keys splits at its middle
// key, and one taking more than --split-write-rate splits where the
// writes go; the writes and a watch through the splits stay exact.
func TestAutomaticSplits(t *testing.T) {
	t.Run("size", func(t *testing.T) {
		testAutomaticSplits(t, server.Config{SplitKeys: 300, SplitWindow: 300 * time.Millisecond}, "size")
	})
	t.Run("load", func(t *testing.T) {
		testAutomaticSplits(t, server.Config{SplitKeys: -1, SplitWriteRate: 50, SplitWindow: 300 * time.Millisecond}, "load")
	})
}

func testAutomaticSplits(t *testing.T, cfg server.Config, reason string) {
	cfg.InitialSplitPoints = []string{"/registry/pods/"}
	c := testutil.StartCluster(t, 1, cfg)
	n := c.Nodes[0]
	cl := testutil.Client(t, c.Endpoint(0))
	ctx := context.Background()
	start, err := cl.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	from := start.Header.Revision + 1
	initial := len(n.Store().Routes())
	load := &splitLoad{failed: map[string]bool{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go load.run(ctx, cl, w, stop, &wg)
	}
	splits := func() float64 {
		mfs, err := n.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, mf := range mfs {
			if mf.GetName() != "brain_partition_splits_total" {
				continue
			}
			for _, m := range mf.Metric {
				for _, l := range m.Label {
					if l.GetName() == "reason" {
						if l.GetValue() != reason {
							t.Fatalf("a split by %s, want only by %s", l.GetValue(), reason)
						}
						sum += m.GetCounter().GetValue()
					}
				}
			}
		}
		return sum
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(n.Store().Routes()) < initial+2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	routes := n.Store().Routes()
	if len(routes) < initial+2 || splits() < 2 {
		t.Fatalf("%d partitions (%v splits by %s) after writing, want at least %d", len(routes), splits(), reason, initial+2)
	}
	inPods := 0
	for _, rt := range routes {
		if string(rt.Start) >= "/registry/pods/" {
			inPods++
		}
	}
	if inPods < 3 {
		t.Fatalf("the written range /registry/pods/ spans %d partitions, want it split", inPods)
	}
	for _, err := range load.errs {
		t.Errorf("write error: %v", err)
	}
	upto := maxAcked(load.acked)
	evs := watchAll(t, cl, from, upto)
	checkSplitHistory(t, "watch through automatic splits", evs, load, from, upto)
	t.Logf("%d partitions, %d writes", len(routes), len(load.acked))
}

// TestSplitsSpreadOverNodes: the partitions split off a hot range get
// their own placement - the rebalancer moves their replicas and the
// leader balancer their leaderships - so the range's writes spread over
// the nodes of a cluster larger than the replication factor. A split
// places its new partition where split partitions are fewest
// (childPlacement), so the range's 4 partitions end up led by all 4
// nodes (with IDs in sequence two of them preferred the same node).
func TestSplitsSpreadOverNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 4-node cluster")
	}
	c := testutil.StartCluster(t, 4, server.Config{InitialSplitPoints: []string{"/registry/pods/"}, RebalanceInterval: time.Second})
	ctx := context.Background()
	cl := testutil.Client(t, c.Endpoint(0))
	waitForPut(t, cl, "/registry/pods/a")
	for _, k := range []string{"/registry/pods/b", "/registry/pods/c", "/registry/pods/d"} {
		if _, _, err := c.Nodes[0].Split(ctx, []byte(k)); err != nil {
			t.Fatalf("split at %s: %v", k, err)
		}
	}
	// Where each pods partition's leader and voters are.
	placement := func() (leaders map[uint64]bool, voterSets map[string]bool, ok bool) {
		leaders, voterSets = map[uint64]bool{}, map[string]bool{}
		for _, rt := range c.Nodes[0].Store().Routes() {
			if string(rt.Start) < "/registry/pods/" {
				continue
			}
			lead, voters := leaderVoters(c, rt.ID)
			if lead == 0 {
				return nil, nil, false
			}
			leaders[lead] = true
			voterSets[fmt.Sprint(voters)] = true
		}
		return leaders, voterSets, true
	}
	sawOff := false
	deadline := time.Now().Add(90 * time.Second)
	for {
		sawOff = sawOff || offPlacement(t, c) > 0
		leaders, sets, ok := placement()
		if ok && len(leaders) == len(c.Nodes) && len(sets) >= 2 && offPlacement(t, c) == 0 {
			t.Logf("pods partitions led by %d nodes, on %d replica sets", len(leaders), len(sets))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90s the 4 pods partitions are led by %d nodes, on %d replica sets, %v off their placement: want 4 leaders, >= 2 sets, none off", len(leaders), len(sets), offPlacement(t, c))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !sawOff {
		t.Error("brain_partitions_off_placement never counted a split partition whose replicas had to move")
	}
	// Every partition serves, through every node.
	for i := range c.Nodes {
		ci := testutil.Client(t, c.Endpoint(i))
		for _, k := range []string{"a", "b", "c", "d"} {
			key := "/registry/pods/" + k
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			_, err := ci.Put(wctx, key, fmt.Sprint(i))
			cancel()
			if err != nil {
				t.Fatalf("put %s through node %d: %v", key, i, err)
			}
		}
	}
	g, err := cl.Get(ctx, "/registry/pods/", clientv3.WithPrefix())
	if err != nil || g.Count != 4 {
		t.Fatalf("pods after the moves: %v %v", g, err)
	}
	for _, kv := range g.Kvs {
		if string(kv.Value) != fmt.Sprint(len(c.Nodes)-1) {
			t.Fatalf("%s = %s, want the last write's %d", kv.Key, kv.Value, len(c.Nodes)-1)
		}
	}
}

// TestLargeSplitKeepsItsVoters: a partition holding more than
// Config.TestingLocalSplitKeys keys (here 100) that splits by size gives its new half
// an ID placed on the parent's voters, so none of the half's replicas
// moves. Placed by the counts of split partitions per node instead, the
// half of a 6-node cluster's partition goes to the other copyset
// (TestChildRanksKeepParentVoters), one replica at a time, each a
// snapshot of its whole state: in the one-prefix benchmark that took
// 20 s for 10000-key halves and halved the cluster's rate.
func TestLargeSplitKeepsItsVoters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 6-node cluster")
	}
	c := testutil.StartCluster(t, 6, server.Config{SplitKeys: 300, SplitWindow: 300 * time.Millisecond, TestingLocalSplitKeys: 100,
		RebalanceInterval: 500 * time.Millisecond, InitialSplitPoints: []string{"/registry/pods/"}})
	ctx := context.Background()
	cl := testutil.Client(t, c.Endpoint(0))
	waitForPut(t, cl, "/registry/pods/0000")
	pods := func() []kvapi.Route {
		var rts []kvapi.Route
		for _, rt := range c.Nodes[0].Store().Routes() {
			if string(rt.Start) >= "/registry/pods/" {
				rts = append(rts, rt)
			}
		}
		return rts
	}
	voters := func(id uint64) []uint64 {
		_, v := leaderVoters(c, id)
		return v
	}
	parent := pods()[0].ID
	var parentVoters []uint64
	for deadline := time.Now().Add(20 * time.Second); parentVoters == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no leader of partition %d", parent)
		}
		parentVoters = voters(parent)
	}
	for i := 1; i <= 320; i++ {
		if _, err := cl.Put(ctx, fmt.Sprintf("/registry/pods/%04d", i), "v"); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	// bySize counts splits by size on every node (the split's is the
	// parent's leader, whichever node that was).
	bySize := func() (sum float64) {
		for _, n := range c.Nodes {
			sum += counterValue(t, n, "brain_partition_splits_total", "size")
		}
		return sum
	}
	var child uint64
	for deadline := time.Now().Add(20 * time.Second); child == 0 || bySize() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("partition %d (321 keys, --split-keys 300) did not split by size: %d pods partitions", parent, len(pods()))
		}
		for _, rt := range pods() {
			if rt.ID != parent {
				child = rt.ID
			}
		}
	}
	// Ten rebalance intervals: a half placed elsewhere is off its
	// placement from the first, and its voters change with each move.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if off := offPlacement(t, c); off > 0 {
			t.Fatalf("%v partitions off their placement after partition %d split into %d: want the half placed on its parent's voters %v", off, parent, child, parentVoters)
		}
		if v := voters(child); v != nil && !slices.Equal(v, parentVoters) {
			t.Fatalf("partition %d, split off %d, has voters %v: want its parent's %v", child, parent, v, parentVoters)
		}
	}
	if v := voters(child); !slices.Equal(v, parentVoters) {
		t.Fatalf("partition %d, split off %d, has voters %v: want its parent's %v", child, parent, v, parentVoters)
	}
	if n := bySize(); n != 1 || len(pods()) != 2 {
		t.Fatalf("%v splits by size into %d pods partitions: want partition %d's one, into 2", n, len(pods()), parent)
	}
	g, err := cl.Get(ctx, "/registry/pods/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || g.Count != 321 {
		t.Fatalf("pods after the split: %v keys, %v: want 321", g.Count, err)
	}
	t.Logf("partition %d split into %d, both on %v", parent, child, parentVoters)
}

// leaderVoters returns the node that leads partition id (the first that
// claims it) and its voters, sorted, as that node sees them; 0 and nil
// while no node leads it.
func leaderVoters(c *testutil.Cluster, id uint64) (leader uint64, voters []uint64) {
	for _, n := range c.Nodes {
		if st, ok := n.GroupStatus(id); ok && st.IsLeader {
			voters = slices.Clone(st.Voters)
			slices.Sort(voters)
			return n.MemberID(), voters
		}
	}
	return 0, nil
}

// offPlacement sums brain_partitions_off_placement over c's nodes: on
// each leader, the partitions whose replicas still have to move.
func offPlacement(t *testing.T, c *testutil.Cluster) float64 {
	var sum float64
	for _, n := range c.Nodes {
		sum += gaugeValue(t, n, "brain_partitions_off_placement")
	}
	return sum
}

// TestSplitForBalance: a node leading two partitions as busy as the one
// each other node leads has twice their load, and no move of a whole
// partition evens that out (it would only swap the imbalance). The node
// splits one of its partitions for balance, and the leader balancer moves
// a half: no node keeps more than 44% of the load (two partitions' worth
// out of four was 50%). No write fails, and every key reads back its last
// acknowledged value.
func TestSplitForBalance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster and writes for up to a minute")
	}
	const rate = 25 // writes/s to each loaded partition: under --split-write-rate 40
	c := testutil.StartCluster(t, 3, server.Config{SplitKeys: -1, SplitWriteRate: 40, SplitWindow: 2 * time.Second, LeaderBalanceInterval: time.Second,
		InitialSplitPoints: []string{"/registry/a/", "/registry/b/", "/registry/c/", "/registry/d/", "/registry/e/", "/registry/f/"}})
	ctx := context.Background()
	cl := testutil.Client(t, c.Endpoint(0))
	waitForPut(t, cl, "/registry/pods/a")
	// Two partitions led by one node, one by each other node.
	leaderOf := func(id uint64) int {
		for i, n := range c.Nodes {
			if st, ok := n.GroupStatus(id); ok && st.IsLeader {
				return i
			}
		}
		return -1
	}
	// The leader balancer spreads the leaderships over the nodes once they
	// all serve.
	var loaded []kvapi.Route
	for deadline := time.Now().Add(30 * time.Second); len(loaded) < 4; time.Sleep(200 * time.Millisecond) {
		byNode := map[int][]kvapi.Route{}
		for _, rt := range c.Nodes[0].Store().Routes() {
			if len(rt.Start) == 0 {
				continue // no key of ours sorts into the first range
			}
			if i := leaderOf(rt.ID); i >= 0 {
				byNode[i] = append(byNode[i], rt)
			}
		}
		busy := 0
		for i := range c.Nodes {
			if len(byNode[i]) > len(byNode[busy]) {
				busy = i
			}
		}
		loaded = nil
		for i := range c.Nodes {
			want := 1
			if i == busy {
				want = 2
			}
			if len(byNode[i]) < want {
				if time.Now().After(deadline) {
					t.Fatalf("node %d leads %d partitions (%v), want %d", i, len(byNode[i]), byNode, want)
				}
				loaded = nil
				break
			}
			loaded = append(loaded, byNode[i][:want]...)
		}
	}
	load := startRateLoad(ctx, t, cl, loaded, rate)
	// The share of the leader load of the busiest node, once every node
	// measured some: the load the balancer evens out, which on the TSO
	// leader counts the TSO requests it answers (tsoLoad; at this rate
	// nearly every write is a request of its own).
	busiest := func() (share, sum float64) {
		var most float64
		for _, n := range c.Nodes {
			l := gaugeValue(t, n, "brain_leader_load")
			sum += l
			most = max(most, l)
		}
		return most / sum, sum
	}
	balanceSplits := func() (sum float64) {
		for _, n := range c.Nodes {
			sum += counterValue(t, n, "brain_partition_splits_total", "balance")
		}
		return sum
	}
	// Balanced in two windows in a row (the gauges change once a window).
	var share, sum float64
	balanced := 0
	deadline := time.Now().Add(60 * time.Second)
	for {
		share, sum = busiest()
		if balanceSplits() > 0 && sum > 2*rate && share < 0.44 {
			balanced++
		} else {
			balanced = 0
		}
		if balanced > 25 {
			break
		}
		if time.Now().After(deadline) {
			load.stop()
			t.Fatalf("after 60s: %v splits for balance, the busiest node takes %.0f%% of %.0f writes/s", balanceSplits(), 100*share, sum)
		}
		time.Sleep(100 * time.Millisecond)
	}
	load.stop()
	t.Logf("%v splits for balance; the busiest node takes %.0f%% of %.0f writes/s", balanceSplits(), 100*share, sum)
	load.check(ctx)
}

// rateLoad writes random keys of some partitions, each at a fixed rate,
// until stopped, recording every acknowledged write.
type rateLoad struct {
	t     *testing.T
	cl    *clientv3.Client
	from  int64 // the first revision the load can have written
	done  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	last  map[string]string
	acked map[int64]string // revision -> key=value
	errs  []error
}

// startRateLoad starts writing rate puts/s through cl to each of routes,
// at random keys among 100 of its range (so a split at the middle of a
// window's writes halves the rate).
func startRateLoad(ctx context.Context, t *testing.T, cl *clientv3.Client, routes []kvapi.Route, rate int) *rateLoad {
	t.Helper()
	keyOf := func(rt kvapi.Route, k int) string {
		key := fmt.Sprintf("%s\x00k%03d", rt.Start, k)
		if len(rt.End) > 0 && key >= string(rt.End) {
			t.Fatalf("key %q is not in [%q, %q)", key, rt.Start, rt.End)
		}
		return key
	}
	begin, err := cl.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	l := &rateLoad{t: t, cl: cl, from: begin.Header.Revision + 1, done: make(chan struct{}), last: map[string]string{}, acked: map[int64]string{}}
	for w, rt := range routes {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			tick := time.NewTicker(time.Second / time.Duration(rate))
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-l.done:
					return
				case <-tick.C:
				}
				key, val := keyOf(rt, rand.IntN(100)), fmt.Sprintf("w%d-%d", w, n)
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err := cl.Put(wctx, key, val)
				cancel()
				l.mu.Lock()
				if err != nil {
					l.errs = append(l.errs, fmt.Errorf("put %q: %w", key, err))
				} else {
					l.last[key] = val
					l.acked[resp.Header.Revision] = key + "=" + val
				}
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// stop stops the writers and waits for them.
func (l *rateLoad) stop() {
	close(l.done)
	l.wg.Wait()
}

// check requires (after stop) that no write failed, that every key
// written reads back its last acknowledged value, and that a watch from
// before the writes, across the splits and moves since, sees every
// acknowledged write once, at its revision, in revision order, and
// nothing else.
func (l *rateLoad) check(ctx context.Context) {
	t, cl := l.t, l.cl
	t.Helper()
	for _, err := range l.errs {
		t.Error(err)
	}
	for key, val := range l.last {
		resp, err := cl.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != val {
			t.Errorf("%q reads %v, want %q", key, resp.Kvs, val)
		}
	}
	var upto int64
	for rev := range l.acked {
		upto = max(upto, rev)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	seen, prev := 0, int64(0)
	for wr := range cl.Watch(clientv3.WithRequireLeader(wctx), "/registry/", clientv3.WithPrefix(), clientv3.WithRev(l.from)) {
		if err := wr.Err(); err != nil {
			t.Fatalf("watch from %d: %v", l.from, err)
		}
		for _, ev := range wr.Events {
			rev := ev.Kv.ModRevision
			if rev <= prev {
				t.Fatalf("watch: revision %d after %d", rev, prev)
			}
			prev = rev
			if got, want := string(ev.Kv.Key)+"="+string(ev.Kv.Value), l.acked[rev]; got != want {
				t.Fatalf("watch: %s at revision %d, acknowledged there: %q", got, rev, want)
			}
			seen++
		}
		if prev >= upto {
			break
		}
	}
	if seen != len(l.acked) {
		t.Fatalf("watch saw %d of the %d acknowledged writes (up to revision %d, last seen %d)", seen, len(l.acked), upto, prev)
	}
}

// TestSplitAcrossPlacements: on 6 nodes (two copysets), three partitions
// of one copyset, one led by each of its nodes, take writes and the
// other copyset's partitions none. No leadership move or split within
// the voters can spread that load, since every voter is as busy. The
// busiest node splits across placements: the new half is placed on the
// other copyset, its replicas move there and its leadership to the
// target, until a node of the other copyset leads some of the load. No
// write fails, every key reads back its last acknowledged value, and a
// watch from before the writes sees each of them once, in order.
func TestSplitAcrossPlacements(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 6-node cluster and writes for up to 150 s")
	}
	const rate = 25 // writes/s to each loaded partition: under --split-write-rate 40
	var points []string
	for c := 'a'; c <= 'l'; c++ {
		points = append(points, "/registry/"+string(c)+"/")
	}
	c := testutil.StartCluster(t, 6, server.Config{SplitKeys: -1, SplitWriteRate: 40, SplitWindow: 2 * time.Second,
		LeaderBalanceInterval: time.Second, RebalanceInterval: time.Second, InitialSplitPoints: points})
	ctx := context.Background()
	cl := testutil.Client(t, c.Endpoint(0))
	waitForPut(t, cl, "/registry/a/x")
	// One partition led by each node of one copyset (the voters of the
	// partitions they lead are the same three nodes), once the leader
	// balancer spread the leaderships.
	var loaded []kvapi.Route
	var copyset []uint64
	for deadline := time.Now().Add(30 * time.Second); len(loaded) < 3; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no copyset has a partition led by each of its nodes")
		}
		byVoters := map[string]map[uint64]kvapi.Route{} // voters -> leader -> a partition
		sets := map[string][]uint64{}
		for _, rt := range c.Nodes[0].Store().Routes() {
			if len(rt.Start) == 0 {
				continue // no key of ours sorts into the first range
			}
			for _, n := range c.Nodes {
				st, ok := n.GroupStatus(rt.ID)
				if !ok || !st.IsLeader || len(st.Voters) != 3 {
					continue
				}
				voters := append([]uint64(nil), st.Voters...)
				sort.Slice(voters, func(i, j int) bool { return voters[i] < voters[j] })
				k := fmt.Sprint(voters)
				if byVoters[k] == nil {
					byVoters[k], sets[k] = map[uint64]kvapi.Route{}, voters
				}
				byVoters[k][n.MemberID()] = rt
			}
		}
		for k, leaders := range byVoters {
			// Three nodes, each leading its own partition: two nodes can
			// both claim one partition while its leadership moves (the
			// old leader has not heard of the new term yet), and loading
			// it twice made it split by load instead of across
			// placements.
			distinct := map[uint64]bool{}
			for _, rt := range leaders {
				distinct[rt.ID] = true
			}
			if len(leaders) == 3 && len(distinct) == 3 {
				loaded, copyset = nil, sets[k]
				for _, rt := range leaders {
					loaded = append(loaded, rt)
				}
				break
			}
		}
	}
	t.Logf("loading partitions %v of copyset %v", []uint64{loaded[0].ID, loaded[1].ID, loaded[2].ID}, copyset)
	load := startRateLoad(ctx, t, cl, loaded, rate)
	// A node outside the copyset leads a partition of the load (its rate
	// at least a quarter of one loaded partition's) in two checks a
	// window apart, after a split across placements.
	across := func() (sum float64) {
		for _, n := range c.Nodes {
			sum += counterValue(t, n, "brain_partition_splits_total", "across")
		}
		return sum
	}
	outside := func() (most float64) {
		for _, n := range c.Nodes {
			if !slices.Contains(copyset, n.MemberID()) {
				most = max(most, gaugeValue(t, n, "brain_leader_write_rate"))
			}
		}
		return most
	}
	seen := 0
	for deadline := time.Now().Add(150 * time.Second); seen < 2; time.Sleep(2 * time.Second) {
		a, o := across(), outside()
		if a > 0 && o >= rate/4 {
			seen++
		} else {
			seen = 0
		}
		if testing.Verbose() {
			t.Logf("%v splits across placements; the busiest node outside the copyset leads %.0f writes/s", a, o)
		}
		if time.Now().After(deadline) {
			load.stop()
			t.Fatalf("after 150s: %v splits across placements, the busiest node outside the copyset %v leads %.0f writes/s", a, copyset, o)
		}
	}
	load.stop()
	t.Logf("%v splits across placements; a node outside the loaded copyset leads %.0f writes/s", across(), outside())
	load.check(ctx)
}

// waitForPut puts key (value "1") through cl until a put succeeds: a
// cluster just started serves writes once its groups elected leaders.
// It fails the test after 30 s.
func waitForPut(t *testing.T, cl *clientv3.Client, key string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := cl.Put(context.Background(), key, "1")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("put %s: %v", key, err)
		}
	}
}
