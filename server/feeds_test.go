package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// feedsWanted reads the brain_watch_feeds_wanted gauge of a node.
func feedsWanted(t *testing.T, s *server.Server) float64 {
	t.Helper()
	return gaugeValue(t, s, "brain_watch_feeds_wanted")
}

// TestWatchAfterFeedsIdle: nodes without watchers stop their partition
// feeds (local and, on a 4-node cluster where no node has every partition,
// from other nodes); watches created afterwards - from a past revision
// before, during and after the idle time, and from now - get exactly the
// events of their range in revision order, with prev_kv, on every node.
func TestWatchAfterFeedsIdle(t *testing.T) {
	c, ctx, c1 := startServing(t, 4, server.Config{WatchFeedsIdleAfter: 300 * time.Millisecond}, 120*time.Second)
	var writes []write
	put := func(round int) { writes = putRound(t, ctx, c1, round, writes) }
	put(0)
	first := writes[0].rev
	for i, n := range c.Nodes {
		eventually(t, 10*time.Second, fmt.Sprintf("node %d idles its feeds", i+1), func() (bool, string) {
			v := feedsWanted(t, n)
			return v == 0, fmt.Sprint("brain_watch_feeds_wanted ", v)
		})
	}
	put(1) // while every node idles

	// A watch on each node: node 1 from now, the others from the first
	// write (their history spans before and during the idle time).
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	from := make([]int64, len(c.Nodes))
	chans := make([]clientv3.WatchChan, len(c.Nodes))
	for i := range c.Nodes {
		cl := c1
		if i > 0 {
			cl = testutil.Client(t, c.Endpoint(i))
			from[i] = first
		}
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithPrevKV()}
		if from[i] != 0 {
			opts = append(opts, clientv3.WithRev(from[i]))
		}
		chans[i] = watchCreated(t, wctx, cl, "", opts...)
	}
	nowFrom := len(writes)
	put(2)
	for i, n := range c.Nodes {
		if v := feedsWanted(t, n); v != 1 {
			t.Errorf("node %d: brain_watch_feeds_wanted %v with a watch open", i+1, v)
		}
	}

	for i, ch := range chans {
		want := writes
		if i == 0 {
			want = writes[nowFrom:]
		}
		prev := map[string]string{}
		for _, w := range writes[:len(writes)-len(want)] {
			prev[w.key] = w.val
		}
		expectEvents(t, fmt.Sprintf("node %d", i+1), ch, want, prev)
	}
	// Every node lacks partitions here, so events reached hubs through
	// other nodes' feeds, and the nodes that served them counted them.
	sent := 0.0
	for _, n := range c.Nodes {
		sent += counterValue(t, n, "brain_feed_messages_sent_total", "events")
	}
	if sent == 0 {
		t.Error("brain_feed_messages_sent_total{kind=\"events\"} is 0 on every node")
	}
}

// watchCreated opens a watch on key and waits for its created response.
// It is never refused with "no leader", also right after the nodes
// started: a node serves clients only once it knows a leader.
func watchCreated(t *testing.T, ctx context.Context, cl *clientv3.Client, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	t.Helper()
	opts = append(opts, clientv3.WithCreatedNotify())
	ch := cl.Watch(ctx, key, opts...)
	if wr := <-ch; !wr.Created {
		t.Fatalf("watch on %q not created: %v", key, wr.Err())
	}
	return ch
}

// write is a put and the revision it got.
type write struct {
	key, val string
	rev      int64
}

// putRound puts 10 keys under each of memberKeys (one partition each)
// with the value round, and appends them to writes.
func putRound(t *testing.T, ctx context.Context, cl *clientv3.Client, round int, writes []write) []write {
	t.Helper()
	for i := 0; i < 10; i++ {
		for _, k := range memberKeys {
			key, val := fmt.Sprintf("%s/%d", k, i), fmt.Sprint(round)
			start := time.Now()
			r, err := cl.Put(ctx, key, val)
			if err != nil {
				t.Fatalf("put %s (round %d) failed after %v: %v", key, round, time.Since(start).Round(time.Millisecond), err)
			}
			writes = append(writes, write{key, val, r.Header.Revision})
		}
	}
	return writes
}

