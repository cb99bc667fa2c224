package server

import (
	"context"
	"errors"
	"hash/crc32"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/brainkv/brain/auth"
	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/snapshot"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// maintenance implements etcdcompat.Maintenance for a node.
type maintenance struct{ s *Server }

func (m *maintenance) DBSize() (int64, int64) {
	met := m.s.db.Metrics()
	size := int64(met.DiskSpaceUsage())
	inUse := int64(met.Total().TablesSize) + int64(met.MemTable.Size)
	return size, min(inUse, size)
}

func (m *maintenance) Defragment(ctx context.Context) error {
	return m.s.db.Compact(ctx, []byte{0}, []byte{0xFF}, true)
}

func (m *maintenance) Alarms() []*pb.AlarmMember { return m.s.meta.Alarms() }

func (m *maintenance) SetAlarm(ctx context.Context, activate bool, member uint64, a pb.AlarmType) error {
	return m.s.store.SetAlarm(ctx, activate, member, a)
}

func (m *maintenance) RaftStatus() (index, term, applied, leader uint64) {
	g := m.s.host.Group(kvapi.MetaGroup)
	if g == nil {
		return 0, 0, 0, m.s.leaderHint(kvapi.MetaGroup)
	}
	st := g.Status()
	return st.Commit, st.Term, st.Applied, st.Lead
}

// errNotAllPartitions: HashKV and Snapshot read this node's storage, which
// must hold a replica of every partition.
var errNotAllPartitions = errors.New("brain: this node does not hold a replica of every partition; ask a node that does (brainnode status lists each partition's voters and learners)")

// closedRevision waits until every partition has closed the current
// revision and returns it: a consistent cut of the store.
func (m *maintenance) closedRevision(ctx context.Context) (int64, error) {
	var parts []*partition.Partition
	for _, rt := range m.s.store.Routes() {
		if rt.Local == nil {
			return 0, errNotAllPartitions
		}
		parts = append(parts, rt.Local)
	}
	rev := m.s.store.CurrentRevision()
	m.s.store.RequestClose(rev)
	for _, p := range parts {
		if err := p.WaitClosed(ctx, rev); err != nil {
			return 0, err
		}
	}
	return rev, nil
}

// splitPoints returns the starts of the partitions of the current map
// (after splits, more than the initial split points).
func (s *Server) splitPoints() []string {
	var out []string
	for _, rt := range s.store.Routes() {
		if len(rt.Start) > 0 {
			out = append(out, string(rt.Start))
		}
	}
	slices.Sort(out)
	return out
}

// HashKV hashes, in key order, every version with a revision in
// (compaction revision, rev]: the part of the history every replica keeps
// identically whatever its garbage collection has done.
func (m *maintenance) HashKV(ctx context.Context, rev int64) (uint32, int64, int64, error) {
	cur, err := m.closedRevision(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	if rev == 0 {
		rev = cur
	}
	if rev > cur {
		return 0, 0, 0, partition.ErrFutureRev
	}
	compact := m.s.meta.CompactRevision()
	if rev < compact {
		return 0, 0, 0, partition.ErrCompacted
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	var buf []byte
	err = partition.DumpVersions(m.s.db, rev, func(v *partition.Version) error {
		if v.Rev <= compact {
			return nil
		}
		buf = append(buf[:0], v.Key...)
		buf = append(buf, byte(v.Rev>>56), byte(v.Rev>>48), byte(v.Rev>>40), byte(v.Rev>>32), byte(v.Rev>>24), byte(v.Rev>>16), byte(v.Rev>>8), byte(v.Rev))
		if v.Tombstone {
			buf = append(buf, 1)
		}
		buf = append(buf, v.KV.Value...)
		h.Write(buf)
		return nil
	})
	return h.Sum32(), rev, compact, err
}

// Snapshot streams a backup at a closed revision, read from one Pebble
// snapshot so that it is consistent.
func (m *maintenance) Snapshot(ctx context.Context, send func([]byte, uint64) error) error {
	rev, err := m.closedRevision(ctx)
	if err != nil {
		return err
	}
	snap := m.s.db.NewSnapshot()
	defer snap.Close()
	// The compaction revision and leases are read after the Pebble
	// snapshot: a compaction recorded meanwhile only removes versions the
	// backup may then omit, and is reflected in the header.
	hdr := snapshot.Header{
		Revision:        rev,
		CompactRevision: min(m.s.meta.CompactRevision(), rev),
		SplitPoints:     m.s.splitPoints(),
		ClusterID:       m.s.id.ClusterID,
		MemberID:        m.s.id.MemberID,
	}
	leases := m.s.meta.LeaseList()
	authState, err := auth.DumpState(snap, kvapi.MetaGroup)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w, err := snapshot.NewWriter(pw, hdr)
		if err == nil {
			err = partition.DumpVersions(snap, rev, w.Version)
		}
		for _, l := range leases {
			if err == nil {
				err = w.Lease(l)
			}
		}
		for _, r := range authState {
			if err == nil {
				err = w.Auth(r[0], r[1])
			}
		}
		if err == nil {
			err = w.Close()
		}
		pw.CloseWithError(err)
	}()
	defer wg.Wait()
	defer pr.Close()
	buf := make([]byte, 1<<20)
	start := time.Now()
	var total int
	for {
		n, err := io.ReadFull(pr, buf)
		if n > 0 {
			total += n
			if serr := send(append([]byte(nil), buf[:n]...), 0); serr != nil {
				return serr
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			m.s.log.Info("sent snapshot", "revision", rev, "bytes", total, "took", time.Since(start))
			return nil
		}
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
