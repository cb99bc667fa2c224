package partition

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/brainkv/brain/engine"
	"github.com/cockroachdb/pebble/v2"
	"github.com/google/btree"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// keyIndex holds the latest meta (the index key's content) of every key of
// the partition in memory, in key order, as etcd's treeIndex does. Writes
// evaluate and apply without looking index keys up in storage, and range
// reads count keys and find each key's version from memory, touching
// storage only for the values they return.
//
// Apply updates it after the batch holding a change commits, before
// proposers are woken and before the closed revision covering the change
// is published (both AfterCommit hooks, in order). So:
//   - a request that takes a key's latch after the previous write to it
//     released it sees that write;
//   - a reader at revision R <= the closed revision finds every write at or
//     below R; an entry may be newer than R (mod > R), which readers
//     resolve in storage.
//
// Within one apply round, later commands see earlier commands' changes
// through the partition's round overlay (Partition.round), not through the
// index.
type keyIndex struct {
	mu sync.RWMutex
	t  *btree.BTreeG[indexItem] // protected by mu
}

type indexItem struct {
	key string
	m   meta
}

func itemLess(a, b indexItem) bool { return a.key < b.key }

func newKeyIndex() *keyIndex {
	return &keyIndex{t: btree.NewG(32, itemLess)}
}

func (x *keyIndex) get(key []byte) (meta, bool) {
	x.mu.RLock()
	it, ok := x.t.Get(indexItem{key: string(key)})
	x.mu.RUnlock()
	return it.m, ok
}

func (x *keyIndex) set(key string, m meta) {
	x.mu.Lock()
	x.t.ReplaceOrInsert(indexItem{key: key, m: m})
	x.mu.Unlock()
}

func (x *keyIndex) del(key string) {
	x.mu.Lock()
	x.t.Delete(indexItem{key: key})
	x.mu.Unlock()
}

func (x *keyIndex) len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.t.Len()
}

// nth returns the n-th key (0-based) in order, or nil.
func (x *keyIndex) nth(n int) []byte {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []byte
	i := 0
	x.t.Ascend(func(it indexItem) bool {
		if i == n {
			out = []byte(it.key)
			return false
		}
		i++
		return true
	})
	return out
}

// dropFrom removes the keys >= key (they left with a split).
func (x *keyIndex) dropFrom(key string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var gone []indexItem
	x.t.AscendGreaterOrEqual(indexItem{key: key}, func(it indexItem) bool {
		gone = append(gone, it)
		return true
	})
	for _, it := range gone {
		x.t.Delete(it)
	}
}

// ascend calls fn for the keys in [start, end) (end empty: unbounded) in
// order, under the read lock, until fn returns false.
func (x *keyIndex) ascend(start, end []byte, fn func(key string, m meta) bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	visit := func(it indexItem) bool { return fn(it.key, it.m) }
	if len(end) == 0 {
		x.t.AscendGreaterOrEqual(indexItem{key: string(start)}, visit)
		return
	}
	x.t.AscendRange(indexItem{key: string(start)}, indexItem{key: string(end)}, visit)
}

// reload replaces the index's content with the index keys of [start, end)
// in r.
func (x *keyIndex) reload(r pebble.Reader, start, end []byte) error {
	fresh := newKeyIndex()
	if _, err := fresh.load(r, start, end); err != nil {
		return err
	}
	x.mu.Lock()
	x.t = fresh.t
	x.mu.Unlock()
	return nil
}

// load reads every index key of [start, end) from r.
func (x *keyIndex) load(r pebble.Reader, start, end []byte) (int, error) {
	lo, hi := rangeBounds(start, end)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	n := 0
	for valid := it.First(); valid; {
		prefix, suffix, ok := splitMVCCKey(it.Key())
		if !ok || suffix != 0 {
			return 0, errCorrupt
		}
		m, err := decodeMeta(it.Value())
		if err != nil {
			return 0, err
		}
		k, err := userKey(prefix)
		if err != nil {
			return 0, err
		}
		x.set(string(k), m)
		n++
		prefix = append([]byte(nil), prefix...)
		valid = nextPrefix(it, prefix)
	}
	return n, it.Error()
}