// expectEvents reads ch until it delivered want, failing on any other
// event, a missing or wrong prev_kv (prev holds each key's value before
// want), or 20s without one.
func expectEvents(t *testing.T, what string, ch clientv3.WatchChan, want []write, prev map[string]string) {
	t.Helper()
	got := 0
	for got < len(want) {
		var wr clientv3.WatchResponse
		select {
		case wr = <-ch:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: %d of %d events, then nothing for 20s", what, got, len(want))
		}
		if err := wr.Err(); err != nil {
			t.Fatalf("%s: watch: %v", what, err)
		}
		for _, ev := range wr.Events {
			if got == len(want) {
				t.Fatalf("%s: unexpected event %q at %d", what, ev.Kv.Key, ev.Kv.ModRevision)
			}
			w := want[got]
			if string(ev.Kv.Key) != w.key || string(ev.Kv.Value) != w.val || ev.Kv.ModRevision != w.rev {
				t.Fatalf("%s: event %d is %q=%q at %d, want %q=%q at %d", what, got, ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision, w.key, w.val, w.rev)
			}
			if p, ok := prev[w.key]; ok != (ev.PrevKv != nil) || ok && string(ev.PrevKv.Value) != p {
				t.Fatalf("%s: event %d (%q at %d) prev_kv %v, want %q", what, got, w.key, w.rev, ev.PrevKv, p)
			}
			prev[w.key] = w.val
			got++
		}
	}
}

// TestWatchesOnSomeKeys: a node merges only the partitions its watches
// cover, and a watch opened later on others - from a revision before the
// node paused them, through the pause, to after - gets exactly the events
// of its range in revision order, as does one on every key; the first
// watch misses nothing meanwhile. Four nodes, so the node fetches some
// partitions from other nodes.
func TestWatchesOnSomeKeys(t *testing.T) {
	c, ctx, c1 := startServing(t, 4, server.Config{WatchFeedsIdleAfter: 300 * time.Millisecond}, 120*time.Second)
	n2 := c.Nodes[1]
	var writes []write
	writes = putRound(t, ctx, c1, 0, writes)
	first := writes[0].rev
	eventually(t, 10*time.Second, "node 2 idles its feeds", func() (bool, string) {
		v := feedsWanted(t, n2)
		return v == 0, fmt.Sprint("brain_watch_feeds_wanted ", v)
	})
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	cl := testutil.Client(t, c.Endpoint(1))
	// memberKeys "a", "d", "n", "u": one partition each.
	aFrom := len(writes)
	aWatch := watchCreated(t, wctx, cl, "a", clientv3.WithPrefix(), clientv3.WithPrevKV())
	writes = putRound(t, ctx, c1, 1, writes)
	if v := feedsWanted(t, n2); v != 1 {
		t.Errorf("brain_watch_feeds_wanted %v with a watch open", v)
	}
	if v := gaugeValue(t, n2, "brain_watch_feeds_paused"); v != 3 {
		t.Errorf("brain_watch_feeds_paused %v with a watch on one of four partitions, want 3", v)
	}
	nWatch := watchCreated(t, wctx, cl, "n", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(first))
	// From a revision the paused partition applied after the node had
	// resumed partition "a" (the ring's start then moved past round 0):
	// the ring, not the event logs, holds the other partitions' events
	// from there, but not the paused one's.
	pausedFrom := aFrom + 5*len(memberKeys) + 2 // "n/5" of round 1
	nPaused := watchCreated(t, wctx, cl, "n", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(writes[pausedFrom].rev))
	allWatch := watchCreated(t, wctx, cl, "", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(first))
	writes = putRound(t, ctx, c1, 2, writes)

	under := func(prefix string, ws []write) []write {
		var out []write
		for _, w := range ws {
			if strings.HasPrefix(w.key, prefix) {
				out = append(out, w)
			}
		}
		return out
	}
	prevOf := func(ws []write) map[string]string {
		prev := map[string]string{}
		for _, w := range ws {
			prev[w.key] = w.val
		}
		return prev
	}
	expectEvents(t, "watch on a from now", aWatch, under("a", writes[aFrom:]), prevOf(writes[:aFrom]))
	expectEvents(t, "watch on n from the first write", nWatch, under("n", writes), map[string]string{})
	expectEvents(t, "watch on n from a paused revision", nPaused, under("n", writes[pausedFrom:]), prevOf(writes[:pausedFrom]))
	expectEvents(t, "watch on everything from the first write", allWatch, writes, map[string]string{})
}

