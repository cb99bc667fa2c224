package partition

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/brainkv/brain/engine"
	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// MVCC layout (see package engine):
//
//	MVCCPrefix + enc(K) + BE64(0)     index key: K's latest state (meta)
//	MVCCPrefix + enc(K) + BE64(^rev)  version of K written at rev
//
// Versions sort newest first, right after the index key, so reading K at
// the latest revision touches two adjacent keys, reading it at revision R
// is one seek, and a range read is one forward scan.
//
// Index value:   flags, mod, create, version (uvarints), lease (varint).
// Version value: flags, create, version (uvarints), lease (varint), value.
// A tombstone (flagTombstone) records a delete.

const (
	flagTombstone byte = 1
	suffixLen          = 8
)

var errCorrupt = errors.New("partition: corrupt mvcc record")

// meta is the decoded index value of a key.
type meta struct {
	tombstone bool
	mod       int64
	create    int64
	version   int64
	lease     int64
}

func (m *meta) encode(dst []byte) []byte {
	var f byte
	if m.tombstone {
		f = flagTombstone
	}
	dst = append(dst, f)
	dst = binary.AppendUvarint(dst, uint64(m.mod))
	dst = binary.AppendUvarint(dst, uint64(m.create))
	dst = binary.AppendUvarint(dst, uint64(m.version))
	return binary.AppendVarint(dst, m.lease)
}

func decodeMeta(b []byte) (meta, error) {
	var m meta
	if len(b) < 1 {
		return m, errCorrupt
	}
	m.tombstone = b[0]&flagTombstone != 0
	b = b[1:]
	var vals [3]uint64
	for i := range vals {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return m, errCorrupt
		}
		vals[i], b = v, b[n:]
	}
	l, n := binary.Varint(b)
	if n <= 0 {
		return m, errCorrupt
	}
	m.mod, m.create, m.version, m.lease = int64(vals[0]), int64(vals[1]), int64(vals[2]), l
	return m, nil
}

func encodeVersion(dst []byte, tombstone bool, create, version, lease int64, value []byte) []byte {
	var f byte
	if tombstone {
		f = flagTombstone
	}
	dst = append(dst, f)
	dst = binary.AppendUvarint(dst, uint64(create))
	dst = binary.AppendUvarint(dst, uint64(version))
	dst = binary.AppendVarint(dst, lease)
	return append(dst, value...)
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// setVersion writes key's version at rev into b, encoding in place (no
// intermediate copy of the value).
func setVersion(b *pebble.Batch, key []byte, rev int64, tombstone bool, create, version, lease int64, value []byte) {
	klen := 1 + engine.EncodedLen(key) + suffixLen
	vlen := 1 + uvarintLen(uint64(create)) + uvarintLen(uint64(version)) + uvarintLen(uint64(lease<<1^lease>>63)) + len(value)
	op := b.SetDeferred(klen, vlen)
	k := mvccKeyPrefix(op.Key[:0], key)
	engine.PutUint64(k, ^uint64(rev))
	encodeVersion(op.Value[:0], tombstone, create, version, lease, value)
	if err := op.Finish(); err != nil {
		panic(fmt.Errorf("partition: batch set: %w", err))
	}
}

// decodeVersion decodes a version value into kv (Key and ModRevision are set
// by the caller). It returns whether the version is a tombstone. The value
// is copied unless noValue.
func decodeVersion(b []byte, kv *mvccpb.KeyValue, noValue bool) (tombstone bool, err error) {
	if len(b) < 1 {
		return false, errCorrupt
	}
	tombstone = b[0]&flagTombstone != 0
	b = b[1:]
	c, n := binary.Uvarint(b)
	if n <= 0 {
		return false, errCorrupt
	}
	b = b[n:]
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return false, errCorrupt
	}
	b = b[n:]
	l, n := binary.Varint(b)
	if n <= 0 {
		return false, errCorrupt
	}
	b = b[n:]
	kv.CreateRevision, kv.Version, kv.Lease = int64(c), int64(v), l
	if !noValue && !tombstone {
		kv.Value = append([]byte(nil), b...)
	}
	return tombstone, nil
}

