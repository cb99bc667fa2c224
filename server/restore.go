package server

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/brainkv/brain/auth"
	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/snapshot"
	"github.com/brainkv/brain/tso"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// RestoreConfig configures Restore.
type RestoreConfig struct {
	// SnapshotPath is the backup file (from etcdctl snapshot save or the
	// Maintenance.Snapshot stream).
	SnapshotPath string
	// DataDir is the new node's data directory; it must not exist.
	DataDir string
	// Name, InitialAdvertisePeerURLs and InitialClusterToken identify the
	// new member, as for a new store.
	Name                     string
	InitialAdvertisePeerURLs []string
	InitialClusterToken      string
	// Progress, if set, is called now and then with the versions restored.
	Progress func(versions int64)
	FS       vfs.FS
}

// Restore creates a new single-node store from a backup. Started, it
// serves the backup's data at the backup's revision, continues revisions
// from there, and keeps the backup's leases (with fresh TTLs).
func Restore(rc RestoreConfig) (*snapshot.Header, error) {
	cfg := Config{Name: rc.Name, DataDir: rc.DataDir, InitialAdvertisePeerURLs: rc.InitialAdvertisePeerURLs, InitialClusterToken: rc.InitialClusterToken, FS: rc.FS}
	cfg.EnsureDefaults()
	if _, err := cfg.FS.Stat(cfg.DataDir); err == nil {
		return nil, fmt.Errorf("restore: data dir %s already exists", cfg.DataDir)
	}
	data, err := os.ReadFile(rc.SnapshotPath)
	if err != nil {
		return nil, err
	}
	// The store is written into a directory beside the data directory and
	// renamed to it at the end, so a failed restore leaves nothing that a
	// retry would trip over or a start would take for a store.
	tmp := cfg.DataDir + ".restoring"
	if err := cfg.FS.RemoveAll(tmp); err != nil {
		return nil, err
	}
	if err := cfg.FS.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	hdr, err := restoreInto(cfg, rc, tmp, data)
	if err != nil {
		if rerr := cfg.FS.RemoveAll(tmp); rerr != nil {
			err = fmt.Errorf("%w (and removing %s failed: %v)", err, tmp, rerr)
		}
		return nil, err
	}
	if err := cfg.FS.Rename(tmp, cfg.DataDir); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if d, err := cfg.FS.OpenDir(filepath.Dir(cfg.DataDir)); err == nil {
		err = d.Sync() // the rename survives a crash
		d.Close()
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
	}
	return hdr, nil
}

// restoreInto writes the store restored from data into dir.
func restoreInto(cfg Config, rc RestoreConfig, dir string, data []byte) (_ *snapshot.Header, err error) {
	db, err := engine.Open(engine.Config{Dir: filepath.Join(dir, "pebble"), FS: cfg.FS})
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := db.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()

	// The header comes first in the file; split points are needed to place
	// events, so parse once for the header, then load.
	hdr, err := peekHeader(data)
	if err != nil {
		return nil, err
	}
	bounds := append([]string{""}, hdr.SplitPoints...)
	partitionOf := func(key []byte) uint64 {
		i := sort.Search(len(bounds), func(i int) bool { return bytes.Compare([]byte(bounds[i]), key) > 0 })
		return uint64(kvapi.FirstPartition + i - 1)
	}
	b := db.NewIndexedBatch()
	loader := &partition.Loader{B: b, PartitionOf: partitionOf}
	var n int64
	contents, err := snapshot.Read(data, func(v *partition.Version) error {
		if err := loader.Add(v); err != nil {
			return err
		}
		n++
		if n%100000 == 0 {
			if err := b.Commit(pebble.NoSync); err != nil {
				return err
			}
			b = db.NewIndexedBatch()
			loader.B = b
			if rc.Progress != nil {
				rc.Progress(n)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	h := contents.Header
	for i := range bounds {
		if err := partition.WriteRestoredState(b, uint64(kvapi.FirstPartition+i), h.Revision, h.CompactRevision); err != nil {
			return nil, err
		}
	}
	if err := tso.WriteRestoredState(b, kvapi.TSOGroup, h.Revision); err != nil {
		return nil, err
	}
	if err := meta.WriteRestoredState(b, kvapi.MetaGroup, contents.Leases, h.CompactRevision); err != nil {
		return nil, err
	}
	if err := auth.WriteRestoredState(b, kvapi.MetaGroup, contents.Auth); err != nil {
		return nil, err
	}
	id := &identity{Name: cfg.Name, PeerURLs: cfg.InitialAdvertisePeerURLs, SplitPoints: h.SplitPoints, Replicas: cfg.Replicas, Placement: cfg.Placement}
	id.MemberID = memberID(id.PeerURLs, cfg.InitialClusterToken)
	id.ClusterID = clusterID([]uint64{id.MemberID})
	id.Members = []member{{ID: id.MemberID, Name: id.Name, PeerURLs: id.PeerURLs}}
	if err := saveIdentity(b, id); err != nil {
		return nil, err
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return nil, err
	}
	if rc.Progress != nil {
		rc.Progress(n)
	}
	return &h, nil
}

func peekHeader(data []byte) (*snapshot.Header, error) {
	// Read validates the checksum and stops at the end record; versions are
	// skipped here.
	c, err := snapshot.Read(data, func(*partition.Version) error { return nil })
	if err != nil {
		return nil, err
	}
	return &c.Header, nil
}
