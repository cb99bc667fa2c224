package chaos

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/brainkv/brain/internal/history"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leaseTTL is the TTL of the lease workload's leases (seconds).
const leaseTTL = 2

// leaseRecord is one lease of the lease workload: the keys put with it (all
// in one partition, so its expiry deletes them at one revision) and a
// control key put without it next to them, which its expiry must leave.
type leaseRecord struct {
	ID      int64
	Keys    []string          // put with the lease, acknowledged or unknown
	Acked   map[string]int64  // key -> revision of its acknowledged put
	Values  map[string]string // key -> value put
	Control string            // put without a lease (attempted)
	Granted int64             // history clock
}

type leaseLog struct {
	mu     sync.Mutex
	leases []*leaseRecord
}

func (l *leaseLog) add(r *leaseRecord) {
	l.mu.Lock()
	l.leases = append(l.leases, r)
	l.mu.Unlock()
}

func (l *leaseLog) all() []*leaseRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*leaseRecord(nil), l.leases...)
}

// runLeases grants short leases, puts keys with them and lets them expire
// (some are renewed once first).
func runLeases(rec *history.Recorder, cl *clientv3.Client, client int, seed int64, stop <-chan struct{}, log *leaseLog) {
	rng := rand.New(rand.NewSource(seed))
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		g, err := cl.Grant(ctx, leaseTTL)
		cancel()
		if err != nil {
			sleep(context.Background(), 100*time.Millisecond)
			continue
		}
		r := &leaseRecord{ID: int64(g.ID), Acked: map[string]int64{}, Values: map[string]string{}, Granted: rec.Now()}
		prefix := fmt.Sprintf("/registry/events/lease-c%d-%d-", client, i)
		for k := 0; k < 3; k++ {
			key, val := fmt.Sprintf("%sk%d", prefix, k), fmt.Sprintf("l%d-%d-%d", client, i, k)
			r.Keys, r.Values[key] = append(r.Keys, key), val
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			p, err := cl.Put(ctx, key, val, clientv3.WithLease(g.ID))
			cancel()
			if err == nil {
				r.Acked[key] = p.Header.Revision
			}
		}
		r.Control = prefix + "control"
		r.Values[r.Control] = fmt.Sprintf("l%d-%d-control", client, i)
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = cl.Put(ctx, r.Control, r.Values[r.Control])
		cancel()
		if rng.Intn(3) == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, _ = cl.KeepAliveOnce(ctx, g.ID)
			cancel()
		}
		log.add(r)
		sleep(context.Background(), time.Duration(rng.Intn(500))*time.Millisecond)
	}
}

// leaseOps are the lease workload's acknowledged puts as history operations,
// for CheckHistory (they are not registers porcupine could model: expiry
// deletes them).
func leaseOps(ls []*leaseRecord) []history.Op {
	var ops []history.Op
	for _, r := range ls {
		for _, k := range r.Keys {
			op := history.Op{In: history.Input{Kind: history.Put, Key: k, Value: r.Values[k]}, Out: history.Output{Unknown: true}}
			if rev, ok := r.Acked[k]; ok {
				op.Out = history.Output{Rev: rev, OK: true}
			}
			ops = append(ops, op)
		}
		ops = append(ops, history.Op{In: history.Input{Kind: history.Put, Key: r.Control, Value: r.Values[r.Control]}, Out: history.Output{Unknown: true}})
	}
	return ops
}

// checkLeases checks lease expiry against the reference history: every key
// written with a lease is deleted after it, all of a lease's keys at one
// revision, and its control key (same prefix, no lease) never.
func checkLeases(ls []*leaseRecord, ref *history.Watch) []error {
	type keyHist struct{ put, del int64 }
	hist := map[string]*keyHist{}
	for _, r := range ref.Resps {
		for _, ev := range r.Events {
			if !strings.Contains(ev.Key, "/lease-c") {
				continue
			}
			h := hist[ev.Key]
			if h == nil {
				h = &keyHist{}
				hist[ev.Key] = h
			}
			if ev.Delete {
				h.del = ev.Rev
			} else {
				h.put = ev.Rev
			}
		}
	}
	var errs []error
	for _, r := range ls {
		dels := map[int64]bool{}
		for _, k := range r.Keys {
			h := hist[k]
			if h == nil || h.put == 0 {
				if _, ok := r.Acked[k]; ok {
					errs = append(errs, fmt.Errorf("lease %x: acknowledged put of %s is not in the history", r.ID, k))
				}
				continue
			}
			if h.del < h.put {
				errs = append(errs, fmt.Errorf("lease %x expired, but %s (put at %d) was never deleted", r.ID, k, h.put))
				continue
			}
			dels[h.del] = true
		}
		if len(dels) > 1 {
			var revs []int64
			for rev := range dels {
				revs = append(revs, rev)
			}
			sort.Slice(revs, func(i, j int) bool { return revs[i] < revs[j] })
			errs = append(errs, fmt.Errorf("lease %x: its keys (one partition) were deleted at several revisions %v", r.ID, revs))
		}
		if h := hist[r.Control]; h != nil && h.del != 0 {
			errs = append(errs, fmt.Errorf("lease %x: its expiry also deleted %s, which has no lease (at %d)", r.ID, r.Control, h.del))
		}
		if len(errs) >= 20 {
			break
		}
	}
	return errs
}

// waitLeasesExpired waits until no key written with a lease is readable
// any more (or d passes).
func waitLeasesExpired(ctx context.Context, cl *clientv3.Client, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		gctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		g, err := cl.Get(gctx, "/registry/events/lease-c", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		left := -1
		if err == nil {
			left = 0
			for _, kv := range g.Kvs {
				if !strings.HasSuffix(string(kv.Key), "control") {
					left++
				}
			}
			if left == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d keys written with leases are still readable %v after the run (%v)", left, d, err)
		}
		sleep(ctx, time.Second)
	}
}
