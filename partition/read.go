package partition

import (
	"bytes"
	"context"

	"github.com/cockroachdb/pebble/v2"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// clamp intersects [key, end) with the partition's span. end empty means
// unbounded. ok is false if the intersection is empty.
func (p *Partition) clamp(key, end []byte) (k, e []byte, ok bool) {
	k, e = key, end
	start, pend := p.Span()
	if bytes.Compare(k, start) < 0 {
		k = start
	}
	if len(pend) != 0 && (len(e) == 0 || bytes.Compare(e, pend) > 0) {
		e = pend
	}
	if len(e) != 0 && bytes.Compare(k, e) >= 0 {
		return nil, nil, false
	}
	return k, e, true
}

// ScanOptions are the options of Scan.
type ScanOptions struct {
	Limit     int64 // 0: all
	KeysOnly  bool
	CountOnly bool
}

// Scan returns the live keys of [key, end) ∩ the partition at revision rev
// (waiting until rev is closed here) and the count of all of them. end nil
// means the single key; empty non-nil means unbounded.
func (p *Partition) Scan(ctx context.Context, key, end []byte, rev int64, o ScanOptions) ([]*mvccpb.KeyValue, int64, error) {
	if err := p.WaitClosed(ctx, rev); err != nil {
		return nil, 0, err
	}
	kvs, n, err := p.scanClosed(key, end, rev, o)
	if err == nil && !p.Covers(key, end) {
		return nil, 0, ErrOutsideRange // split: the caller routes again
	}
	return kvs, n, err
}

func (p *Partition) scanClosed(key, end []byte, rev int64, o ScanOptions) ([]*mvccpb.KeyValue, int64, error) {
	if end == nil {
		end = append(append([]byte(nil), key...), 0)
	}
	k, e, ok := p.clamp(key, end)
	if !ok {
		return nil, 0, nil
	}
	return p.index.indexedScan(p.db, k, e, scanOptions{rev: rev, limit: int(o.Limit), keysOnly: o.KeysOnly, countOnly: o.CountOnly})
}

// ReadTxn evaluates a read-only txn at revision rev (waiting until rev is
// closed here). Its header revision is rev.
func (p *Partition) ReadTxn(ctx context.Context, rt *pb.TxnRequest, rev int64) (*pb.TxnResponse, error) {
	if err := p.WaitClosed(ctx, rev); err != nil {
		return nil, err
	}
	v := &view{r: p.db, index: p.index, readRev: rev, beginRev: rev, compactRev: p.compact.Load(), leaseOK: p.leases.LeaseUsable}
	resp, err := v.evalTxn(rt)
	if err == nil {
		err = p.checkSpans(txnSpans(rt, nil))
	}
	return resp, err
}

// Events returns this partition's events with revisions in [from, to]
// whose key is in [key, end) (end empty: unbounded), in revision order,
// reading the event log. to must be closed here. At most maxRevs revisions
// with matching events are returned; more reports whether the scan stopped
// early, in which case next is the first revision not returned.
func (p *Partition) Events(from, to int64, key, end []byte, maxRevs int) (out []RevEvents, next int64, more bool, err error) {
	out, next, more, err = p.eventsFrom(p.db, from, to, key, end, maxRevs)
	if err == nil && !p.Covers(key, end) {
		return nil, 0, false, ErrOutsideRange // split: the caller routes again
	}
	return out, next, more, err
}

// eventsFrom is Events reading r.
func (p *Partition) eventsFrom(r pebble.Reader, from, to int64, key, end []byte, maxRevs int) (out []RevEvents, next int64, more bool, err error) {
	it, err := r.NewIter(&pebble.IterOptions{
		LowerBound: eventKey(p.id, from),
		UpperBound: eventKey(p.id, to+1),
	})
	if err != nil {
		return nil, 0, false, err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		rev := int64(engineUint64(it.Key()[9:]))
		if maxRevs > 0 && len(out) >= maxRevs {
			return out, rev, true, nil
		}
		muts, err := decodeEventRecord(it.Value())
		if err != nil {
			return nil, 0, false, err
		}
		var evs []*mvccpb.Event
		for _, m := range muts {
			if bytes.Compare(m.key, key) < 0 || len(end) != 0 && bytes.Compare(m.key, end) >= 0 {
				continue
			}
			ev, err := eventAt(r, m, rev)
			if err != nil {
				return nil, 0, false, err
			}
			evs = append(evs, ev)
		}
		if len(evs) > 0 {
			out = append(out, RevEvents{Rev: rev, Events: evs})
		}
	}
	return out, to + 1, false, it.Error()
}

// eventAt rebuilds the event of m at rev from the MVCC versions in r.
func eventAt(r pebble.Reader, m mutation, rev int64) (*mvccpb.Event, error) {
	ev := &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: m.key, ModRevision: rev}}
	if m.kind == mutDelete {
		ev.Type = mvccpb.DELETE
	} else {
		v, closer, err := r.Get(versionKey(m.key, rev))
		if err != nil {
			return nil, err
		}
		_, err = decodeVersion(v, ev.Kv, false)
		closer.Close()
		if err != nil {
			return nil, err
		}
	}
	prev, err := versionAtOrBelow(r, m.key, rev-1, false)
	if err != nil {
		return nil, err
	}
	ev.PrevKv = prev
	return ev, nil
}

func engineUint64(b []byte) uint64 {
	var v uint64
	for _, c := range b[:8] {
		v = v<<8 | uint64(c)
	}
	return v
}

// Get returns key's live kv at rev, waiting until rev is closed here.
func (p *Partition) Get(ctx context.Context, key []byte, rev int64) (*mvccpb.KeyValue, error) {
	if err := p.WaitClosed(ctx, rev); err != nil {
		return nil, err
	}
	return getAt(p.db, key, rev, false)
}

// PrevValue loads the value of key's version at rev (for a prev_kv the
// feed published without its value). Versions a watch may still ask for are
// never collected (see gc.go), so it is found unless the key's history below
// the compaction revision is asked for.
func (p *Partition) PrevValue(key []byte, rev int64) ([]byte, error) {
	kv := &mvccpb.KeyValue{}
	if err := readValue(p.db, key, rev, kv); err != nil {
		if !p.Contains(key) {
			return nil, ErrOutsideRange
		}
		return nil, err
	}
	if !p.Contains(key) {
		return nil, ErrOutsideRange
	}
	return kv.Value, nil
}
