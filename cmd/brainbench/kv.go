package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Key groups: each benchmark works on its own keys under --key-prefix.
const (
	groupUpdate = "update"
	groupPut    = "put"
	groupGet    = "get"
	groupList   = "list"
)

// RunCreate measures kube-apiserver's create: a transaction that puts a
// new key only if it does not exist yet, reading it back otherwise. Every
// operation creates a distinct key; one that already exists is an error.
func RunCreate(ctx context.Context, cfg Config) (Result, error) {
	group := "create-" + runID()
	return runKV(ctx, "create", cfg, nil, func(ctx context.Context, w *worker, seq int64) error {
		return create(ctx, w, cfg.writeKey(group, seq), seq)
	})
}

// RunUpdate measures kube-apiserver's GuaranteedUpdate on random keys of a
// pre-populated key space: read the key, then a transaction that puts the
// new value only if the key's mod revision is still the one read, and
// returns the current value otherwise, to retry with.
func RunUpdate(ctx context.Context, cfg Config) (Result, error) {
	pre := &populate{group: groupUpdate, n: cfg.Keys}
	return runKV(ctx, "update", cfg, pre, func(ctx context.Context, w *worker, seq int64) error {
		key := cfg.writeKey(groupUpdate, w.rng.Int64N(int64(cfg.Keys)))
		return guaranteedUpdate(ctx, w, key, seq, cfg.MaxRetries)
	})
}

// RunPut measures plain puts of random keys of the key space.
func RunPut(ctx context.Context, cfg Config) (Result, error) {
	return runKV(ctx, "put", cfg, nil, func(ctx context.Context, w *worker, seq int64) error {
		key := cfg.writeKey(groupPut, w.rng.Int64N(int64(cfg.Keys)))
		_, err := w.cli.Put(ctx, key, string(stamp(w.value, seq)))
		return err
	})
}

// RunGet measures linearizable gets of random keys of a pre-populated key
// space (kube-apiserver's reads that bypass its watch cache).
func RunGet(ctx context.Context, cfg Config) (Result, error) {
	pre := &populate{group: groupGet, n: cfg.Keys}
	return runKV(ctx, "get", cfg, pre, func(ctx context.Context, w *worker, _ int64) error {
		key := cfg.writeKey(groupGet, w.rng.Int64N(int64(cfg.Keys)))
		resp, err := w.cli.Get(ctx, key)
		if err == nil && len(resp.Kvs) != 1 {
			err = fmt.Errorf("get %q: %d keys, want the populated one", key, len(resp.Kvs))
		}
		return err
	})
}

// RunList measures kube's paginated list of a pre-populated prefix of
// cfg.Keys keys: one operation reads every page at one revision.
func RunList(ctx context.Context, cfg Config) (Result, error) {
	prefix := groupPrefix(cfg.KeyPrefix, groupList)
	var keys, pages atomic.Int64
	pre := &populate{group: groupList, n: cfg.Keys}
	r, err := runKV(ctx, "list", cfg, pre, func(ctx context.Context, w *worker, _ int64) error {
		n, p, err := listAll(ctx, w.cli, prefix, int64(cfg.PageSize))
		if err != nil {
			return err
		}
		if n < int64(cfg.Keys) {
			return fmt.Errorf("list %q returned %d keys, want at least %d", prefix, n, cfg.Keys)
		}
		keys.Store(n)
		pages.Store(p)
		return nil
	})
	r.KeysPerList, r.Pages = keys.Load(), pages.Load()
	return r, err
}

// populate describes the keys a benchmark writes, untimed, before it runs.
type populate struct {
	group string
	n     int
}

