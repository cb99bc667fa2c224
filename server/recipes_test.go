package server_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/client/v3/leasing"
	"go.etcd.io/etcd/client/v3/mirror"
)

// TestClientRecipes runs etcd's own client recipes against a single node
// and a 3-node cluster, their clients spread over the nodes, under a
// concurrent write load: STM at its four isolation levels (bank transfers
// that must keep the total), Mutex (a counter incremented under the lock),
// Election (one leader at a time), the leasing KV, and the mirror syncer
// (etcdctl make-mirror's). Their keys lie within one partition, as a
// read-write transaction's must. STM with RepeatableReads never committed
// on a follower whose partition's closed revision had stopped moving.
func TestClientRecipes(t *testing.T) {
	for _, nodes := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d nodes", nodes), func(t *testing.T) {
			var eps []string
			if nodes == 1 {
				b := testutil.StartBrain(t, server.Config{InitialSplitPoints: readSplits})
				eps = []string{testutil.Endpoint(b)}
			} else {
				cl := testutil.StartCluster(t, nodes, server.Config{InitialSplitPoints: readSplits})
				eps = cl.Endpoints()
			}
			client := func(i int) *clientv3.Client { return testutil.Client(t, eps[i%len(eps)]) }
			writeLoad(t, client(0), "/a/load/", "/b/load/", "/c/load/")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			t.Run("STM", func(t *testing.T) { testSTM(ctx, t, client) })
			t.Run("Mutex", func(t *testing.T) { testMutex(ctx, t, client) })
			t.Run("Election", func(t *testing.T) { testElection(ctx, t, client) })
			t.Run("leasing", func(t *testing.T) { testLeasing(ctx, t, client) })
			t.Run("mirror", func(t *testing.T) { testMirror(ctx, t, client) })
		})
	}
}

