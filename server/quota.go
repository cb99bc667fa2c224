package server

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brainkv/brain/kvapi"
	"github.com/cockroachdb/pebble/v2"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// quota enforces --quota-backend-bytes as etcd does: a write that would
// take the storage past the quota raises the NOSPACE alarm, and while it is
// active writes fail with "database space exceeded" (reads, deletes and
// compaction still work; disarm the alarm after compacting and
// defragmenting).
type quota struct {
	db     *pebble.DB
	store  *kvapi.Store // set once the store exists
	member uint64
	limit  int64
	size   atomic.Int64
	stopc  chan struct{}
	wg     sync.WaitGroup
}

func newQuota(db *pebble.DB, member uint64, limit int64) *quota {
	q := &quota{db: db, member: member, limit: limit, stopc: make(chan struct{})}
	q.size.Store(int64(db.Metrics().DiskSpaceUsage()))
	return q
}

func (q *quota) start() {
	q.wg.Add(1)
	go func() {
		defer q.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-q.stopc:
				return
			case <-t.C:
				q.size.Store(int64(q.db.Metrics().DiskSpaceUsage()))
			}
		}
	}()
}

func (q *quota) stop() {
	select {
	case <-q.stopc:
	default:
		close(q.stopc)
	}
	q.wg.Wait()
}

func (q *quota) check(n int) error {
	if q.size.Load()+int64(n) <= q.limit {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = q.store.SetAlarm(ctx, true, q.member, pb.AlarmType_NOSPACE)
	return kvapi.ErrNoSpace
}