// gaugeValue reads a node's gauge (without labels).
func gaugeValue(t *testing.T, s *server.Server, name string) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s metric", name)
	return 0
}

// counterValue reads a node's counter with the given label value (any
// label name), 0 if it has none yet.
func counterValue(t *testing.T, s *server.Server, name, label string) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestWatchWithIdleLeaders: only node 1 watches, so the leaders of the
// partitions elsewhere (their nodes' feeds idle) close nothing by
// themselves, and node 1 must ask them (through its follower replicas and,
// for the partition it has no replica of on 4 nodes, through the remote
// feed's view): every write's event arrives, each within a bound far
// above the close waits (a partition never asked would hold the watch
// frontier, and the event, back for good).
func TestWatchWithIdleLeaders(t *testing.T) {
	c, ctx, c1 := startServing(t, 4, server.Config{WatchFeedsIdleAfter: 300 * time.Millisecond}, 120*time.Second)
	for i, n := range c.Nodes {
		eventually(t, 10*time.Second, fmt.Sprintf("node %d idles its feeds", i+1), func() (bool, string) {
			v := feedsWanted(t, n)
			return v == 0, fmt.Sprint("brain_watch_feeds_wanted ", v)
		})
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := watchCreated(t, wctx, c1, "", clientv3.WithPrefix())
	for round := 0; round < 3; round++ {
		for _, k := range memberKeys {
			key := fmt.Sprintf("%s/idle-%d", k, round)
			r, err := c1.Put(ctx, key, "v")
			if err != nil {
				t.Fatal(err)
			}
			select {
			case wr := <-wch:
				if err := wr.Err(); err != nil {
					t.Fatalf("watch: %v", err)
				}
				if len(wr.Events) != 1 || string(wr.Events[0].Kv.Key) != key || wr.Events[0].Kv.ModRevision != r.Header.Revision {
					t.Fatalf("put %s at %d: watch delivered %s", key, r.Header.Revision, describeEvents(wr.Events))
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("put %s at %d: no event within 5s; watch state:\n%s", key, r.Header.Revision, watchState(t, c))
			}
		}
	}
}

// describeEvents formats events for a failure message.
func describeEvents(evs []*clientv3.Event) string {
	var b strings.Builder
	b.WriteString("[")
	for i, ev := range evs {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s %q=%q mod=%d create=%d version=%d", ev.Type, ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision, ev.Kv.CreateRevision, ev.Kv.Version)
	}
	b.WriteString("]")
	return b.String()
}

// watchState describes each node's watch hub and partitions from its
// metrics: where the frontier is, what it holds and which partition's
// closed revision holds it back.
func watchState(t *testing.T, c *testutil.Cluster) string {
	t.Helper()
	var b strings.Builder
	for i, n := range c.Nodes {
		if n == nil {
			continue
		}
		mfs, err := n.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "node %d:", i+1)
		for _, mf := range mfs {
			name := mf.GetName()
			if !strings.HasPrefix(name, "brain_watch_") && name != "brain_partition_closed_revision_lag" || mf.GetType() == dto.MetricType_HISTOGRAM {
				continue
			}
			for _, m := range mf.GetMetric() {
				v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
				fmt.Fprintf(&b, " %s", strings.TrimPrefix(name, "brain_"))
				for _, l := range m.GetLabel() {
					fmt.Fprintf(&b, "{%s}", l.GetValue())
				}
				fmt.Fprintf(&b, "=%g", v)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}