func testSTM(ctx context.Context, t *testing.T, client func(int) *clientv3.Client) {
	const accounts, each = 5, 100
	isolations := map[string]concurrency.Isolation{
		"SerializableSnapshot": concurrency.SerializableSnapshot, "Serializable": concurrency.Serializable,
		"RepeatableReads": concurrency.RepeatableReads, "ReadCommitted": concurrency.ReadCommitted,
	}
	for name, iso := range isolations {
		key := func(i int) string { return fmt.Sprintf("/b/stm/%s/%d", name, i) }
		c := client(0)
		for i := 0; i < accounts; i++ {
			if _, err := c.Put(ctx, key(i), strconv.Itoa(each)); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := client(w)
				for n := 0; n < 10; n++ {
					from, to := (w+n)%accounts, (w+n+1)%accounts
					_, err := concurrency.NewSTM(c, func(s concurrency.STM) error {
						a, _ := strconv.Atoi(s.Get(key(from)))
						b, _ := strconv.Atoi(s.Get(key(to)))
						s.Put(key(from), strconv.Itoa(a-1))
						s.Put(key(to), strconv.Itoa(b+1))
						return nil
					}, concurrency.WithIsolation(iso), concurrency.WithAbortContext(ctx))
					if err != nil {
						errs <- fmt.Errorf("%s transfer %d by client %d: %w", name, n, w, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// ReadCommitted gives no isolation: transfers may be lost there,
		// as in etcd; the others keep the total.
		total := 0
		for i := 0; i < accounts; i++ {
			r, err := c.Get(ctx, key(i))
			if err != nil {
				t.Fatal(err)
			}
			v, _ := strconv.Atoi(string(r.Kvs[0].Value))
			total += v
		}
		if iso != concurrency.ReadCommitted && total != accounts*each {
			t.Errorf("%s: the accounts hold %d after the transfers, want %d", name, total, accounts*each)
		}
	}
}

func testMutex(ctx context.Context, t *testing.T, client func(int) *clientv3.Client) {
	const workers, rounds = 3, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := client(w)
			s, err := concurrency.NewSession(c, concurrency.WithTTL(5))
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			m := concurrency.NewMutex(s, "/b/mutex/")
			for n := 0; n < rounds; n++ {
				if err := m.Lock(ctx); err != nil {
					errs <- err
					return
				}
				// A read-modify-write that only the lock makes safe.
				r, err := c.Get(ctx, "/b/mutex-counter")
				if err == nil {
					v := 0
					if len(r.Kvs) == 1 {
						v, _ = strconv.Atoi(string(r.Kvs[0].Value))
					}
					_, err = c.Put(ctx, "/b/mutex-counter", strconv.Itoa(v+1))
				}
				if uerr := m.Unlock(ctx); err == nil {
					err = uerr
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	r, err := client(0).Get(ctx, "/b/mutex-counter")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(r.Kvs[0].Value); got != strconv.Itoa(workers*rounds) {
		t.Fatalf("the counter incremented under the mutex is %s, want %d", got, workers*rounds)
	}
}

func testElection(ctx context.Context, t *testing.T, client func(int) *clientv3.Client) {
	var sessions []*concurrency.Session
	var elections []*concurrency.Election
	for i := 0; i < 2; i++ {
		s, err := concurrency.NewSession(client(i), concurrency.WithTTL(5))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sessions = append(sessions, s)
		elections = append(elections, concurrency.NewElection(s, "/b/election/"))
	}
	if err := elections[0].Campaign(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() { second <- elections[1].Campaign(ctx, "second") }()
	select {
	case err := <-second:
		t.Fatalf("the second candidate was elected while the first leads: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	l, err := elections[1].Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := string(l.Kvs[0].Value); v != "first" {
		t.Fatalf("the leader is %q, want first", v)
	}
	if err := elections[0].Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	l, err = elections[0].Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := string(l.Kvs[0].Value); v != "second" {
		t.Fatalf("after the first resigned the leader is %q, want second", v)
	}
}

func testLeasing(ctx context.Context, t *testing.T, client func(int) *clientv3.Client) {
	kv1, close1, err := leasing.NewKV(client(0), "/b/leasing/")
	if err != nil {
		t.Fatal(err)
	}
	defer close1()
	kv2, close2, err := leasing.NewKV(client(1), "/b/leasing/")
	if err != nil {
		t.Fatal(err)
	}
	defer close2()
	for i := 0; i < 10; i++ {
		if _, err := kv1.Put(ctx, "/b/leased", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		// kv2 holds the key's lease after its first read; kv1's next put
		// must revoke it, so kv2 never reads an old value.
		r, err := kv2.Get(ctx, "/b/leased")
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != strconv.Itoa(i) {
			t.Fatalf("the leasing KV read %v after a put of %d", r.Kvs, i)
		}
	}
}

func testMirror(ctx context.Context, t *testing.T, client func(int) *clientv3.Client) {
	src, dst := client(0), client(1)
	for i := 0; i < 20; i++ {
		if _, err := src.Put(ctx, fmt.Sprintf("/b/src/%02d", i), "v"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	s := mirror.NewSyncer(dst, "/b/src/", 0)
	got := map[string]string{}
	rc, errc := s.SyncBase(ctx)
	for r := range rc {
		for _, kv := range r.Kvs {
			got[string(kv.Key)] = string(kv.Value)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if len(got) != 20 {
		t.Fatalf("the mirror's base has %d keys, want 20", len(got))
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	wc := s.SyncUpdates(wctx)
	for i := 20; i < 25; i++ {
		if _, err := src.Put(ctx, fmt.Sprintf("/b/src/%02d", i), "v"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	for len(got) < 25 {
		select {
		case wr := <-wc:
			if err := wr.Err(); err != nil {
				t.Fatal(err)
			}
			for _, ev := range wr.Events {
				got[string(ev.Kv.Key)] = string(ev.Kv.Value)
			}
		case <-ctx.Done():
			t.Fatalf("the mirror's updates stopped at %d keys", len(got))
		}
	}
}
