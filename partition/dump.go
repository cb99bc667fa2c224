package partition

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/brainkv/brain/engine"
	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Version is one MVCC version, as backups carry it.
type Version struct {
	Key       []byte
	Rev       int64
	Tombstone bool
	KV        mvccpb.KeyValue // CreateRevision, Version, Lease, Value
}

// DumpVersions calls fn for every version with revision <= rev in r (all
// partitions: the MVCC keyspace is shared), in key order and, per key,
// newest first. Versions below the compaction revision that compaction has
// not collected yet are included; they are harmless.
func DumpVersions(r pebble.Reader, rev int64, fn func(*Version) error) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: []byte{engine.MVCCPrefix}, UpperBound: []byte{engine.MVCCPrefix + 1}})
	if err != nil {
		return err
	}
	defer it.Close()
	var prefix, key []byte
	for it.First(); it.Valid(); it.Next() {
		pre, suffix, ok := splitMVCCKey(it.Key())
		if !ok {
			return errCorrupt
		}
		if suffix == 0 {
			continue
		}
		vrev := int64(^suffix)
		if vrev > rev {
			continue
		}
		if !bytes.Equal(pre, prefix) {
			prefix = append(prefix[:0], pre...)
			if key, err = userKey(prefix); err != nil {
				return err
			}
		}
		v := &Version{Key: key, Rev: vrev}
		if v.Tombstone, err = decodeVersion(it.Value(), &v.KV, false); err != nil {
			return err
		}
		if err := fn(v); err != nil {
			return err
		}
	}
	return it.Error()
}

// Loader writes restored versions into an indexed batch: the version keys,
// each key's index key (from its newest version), the lease index and the
// event log records of the partition owning each key. Versions must come in
// DumpVersions order.
type Loader struct {
	B *pebble.Batch
	// PartitionOf returns the partition owning key.
	PartitionOf func(key []byte) uint64
	lastKey     []byte
	started     bool
}

// Add writes one version.
func (l *Loader) Add(v *Version) error {
	newest := !l.started || !bytes.Equal(v.Key, l.lastKey)
	l.started = true
	l.lastKey = append(l.lastKey[:0], v.Key...)
	val := encodeVersion(nil, v.Tombstone, v.KV.CreateRevision, v.KV.Version, v.KV.Lease, v.KV.Value)
	if err := l.B.Set(versionKey(v.Key, v.Rev), val, nil); err != nil {
		return err
	}
	if newest {
		m := meta{tombstone: v.Tombstone, mod: v.Rev}
		if !v.Tombstone {
			m.create, m.version, m.lease = v.KV.CreateRevision, v.KV.Version, v.KV.Lease
		}
		if err := l.B.Set(indexKey(v.Key), m.encode(nil), nil); err != nil {
			return err
		}
		if m.lease != 0 {
			if err := l.B.Set(leaseIndexKey(m.lease, v.Key), nil, nil); err != nil {
				return err
			}
		}
	}
	// Append to the revision's event record (op order within a revision is
	// not in a backup; restored records list keys in key order).
	ek := eventKey(l.PartitionOf(v.Key), v.Rev)
	var rec []byte
	var n uint64
	if old, closer, err := l.B.Get(ek); err == nil {
		d := &decoder{b: old}
		n = d.uvarint()
		rec = append(rec, d.b...)
		closer.Close()
	} else if err != pebble.ErrNotFound {
		return err
	}
	kind := mutPut
	if v.Tombstone {
		kind = mutDelete
	}
	out := binary.AppendUvarint(nil, n+1)
	out = append(out, rec...)
	out = append(out, kind)
	out = binary.AppendUvarint(out, uint64(len(v.Key)))
	out = append(out, v.Key...)
	return l.B.Set(ek, out, nil)
}

// WriteRestoredState writes a restored partition's state: everything up to
// rev is closed, and compact is its compaction revision.
func WriteRestoredState(b *pebble.Batch, id uint64, closed, compact int64) error {
	if compact > closed {
		return fmt.Errorf("partition: compaction revision %d above closed revision %d", compact, closed)
	}
	v := engine.PutUint64(engine.PutUint64(nil, uint64(closed)), uint64(compact))
	return b.Set(engine.GroupKey(id, "part"), v, nil)
}
