package partition

import (
	"context"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/internal/bugs"
	"github.com/cockroachdb/pebble/v2"
)

// LeaseKeys returns the keys of this partition attached to lease id.
func (p *Partition) LeaseKeys(id int64) ([][]byte, error) {
	prefix := engine.PutUint64([]byte{engine.LeasePrefix}, uint64(id))
	start, end := p.Span()
	it, err := p.db.NewIter(&pebble.IterOptions{
		LowerBound: engine.AppendKey(append([]byte(nil), prefix...), start),
		UpperBound: leaseUpper(prefix, end),
	})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var keys [][]byte
	for it.First(); it.Valid(); it.Next() {
		k, _, err := engine.DecodeKey(nil, it.Key()[len(prefix):])
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, it.Error()
}

func leaseUpper(prefix, end []byte) []byte {
	if len(end) == 0 {
		return engine.PrefixEnd(prefix)
	}
	return engine.AppendKey(append([]byte(nil), prefix...), end)
}

// DeleteByLease deletes every key of this partition attached to lease id,
// as one write at one revision, and returns how many it deleted and the
// revision (0 if none). The lease
// must already be marked as being revoked (LeaseUsable false), so no new
// key can attach to it; puts that attached it before hold its latch shared
// and are waited for.
func (p *Partition) DeleteByLease(ctx context.Context, id int64) (int, int64, error) {
	var latched map[string]bool
	for {
		spans := []latchSpan{leaseSpan(id, true)}
		for k := range latched {
			spans = append(spans, keySpan([]byte(k), nil, true))
		}
		g, err := p.latches.acquire(ctx, spans)
		if err != nil {
			return 0, 0, err
		}
		keys, err := p.LeaseKeys(id)
		if err != nil {
			p.latches.release(g)
			return 0, 0, err
		}
		missing := false
		for _, k := range keys {
			if !latched[string(k)] {
				missing = true
				if latched == nil {
					latched = make(map[string]bool)
				}
				latched[string(k)] = true
			}
		}
		if missing {
			p.latches.release(g)
			continue
		}
		if bugs.On("lease-keeps-key") && len(keys) > 1 {
			keys = keys[:len(keys)-1]
		}
		n, rev, err := p.deleteKeysLatched(ctx, keys)
		p.latches.release(g)
		if err == errRetry {
			continue
		}
		return n, rev, err
	}
}

func (p *Partition) deleteKeysLatched(ctx context.Context, keys [][]byte) (int, int64, error) {
	if len(keys) == 0 {
		return 0, 0, nil
	}
	if !p.IsLeader() {
		return 0, 0, ErrNotLeader
	}
	w, term, err := p.register()
	if err != nil {
		return 0, 0, err
	}
	rev, err := p.revs.Next(ctx, 1)
	if err != nil {
		p.abandon(w)
		return 0, 0, err
	}
	muts := make([]mutation, len(keys))
	for i, k := range keys {
		muts[i] = mutation{kind: mutDelete, key: k}
	}
	cmd := (&command{kind: cmdWrite, term: term, rev: rev, muts: muts}).encode()
	res, err := p.proposeWrite(ctx, w, term, rev, cmd)
	if err != nil {
		return 0, 0, err
	}
	switch res.reject {
	case accepted:
		return len(keys), rev, nil
	case rejectClosed:
		return 0, 0, errRetry
	default:
		return 0, 0, ErrLeaderChanged
	}
}