// mvccKeyPrefix returns MVCCPrefix + enc(key).
func mvccKeyPrefix(dst, key []byte) []byte {
	dst = append(dst, engine.MVCCPrefix)
	return engine.AppendKey(dst, key)
}

func indexKey(key []byte) []byte {
	k := mvccKeyPrefix(make([]byte, 0, engine.EncodedLen(key)+1+suffixLen), key)
	return append(k, 0, 0, 0, 0, 0, 0, 0, 0)
}

func versionKey(key []byte, rev int64) []byte {
	k := mvccKeyPrefix(make([]byte, 0, engine.EncodedLen(key)+1+suffixLen), key)
	return engine.PutUint64(k, ^uint64(rev))
}

// bound returns the MVCC lower bound for user key k.
func bound(k []byte) []byte { return mvccKeyPrefix(nil, k) }

// rangeBounds returns iterator bounds for user keys [start, end); end nil or
// empty means "to the end of the keyspace".
func rangeBounds(start, end []byte) (lo, hi []byte) {
	lo = bound(start)
	if len(end) == 0 {
		return lo, []byte{engine.MVCCPrefix + 1}
	}
	return lo, bound(end)
}

// splitMVCCKey splits an internal key into enc(K) (with prefix) and suffix.
func splitMVCCKey(k []byte) (prefix []byte, suffix uint64, ok bool) {
	if len(k) < 1+2+suffixLen || k[0] != engine.MVCCPrefix {
		return nil, 0, false
	}
	return k[:len(k)-suffixLen], binary.BigEndian.Uint64(k[len(k)-suffixLen:]), true
}

func userKey(prefix []byte) ([]byte, error) {
	k, rest, err := engine.DecodeKey(nil, prefix[1:])
	if err != nil || len(rest) != 0 {
		return nil, errCorrupt
	}
	return k, nil
}

func getMeta(r pebble.Reader, key []byte) (meta, bool, error) {
	v, closer, err := r.Get(indexKey(key))
	if err == pebble.ErrNotFound {
		return meta{}, false, nil
	}
	if err != nil {
		return meta{}, false, err
	}
	defer closer.Close()
	m, err := decodeMeta(v)
	return m, err == nil, err
}

// getAt returns key's live version at revision rev (math.MaxInt64 for the
// latest), or nil if the key does not exist at rev.
func getAt(r pebble.Reader, key []byte, rev int64, noValue bool) (*mvccpb.KeyValue, error) {
	m, ok, err := getMeta(r, key)
	if err != nil || !ok {
		return nil, err
	}
	if m.mod <= rev && m.tombstone {
		return nil, nil
	}
	if m.mod <= rev {
		kv := &mvccpb.KeyValue{Key: key, ModRevision: m.mod, CreateRevision: m.create, Version: m.version, Lease: m.lease}
		if noValue {
			return kv, nil
		}
		return kv, readValue(r, key, m.mod, kv)
	}
	return versionAtOrBelow(r, key, rev, noValue)
}

// readValue reads the value of key's version at rev (which the index says
// exists) into kv with a point lookup.
func readValue(r pebble.Reader, key []byte, rev int64, kv *mvccpb.KeyValue) error {
	v, closer, err := r.Get(versionKey(key, rev))
	if err != nil {
		return fmt.Errorf("%w: version %d of %q: %v", errCorrupt, rev, key, err)
	}
	defer closer.Close()
	_, err = decodeVersion(v, kv, false)
	return err
}

// versionAtOrBelow returns the newest live version of key with revision <=
// rev, or nil.
func versionAtOrBelow(r pebble.Reader, key []byte, rev int64, noValue bool) (*mvccpb.KeyValue, error) {
	if rev <= 0 {
		return nil, nil
	}
	prefix := mvccKeyPrefix(nil, key)
	it, err := r.NewIter(&pebble.IterOptions{
		LowerBound: versionKey(key, rev),
		UpperBound: append(append([]byte(nil), prefix...), 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0),
	})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	if !it.First() {
		return nil, it.Error()
	}
	_, suffix, ok := splitMVCCKey(it.Key())
	if !ok {
		return nil, errCorrupt
	}
	kv := &mvccpb.KeyValue{Key: key, ModRevision: int64(^suffix)}
	tomb, err := decodeVersion(it.Value(), kv, noValue)
	if err != nil || tomb {
		return nil, err
	}
	return kv, nil
}

