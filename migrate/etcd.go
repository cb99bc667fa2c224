package migrate

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/snapshot"
	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/lease/leasepb"
)

// etcd's bucket and key names (server/storage/schema).
var (
	keyBucket          = []byte("key")
	leaseBucket        = []byte("lease")
	metaBucket         = []byte("meta")
	finishedCompactKey = []byte("finishedCompactRev")
)

// etcd's revision key: 8-byte main, '_', 8-byte sub, optional 't'.
const (
	revBytesLen    = 8 + 1 + 8
	markedRevBytes = revBytesLen + 1
	markTombstone  = 't'
)

// Progress reports how far a conversion got: done of total keys.
type Progress func(done, total int64)

// Stats describes a conversion.
type Stats struct {
	Header   snapshot.Header
	Versions int64 // versions written (deletions included)
	Keys     int64 // distinct keys
	Leases   int64
}

// FromEtcdSnapshot converts the etcd snapshot (or data file) at path into
// a brain backup written to w, with the given partition split points. A
// trailing checksum, if the file has one, must match.
func FromEtcdSnapshot(path string, w io.Writer, splitPoints []string, progress Progress) (*Stats, error) {
	dbPath, cleanup, err := stripChecksum(path)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	db, err := bolt.Open(dbPath, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("migrate: open %s as an etcd database: %w", path, err)
	}
	defer db.Close()

	st := &Stats{}
	err = db.View(func(tx *bolt.Tx) error {
		keys := tx.Bucket(keyBucket)
		if keys == nil {
			return fmt.Errorf("migrate: %s has no %q bucket: not an etcd v3 database", path, keyBucket)
		}
		// Revisions: the last one written, or the compaction revision if
		// compaction has removed everything after it (as etcd computes it).
		compact := int64(0)
		if m := tx.Bucket(metaBucket); m != nil {
			if v := m.Get(finishedCompactKey); len(v) >= revBytesLen {
				compact = int64(binary.BigEndian.Uint64(v))
			}
		}
		rev := compact
		if k, _ := keys.Cursor().Last(); k != nil {
			if len(k) < revBytesLen {
				return fmt.Errorf("migrate: malformed revision key %x", k)
			}
			rev = max(rev, int64(binary.BigEndian.Uint64(k)))
		}
		st.Header = snapshot.Header{Revision: rev, CompactRevision: compact, SplitPoints: splitPoints}

		// brain's backup lists each key's versions together, newest first;
		// etcd's bucket is in revision order. Group by key in memory (a
		// store's history fits: etcd's own limit is a few GiB).
		total := int64(keys.Stats().KeyN)
		byKey := map[string][]partition.Version{}
		var order []string
		var done int64
		err := keys.ForEach(func(k, v []byte) error {
			if len(k) != revBytesLen && len(k) != markedRevBytes {
				return fmt.Errorf("migrate: malformed revision key %x", k)
			}
			var kv mvccpb.KeyValue
			if err := kv.Unmarshal(v); err != nil {
				return fmt.Errorf("migrate: revision %d: %w", binary.BigEndian.Uint64(k), err)
			}
			ver := partition.Version{
				Key:       kv.Key,
				Rev:       int64(binary.BigEndian.Uint64(k)),
				Tombstone: len(k) == markedRevBytes && k[revBytesLen] == markTombstone,
			}
			if !ver.Tombstone {
				ver.KV = mvccpb.KeyValue{CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease, Value: kv.Value}
			}
			if _, ok := byKey[string(kv.Key)]; !ok {
				order = append(order, string(kv.Key))
			}
			byKey[string(kv.Key)] = append(byKey[string(kv.Key)], ver)
			done++
			if progress != nil && done%10000 == 0 {
				progress(done, total)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if progress != nil {
			progress(done, total)
		}
		// A backup file ends with the SHA-256 of its contents.
		sum := sha256.New()
		bw, err := snapshot.NewWriter(io.MultiWriter(w, sum), st.Header)
		if err != nil {
			return err
		}
		slices.Sort(order)
		for _, k := range order {
			vs := byKey[k]
			for i := len(vs) - 1; i >= 0; i-- {
				if err := bw.Version(&vs[i]); err != nil {
					return err
				}
				st.Versions++
			}
			st.Keys++
		}
		if lb := tx.Bucket(leaseBucket); lb != nil {
			err := lb.ForEach(func(_, v []byte) error {
				var l leasepb.Lease
				if err := l.Unmarshal(v); err != nil {
					return fmt.Errorf("migrate: lease: %w", err)
				}
				st.Leases++
				return bw.Lease(meta.Lease{ID: l.ID, TTL: l.TTL})
			})
			if err != nil {
				return err
			}
		}
		if err := bw.Close(); err != nil {
			return err
		}
		_, err = w.Write(sum.Sum(nil))
		return err
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// stripChecksum returns the path of a copy of the file without the
// SHA-256 etcd appends to a snapshot stream (checked), or the path itself
// if it has none.
func stripChecksum(path string) (string, func(), error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	// bbolt files are whole pages; a snapshot stream adds 32 bytes.
	if len(data)%512 != sha256.Size {
		return path, func() {}, nil
	}
	body, sum := data[:len(data)-sha256.Size], data[len(data)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return "", nil, errors.New("migrate: the snapshot's checksum does not match its contents")
	}
	dir, err := os.MkdirTemp("", "brain-migrate")
	if err != nil {
		return "", nil, err
	}
	p := filepath.Join(dir, "etcd.db")
	if err := os.WriteFile(p, body, 0o600); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return p, func() { os.RemoveAll(dir) }, nil
}
