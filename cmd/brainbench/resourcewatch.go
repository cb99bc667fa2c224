package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// resourceWatches are the watches kube-apiservers keep open while they
// write: --resource-watchers per resource of --resources, each on the
// resource's prefix (/registry/<resource>/) from the revision it opens at,
// on a client of its own connected to one endpoint, the watches spread
// round-robin over the endpoints (as clientv3's balancer spreads an
// apiserver's watch streams). Each one reads its events, counts them and
// checks their order: every write of the benchmarks that open them puts
// one key, so each event has a revision of its own, and one at or below
// the watch's last is out of order or a duplicate (the watch guarantee
// kube-apiserver's cache relies on).
type resourceWatches struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	clients []*clientv3.Client
	events  atomic.Int64

	mu       sync.Mutex
	firstErr error // protected by mu
}

// openResourceWatches opens the watches and waits until each is created.
func openResourceWatches(ctx context.Context, cfg Config) (*resourceWatches, error) {
	wctx, cancel := context.WithCancel(ctx)
	rw := &resourceWatches{cancel: cancel}
	i := 0
	for range cfg.ResourceWatchers {
		for _, res := range cfg.Resources {
			ep := cfg.Endpoints[i%len(cfg.Endpoints)]
			i++
			c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: dialTimeout, Logger: zap.NewNop()})
			if err != nil {
				rw.close()
				return nil, fmt.Errorf("connect to %s: %w", ep, err)
			}
			rw.clients = append(rw.clients, c)
			prefix := "/registry/" + res + "/"
			wch := c.Watch(clientv3.WithRequireLeader(wctx), prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
			select {
			case wr, ok := <-wch:
				if !ok || !wr.Created {
					rw.close()
					return nil, fmt.Errorf("watch %s on %s: not created: %v", prefix, ep, wr.Err())
				}
			case <-time.After(dialTimeout):
				rw.close()
				return nil, fmt.Errorf("watch %s on %s: not created within %v", prefix, ep, dialTimeout)
			}
			rw.wg.Add(1)
			go rw.read(wctx, prefix, ep, wch)
		}
	}
	return rw, nil
}

func (rw *resourceWatches) read(ctx context.Context, prefix, ep string, wch clientv3.WatchChan) {
	defer rw.wg.Done()
	var last int64 // the revision of the watch's last event
	for wr := range wch {
		if err := wr.Err(); err != nil && ctx.Err() == nil {
			rw.fail(fmt.Errorf("watch %s on %s: %w", prefix, ep, err))
			return
		}
		for _, ev := range wr.Events {
			if rev := ev.Kv.ModRevision; rev <= last {
				// The key unquoted: bench/scaling.sh reads the error
				// out of the JSON up to its first quote.
				rw.fail(fmt.Errorf("watch %s on %s: event for %s at revision %d after one at revision %d: out of order or duplicate", prefix, ep, ev.Kv.Key, rev, last))
			} else {
				last = rev
			}
		}
		rw.events.Add(int64(len(wr.Events)))
	}
	if ctx.Err() == nil {
		rw.fail(fmt.Errorf("watch %s on %s: closed", prefix, ep))
	}
}

func (rw *resourceWatches) fail(err error) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.firstErr == nil {
		rw.firstErr = err
	}
}

// finish waits up to wait for the watches to deliver want events in all
// (an event per successful write and watch), then closes them and
// returns the events delivered and the first failure.
func (rw *resourceWatches) finish(want int64, wait time.Duration) (int64, error) {
	deadline := time.Now().Add(wait)
	for rw.events.Load() < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	rw.close()
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.events.Load(), rw.firstErr
}

func (rw *resourceWatches) close() {
	rw.cancel()
	for _, c := range rw.clients {
		c.Close()
	}
	rw.wg.Wait()
}