// scanOptions control scan.
type scanOptions struct {
	rev       int64 // read revision; math.MaxInt64 for latest
	limit     int   // max kvs to materialize; 0 = all
	keysOnly  bool  // do not read values
	countOnly bool  // materialize nothing
}

// scan reads the live keys in [start, end) at opts.rev in key order from
// storage alone. It returns up to opts.limit kvs and the count of all live
// keys in the range. Partitions read through keyIndex.indexedScan; scan is
// the reference it is tested against, and serves views without an index.
func scan(r pebble.Reader, start, end []byte, opts scanOptions) ([]*mvccpb.KeyValue, int64, error) {
	lo, hi := rangeBounds(start, end)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, 0, err
	}
	defer it.Close()
	var kvs []*mvccpb.KeyValue
	var count int64
	valid := it.First()
	for valid {
		prefix, suffix, ok := splitMVCCKey(it.Key())
		if !ok || suffix != 0 {
			return nil, 0, fmt.Errorf("%w: expected an index key at %x", errCorrupt, it.Key())
		}
		m, err := decodeMeta(it.Value())
		if err != nil {
			return nil, 0, err
		}
		want := !opts.countOnly && (opts.limit == 0 || len(kvs) < opts.limit)
		prefix = append([]byte(nil), prefix...)
		var kv *mvccpb.KeyValue
		live := false
		if m.mod <= opts.rev {
			live = !m.tombstone
			if live && want {
				kv = &mvccpb.KeyValue{ModRevision: m.mod, CreateRevision: m.create, Version: m.version, Lease: m.lease}
				if !opts.keysOnly {
					// The newest version follows the index key.
					if !it.Next() {
						return nil, 0, fmt.Errorf("%w: missing version for index at %x", errCorrupt, prefix)
					}
					if p, s, _ := splitMVCCKey(it.Key()); !bytes.Equal(p, prefix) || int64(^s) != m.mod {
						return nil, 0, fmt.Errorf("%w: version %d missing at %x", errCorrupt, m.mod, prefix)
					}
					if _, err := decodeVersion(it.Value(), kv, false); err != nil {
						return nil, 0, err
					}
				}
			}
		} else {
			// The latest version is newer than rev: seek to the newest
			// version <= rev.
			seek := engine.PutUint64(append([]byte(nil), prefix...), ^uint64(opts.rev))
			if it.SeekGE(seek) {
				if p, s, _ := splitMVCCKey(it.Key()); bytes.Equal(p, prefix) {
					var tmp mvccpb.KeyValue
					tomb, err := decodeVersion(it.Value(), &tmp, opts.keysOnly || !want)
					if err != nil {
						return nil, 0, err
					}
					if !tomb {
						live = true
						if want {
							tmp.ModRevision = int64(^s)
							kv = &tmp
						}
					}
				}
			}
		}
		if live {
			count++
			if kv != nil {
				if kv.Key, err = userKey(prefix); err != nil {
					return nil, 0, err
				}
				kvs = append(kvs, kv)
			}
		}
		valid = nextPrefix(it, prefix)
	}
	return kvs, count, it.Error()
}

// nextPrefix moves it to the index key of the next user key after prefix:
// a few Next calls (keys usually have one or two versions), then a seek.
func nextPrefix(it *pebble.Iterator, prefix []byte) bool {
	for i := 0; i < 4; i++ {
		if !it.Valid() {
			return false
		}
		if !bytes.HasPrefix(it.Key(), prefix) || len(it.Key()) != len(prefix)+suffixLen {
			return true
		}
		it.Next()
	}
	if !it.Valid() {
		return false
	}
	seek := append(append([]byte(nil), prefix...), 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0)
	return it.SeekGE(seek)
}
