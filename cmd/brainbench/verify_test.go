package main

import (
	"encoding/binary"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// testPlan is a plan of n writes over 2 keys, all acknowledged at revision
// 100+seq.
func testPlan(n int64) *watchPlan {
	p := &watchPlan{prefix: "p-", keys: []string{"p-00000000", "p-00000001"}, writes: n, revs: make([]atomic.Int64, n)}
	for seq := range n {
		p.revs[seq].Store(100 + seq)
	}
	return p
}

// event is the event of write seq at rev, with prev_kv at prevRev (0: none).
func event(p *watchPlan, seq, rev, prevRev int64) *clientv3.Event {
	v := make([]byte, watchValueHeader)
	binary.BigEndian.PutUint64(v[0:8], uint64(time.Now().UnixNano()))
	binary.BigEndian.PutUint64(v[8:16], uint64(seq))
	key := []byte(p.keys[p.key(seq)])
	ev := &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: key, Value: v, ModRevision: rev}}
	if prevRev != 0 {
		ev.PrevKv = &mvccpb.KeyValue{Key: key, ModRevision: prevRev}
	}
	return ev
}

// deliver feeds events to a fresh watcher and verifies it.
func deliver(p *watchPlan, evs ...*clientv3.Event) WatchStats {
	w := newWatcher(0, p)
	for _, ev := range evs {
		w.check(ev, time.Now())
	}
	var s WatchStats
	verify(p, []*watcher{w}, &s)
	return s
}

func TestVerify(t *testing.T) {
	p := testPlan(4)
	// Writes 0 and 2 go to key 0, 1 and 3 to key 1.
	good := []*clientv3.Event{event(p, 0, 100, 0), event(p, 1, 101, 0), event(p, 2, 102, 100), event(p, 3, 103, 101)}
	for _, tc := range []struct {
		name string
		evs  []*clientv3.Event
		want string // substring of the first verify error; "" for success
	}{
		{"complete", good, ""},
		{"missing", good[:3], "never delivered"},
		{"duplicate", append(append([]*clientv3.Event{}, good...), good[3]), "out of order or duplicate"},
		{"out of order", []*clientv3.Event{good[1], good[0], good[2], good[3]}, "out of order"},
		{"no prev_kv", []*clientv3.Event{good[0], good[1], event(p, 2, 102, 0), good[3]}, "has no prev_kv"},
		{"wrong prev_kv", []*clientv3.Event{good[0], good[1], event(p, 2, 102, 99), good[3]}, "prev_kv at revision 99"},
		{"prev_kv on new key", []*clientv3.Event{event(p, 0, 100, 50), good[1], good[2], good[3]}, "new key"},
		{"wrong revision", []*clientv3.Event{good[0], good[1], good[2], event(p, 3, 104, 101)}, "put returned revision 103"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := deliver(p, tc.evs...)
			if tc.want == "" {
				if !s.Verified {
					t.Fatalf("verification failed: %v", s.VerifyErrors)
				}
				return
			}
			if s.Verified || len(s.VerifyErrors) == 0 || !strings.Contains(s.VerifyErrors[0], tc.want) {
				t.Fatalf("verified %v, errors %q; want an error containing %q", s.Verified, s.VerifyErrors, tc.want)
			}
		})
	}
}

func TestVerifyFailedWriteDelivered(t *testing.T) {
	p := testPlan(2)
	p.revs[1].Store(0) // the put of write 1 failed on the client
	s := deliver(p, event(p, 0, 100, 0), event(p, 1, 101, 0))
	if s.Verified || !strings.Contains(strings.Join(s.VerifyErrors, "\n"), "failed on the client") {
		t.Fatalf("verified %v, errors %q", s.Verified, s.VerifyErrors)
	}
}

func TestHistogramPercentiles(t *testing.T) {
	var h Histogram
	for i := 1; i <= 10000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5 * time.Millisecond}, {0.9, 9 * time.Millisecond}, {0.99, 9900 * time.Microsecond}, {1, 10 * time.Millisecond}} {
		got := h.Percentile(tc.q)
		if got < tc.want || float64(got) > float64(tc.want)*(1+1.0/subCount) {
			t.Errorf("p%v = %v, want %v within %.1f%%", tc.q*100, got, tc.want, 100.0/subCount)
		}
	}
	if h.Max() != 10*time.Millisecond || h.Count() != 10000 {
		t.Errorf("max %v count %d", h.Max(), h.Count())
	}
	var m Histogram
	m.Merge(&h)
	m.Record(time.Second)
	if m.Count() != 10001 || m.Max() != time.Second || m.Percentile(0.5) != h.Percentile(0.5) {
		t.Errorf("merge: count %d max %v p50 %v", m.Count(), m.Max(), m.Percentile(0.5))
	}
}

func TestBucketsCoverRange(t *testing.T) {
	for _, v := range []int64{0, 1, subCount - 1, subCount, 1000, 1 << 40, 1<<63 - 1} {
		i := bucketOf(v)
		if i < 0 || i >= numBuckets || bucketHigh(i) < v || (i > 0 && bucketHigh(i-1) >= v) {
			t.Errorf("value %d: bucket %d [.., %d], previous high %d", v, i, bucketHigh(i), bucketHigh(max(i-1, 0)))
		}
	}
}