// indexedScan is scan, driven by the in-memory index: the range's keys and
// their latest metas come from memory; storage is read only for the values
// returned and for keys changed after opts.rev. opts.rev must be closed
// here (or be latestRev on the leader's write path, under latches).
func (x *keyIndex) indexedScan(r pebble.Reader, start, end []byte, opts scanOptions) ([]*mvccpb.KeyValue, int64, error) {
	// Phase 1, under the read lock. A key whose latest change is at or
	// below rev is settled by its meta; a key changed after rev ("unsure")
	// needs storage to tell its state at rev. Candidates for the result are
	// collected in key order until limit sure-live keys are in hand; past
	// that, sure keys are only counted and unsure ones kept for counting.
	var head []indexItem // result candidates, key order
	var tail []string    // unsure keys past the head, to count
	var count int64      // sure-live keys past the head
	sureInHead := 0
	collecting := !opts.countOnly
	x.ascend(start, end, func(key string, m meta) bool {
		sure := m.mod <= opts.rev
		if sure && m.tombstone {
			return true
		}
		if collecting {
			head = append(head, indexItem{key: key, m: m})
			if sure {
				sureInHead++
				collecting = opts.limit == 0 || sureInHead < opts.limit
			}
			return true
		}
		if sure {
			count++
		} else {
			tail = append(tail, key)
		}
		return true
	})
	// Phase 2: resolve in key order with one forward iterator.
	var vi versionIter
	defer vi.close()
	var kvs []*mvccpb.KeyValue
	room := func() bool { return !opts.countOnly && (opts.limit == 0 || len(kvs) < opts.limit) }
	for _, item := range head {
		key, m := []byte(item.key), item.m
		if m.mod <= opts.rev {
			count++
			if !room() {
				continue
			}
			if opts.keysOnly {
				kvs = append(kvs, &mvccpb.KeyValue{Key: key, ModRevision: m.mod, CreateRevision: m.create, Version: m.version, Lease: m.lease})
				continue
			}
			kv, err := vi.at(r, start, end, key, m.mod, false)
			if err != nil {
				return nil, 0, err
			}
			if kv == nil || kv.ModRevision != m.mod {
				return nil, 0, fmt.Errorf("%w: version %d of %q missing", errCorrupt, m.mod, key)
			}
			kvs = append(kvs, kv)
			continue
		}
		kv, err := vi.at(r, start, end, key, opts.rev, opts.keysOnly || !room())
		if err != nil {
			return nil, 0, err
		}
		if kv != nil {
			count++
			if room() {
				kvs = append(kvs, kv)
			}
		}
	}
	for _, key := range tail {
		kv, err := vi.at(r, start, end, []byte(key), opts.rev, true)
		if err != nil {
			return nil, 0, err
		}
		if kv != nil {
			count++
		}
	}
	return kvs, count, nil
}

// versionIter finds versions of increasing keys with one iterator, moving
// forward with Next while the target is near (a key's newest version
// follows its index key) and seeking otherwise.
type versionIter struct {
	it  *pebble.Iterator
	buf []byte
}

func (v *versionIter) close() {
	if v.it != nil {
		v.it.Close()
	}
}

// at returns key's newest live version <= rev, or nil.
func (v *versionIter) at(r pebble.Reader, start, end, key []byte, rev int64, noValue bool) (*mvccpb.KeyValue, error) {
	v.buf = mvccKeyPrefix(v.buf[:0], key)
	plen := len(v.buf)
	v.buf = engine.PutUint64(v.buf, ^uint64(rev))
	target := v.buf
	if v.it == nil {
		lo, hi := rangeBounds(start, end)
		var err error
		if v.it, err = r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi}); err != nil {
			return nil, err
		}
		v.it.SeekGE(target)
	} else {
		n := 0
		for v.it.Valid() && bytes.Compare(v.it.Key(), target) < 0 && n < 8 {
			v.it.Next()
			n++
		}
		if !v.it.Valid() || bytes.Compare(v.it.Key(), target) < 0 {
			v.it.SeekGE(target)
		}
	}
	if !v.it.Valid() {
		return nil, v.it.Error()
	}
	k := v.it.Key()
	if len(k) != plen+suffixLen || !bytes.Equal(k[:plen], target[:plen]) {
		return nil, nil // no version of key at or below rev
	}
	suffix := engineUint64(k[plen:])
	if suffix == 0 {
		return nil, errCorrupt
	}
	kv := &mvccpb.KeyValue{Key: key, ModRevision: int64(^suffix)}
	tomb, err := decodeVersion(v.it.Value(), kv, noValue)
	if err != nil || tomb {
		return nil, err
	}
	return kv, nil
}

// seekVersion positions it at key's newest version <= rev and decodes it;
// nil if there is none or it is a tombstone.
func seekVersion(it *pebble.Iterator, key []byte, rev int64, noValue bool) (*mvccpb.KeyValue, error) {
	prefix := mvccKeyPrefix(nil, key)
	if !it.SeekGE(engine.PutUint64(append([]byte(nil), prefix...), ^uint64(rev))) {
		return nil, it.Error()
	}
	p, suffix, ok := splitMVCCKey(it.Key())
	if !ok {
		return nil, errCorrupt
	}
	if !bytes.Equal(p, prefix) || suffix == 0 {
		return nil, nil
	}
	kv := &mvccpb.KeyValue{Key: key, ModRevision: int64(^suffix)}
	tomb, err := decodeVersion(it.Value(), kv, noValue)
	if err != nil || tomb {
		return nil, err
	}
	return kv, nil
}
