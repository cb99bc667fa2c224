package server_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	dto "github.com/prometheus/client_model/go"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// feedsWanted reads the brain_watch_feeds_wanted gauge of a node.
func feedsWanted(t *testing.T, s *server.Server) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "brain_watch_feeds_wanted" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no brain_watch_feeds_wanted metric")
	return 0
}

// TestWatchAfterFeedsIdle: nodes without watchers stop their partition
// feeds (local and, on a 4-node cluster where no node has every partition,
// from other nodes); watches created afterwards - from a past revision
// before, during and after the idle time, and from now - get exactly the
// events of their range in revision order, with prev_kv, on every node.
func TestWatchAfterFeedsIdle(t *testing.T) {
	c, ctx, c1 := startServing(t, 4, server.Config{WatchFeedsIdleAfter: 300 * time.Millisecond}, 120*time.Second)
	type write struct {
		key, val string
		rev      int64
	}
	var writes []write
	put := func(round int) {
		for i := 0; i < 10; i++ {
			for _, k := range memberKeys {
				key, val := fmt.Sprintf("%s/%d", k, i), fmt.Sprint(round)
				r, err := c1.Put(ctx, key, val)
				if err != nil {
					t.Fatal(err)
				}
				writes = append(writes, write{key, val, r.Header.Revision})
			}
		}
	}
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
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify()}
		if from[i] != 0 {
			opts = append(opts, clientv3.WithRev(from[i]))
		}
		// Right after start a node may answer "no leader" while its meta
		// replica has not heard its leader yet; clients (kube-apiserver)
		// open the watch again.
		for attempt := 0; ; attempt++ {
			chans[i] = cl.Watch(wctx, "", opts...)
			wr := <-chans[i]
			if wr.Created {
				break
			}
			if !errors.Is(wr.Err(), rpctypes.ErrNoLeader) || attempt == 50 {
				t.Fatalf("node %d: watch not created: %v", i+1, wr.Err())
			}
			time.Sleep(100 * time.Millisecond)
		}
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
		got := 0
		for got < len(want) {
			var wr clientv3.WatchResponse
			select {
			case wr = <-ch:
			case <-time.After(20 * time.Second):
				t.Fatalf("node %d: %d of %d events, then nothing for 20s", i+1, got, len(want))
			}
			if err := wr.Err(); err != nil {
				t.Fatalf("node %d: watch: %v", i+1, err)
			}
			for _, ev := range wr.Events {
				if got == len(want) {
					t.Fatalf("node %d: unexpected event %q at %d", i+1, ev.Kv.Key, ev.Kv.ModRevision)
				}
				w := want[got]
				if string(ev.Kv.Key) != w.key || string(ev.Kv.Value) != w.val || ev.Kv.ModRevision != w.rev {
					t.Fatalf("node %d: event %d is %q=%q at %d, want %q=%q at %d", i+1, got, ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision, w.key, w.val, w.rev)
				}
				if p, ok := prev[w.key]; ok != (ev.PrevKv != nil) || ok && string(ev.PrevKv.Value) != p {
					t.Fatalf("node %d: event %d (%q at %d) prev_kv %v, want %q", i+1, got, w.key, w.rev, ev.PrevKv, p)
				}
				prev[w.key] = w.val
				got++
			}
		}
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
	var wch clientv3.WatchChan
	for attempt := 0; ; attempt++ {
		wch = c1.Watch(wctx, "", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		wr := <-wch
		if wr.Created {
			break
		}
		if !errors.Is(wr.Err(), rpctypes.ErrNoLeader) || attempt == 50 {
			t.Fatalf("watch not created: %v", wr.Err())
		}
		time.Sleep(100 * time.Millisecond)
	}
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
