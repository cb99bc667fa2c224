package partition

import (
	"hash/maphash"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// keyIndex holds the latest meta (the index key's content) of every key of
// the partition in memory, as etcd's treeIndex does, so that evaluating and
// applying a write costs no storage lookup for it.
//
// Apply updates it after the batch holding the change commits and before
// proposers are woken (an AfterCommit hook), so a request that takes a
// key's latch after the previous write released it sees that write. Within
// one apply round, later commands see earlier commands' changes through the
// partition's round overlay (Partition.round), not through the index.
type keyIndex struct {
	seed   maphash.Seed
	shards [64]indexShard
}

type indexShard struct {
	sync.RWMutex
	m map[string]meta // protected by the shard lock
}

func newKeyIndex() *keyIndex {
	x := &keyIndex{seed: maphash.MakeSeed()}
	for i := range x.shards {
		x.shards[i].m = make(map[string]meta)
	}
	return x
}

func (x *keyIndex) shard(key []byte) *indexShard {
	return &x.shards[maphash.Bytes(x.seed, key)%uint64(len(x.shards))]
}

func (x *keyIndex) get(key []byte) (meta, bool) {
	s := x.shard(key)
	s.RLock()
	m, ok := s.m[string(key)]
	s.RUnlock()
	return m, ok
}

func (x *keyIndex) set(key string, m meta) {
	s := x.shard([]byte(key))
	s.Lock()
	s.m[key] = m
	s.Unlock()
}

func (x *keyIndex) del(key string) {
	s := x.shard([]byte(key))
	s.Lock()
	delete(s.m, key)
	s.Unlock()
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