// runKV connects, populates the key space if pre is set, runs op and
// turns the measurements into a Result.
func runKV(ctx context.Context, name string, cfg Config, pre *populate, op opFunc) (Result, error) {
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	p, err := dial(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	defer p.close()
	if pre != nil {
		if err := fill(ctx, cfg, p, name, pre); err != nil {
			return Result{}, err
		}
	}
	var idle *cpuWindow
	if cfg.CPU {
		if cfg.cpu, err = newCPUProbe(cfg); err != nil {
			return Result{}, err
		}
		if cfg.CPUIdle > 0 {
			if idle, err = cfg.cpu.measureIdle(ctx, cfg.CPUIdle); err != nil {
				return Result{}, err
			}
		}
	}
	var rw *resourceWatches
	if cfg.ResourceWatchers > 0 {
		if rw, err = openResourceWatches(ctx, cfg); err != nil {
			return Result{}, err
		}
	}
	var pace paceFunc
	if cfg.OpRate > 0 {
		pace = func(seq int64) time.Duration { return time.Duration(seq) * time.Second / time.Duration(cfg.OpRate) }
	}
	s := runLoad(ctx, name, cfg, p, op, pace)
	r := newResult(name, cfg, &s)
	r.OfferedRate = cfg.OpRate
	if cfg.cpu != nil {
		if s.cpuErr != nil {
			return r, s.cpuErr
		}
		r.CPU = cfg.cpu.stats(s.cpu, idle, s.ops)
	}
	if rw != nil {
		// Every successful write is an event for each watch of its
		// resource; a failed one may have been applied too.
		want := (s.ops + s.unmeasured) * int64(cfg.ResourceWatchers)
		got, err := rw.finish(want, resourceWatchDrain)
		r.ResourceWatches = &ResourceWatchStats{Watches: cfg.ResourceWatchers * len(cfg.Resources), Events: got, Want: want}
		if err != nil {
			r.ResourceWatches.FirstError = err.Error()
		}
	}
	return r, ctx.Err()
}

// resourceWatchDrain bounds the wait for the resource watches' last
// events after the load.
const resourceWatchDrain = 30 * time.Second

// fill puts keys 0..pre.n-1 of pre.group with all workers; any failure
// aborts the benchmark.
func fill(ctx context.Context, cfg Config, p *pool, name string, pre *populate) error {
	fc := cfg
	fc.Total, fc.Duration = int64(pre.n), 0
	s := runLoad(ctx, name+"/populate", fc, p, func(ctx context.Context, w *worker, seq int64) error {
		key := cfg.writeKey(pre.group, seq)
		if pre.group == groupList { // a list reads one prefix
			key = keyName(cfg.KeyPrefix, pre.group, seq)
		}
		_, err := w.cli.Put(ctx, key, string(stamp(w.value, seq)))
		return err
	}, nil)
	if s.errors > 0 {
		return fmt.Errorf("%s: populating %d keys: %d failed, first: %w", name, pre.n, s.errors, s.firstErr)
	}
	return ctx.Err()
}

// stamp writes seq into the first bytes of the worker's value so that
// consecutive writes differ, and returns the value.
func stamp(value []byte, seq int64) []byte {
	binary.BigEndian.PutUint64(value, uint64(seq))
	return value
}

// create is kube's create: put key if it has never been written.
func create(ctx context.Context, w *worker, key string, seq int64) error {
	resp, err := w.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(stamp(w.value, seq)))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("create %q: key already exists", key)
	}
	return nil
}

// errTooManyConflicts ends an update that lost its compare maxRetries times.
var errTooManyConflicts = errors.New("update: too many conflicts")

// guaranteedUpdate is kube's GuaranteedUpdate: get, then compare-and-put
// on the mod revision read, retrying with the value the failed compare
// returned.
func guaranteedUpdate(ctx context.Context, w *worker, key string, seq int64, maxRetries int) error {
	get, err := w.cli.Get(ctx, key)
	if err != nil {
		return err
	}
	mod := modRevision(get.Kvs)
	for range maxRetries + 1 {
		resp, err := w.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", mod)).
			Then(clientv3.OpPut(key, string(stamp(w.value, seq)))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return err
		}
		if resp.Succeeded {
			return nil
		}
		w.conflicts++
		if len(resp.Responses) != 1 || resp.Responses[0].GetResponseRange() == nil {
			return fmt.Errorf("update %q: failed compare returned no range response", key)
		}
		mod = modRevision(resp.Responses[0].GetResponseRange().Kvs)
	}
	return fmt.Errorf("%w: %q lost %d compares", errTooManyConflicts, key, maxRetries+1)
}

// modRevision returns the mod revision of the only kv, or 0 if there is none.
func modRevision(kvs []*mvccpb.KeyValue) int64 {
	if len(kvs) == 0 {
		return 0
	}
	return kvs[0].ModRevision
}

// listAll is kube's paginated list of prefix: the first page at the
// current revision, the following ones at the first page's revision,
// each starting just after the previous page's last key. It returns the
// number of keys and pages read.
func listAll(ctx context.Context, cli *clientv3.Client, prefix string, pageSize int64) (keys, pages int64, err error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	resp, err := cli.Get(ctx, prefix, clientv3.WithRange(end), clientv3.WithLimit(pageSize))
	if err != nil {
		return 0, 0, err
	}
	rev := resp.Header.Revision
	for {
		keys += int64(len(resp.Kvs))
		pages++
		if !resp.More {
			return keys, pages, nil
		}
		if len(resp.Kvs) == 0 {
			return keys, pages, fmt.Errorf("list %q: page %d has more=true but no keys", prefix, pages)
		}
		next := string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		resp, err = cli.Get(ctx, next, clientv3.WithRange(end), clientv3.WithLimit(pageSize), clientv3.WithRev(rev))
		if err != nil {
			return keys, pages, fmt.Errorf("list %q page %d at rev %d: %w", prefix, pages+1, rev, err)
		}
		if len(resp.Kvs) > 0 && string(resp.Kvs[0].Key) < next {
			// A page that does not move forward would loop forever.
			return keys, pages, fmt.Errorf("list %q page %d: first key %q is before the continue key %q", prefix, pages+1, resp.Kvs[0].Key, next)
		}
	}
}
