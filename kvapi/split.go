package kvapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
)

// Splits through the store: Split allocates the new partition's ID in the
// meta group, has the partition's leader split (partition.Split), and the
// leader records the split in the meta group's partition map before it
// answers. A leader that failed before recording it leaves that to
// ReportSplits, which every node runs for the partitions it leads.

// Split splits the partition holding key at key and returns the parent
// and the new partition. It returns once this node routes by the new map.
// The new partition gets the next partition ID.
func (s *Store) Split(ctx context.Context, key []byte) (parent, child uint64, err error) {
	return s.SplitPlaced(ctx, key, nil)
}

// ChildRank ranks the IDs a split of partition parent could give its new
// partition: an ID decides the partition's placement and preferred leader,
// so this is where a split chooses where its new half goes. rank is lower
// for better IDs; best is the best rank any ID can have.
type ChildRank func(parent uint64) (rank func(id uint64) int, best int)

// SplitPlaced is Split with the new partition's ID chosen by choose (nil:
// the next ID; see allocChild).
func (s *Store) SplitPlaced(ctx context.Context, key []byte, choose ChildRank) (parent, child uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*requestTimeout)
	defer cancel()
	rt := s.table().routeFor(key)
	if bytes.Equal(rt.Start, key) {
		return 0, 0, partition.ErrBadSplitKey // a boundary already
	}
	if child, err = s.allocChild(ctx, rt.ID, choose); err != nil {
		return 0, 0, err
	}
	err = s.routed(ctx, func(t *table) error {
		rt := t.routeFor(key)
		parent = rt.ID
		return s.onLeader(ctx, rt, OpSplit,
			func(p *partition.Partition) error { return s.splitLocal(ctx, p, key, child) },
			func() ([]byte, error) { return append(ints(int64(child)), key...), nil }, nil)
	})
	if err != nil {
		return 0, 0, err
	}
	for s.table().byID[child] == nil {
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return parent, child, err
		}
	}
	return parent, child, nil
}

// splitLocal splits p (on its leader) and records the split. A split that
// applied succeeds even if recording it failed: the partition's leader
// records it later (ReportSplits, which every node runs for the partitions
// it leads), Split waits for that, and a retry of the split would only be
// refused (its key is a boundary now).
func (s *Store) splitLocal(ctx context.Context, p *partition.Partition, key []byte, child uint64) error {
	if !p.Contains(key) {
		return partition.ErrOutsideRange
	}
	if s.groupLock != nil {
		mu := s.groupLock(p.ID())
		mu.Lock()
		err := p.Split(ctx, key, child)
		mu.Unlock()
		if err != nil {
			return err
		}
	} else if err := p.Split(ctx, key, child); err != nil {
		return err
	}
	if err := s.ReportSplits(ctx, p); err != nil {
		s.log.Warn("recording a split in the partition map failed; the leader's next report records it",
			"partition", p.ID(), "child", child, "err", err)
	}
	return nil
}

// ReportSplits records p's splits that the meta group's partition map
// lacks (this node's meta replica may lag: recording is idempotent).
func (s *Store) ReportSplits(ctx context.Context, p *partition.Partition) error {
	known := make(map[uint64]bool)
	for _, sp := range s.meta.Splits() {
		known[sp.Child] = true
	}
	var missing []meta.Split
	for _, r := range p.Splits() {
		if !known[r.Child] {
			missing = append(missing, meta.Split{Parent: p.ID(), Child: r.Child, Key: r.Key})
		}
	}
	if len(missing) == 0 {
		return nil
	}
	args, err := json.Marshal(missing)
	if err != nil {
		return err
	}
	return s.metaCall(ctx, OpMetaRecordSplits, func() error { return s.meta.RecordSplits(ctx, missing) }, args, nil)
}

// IsSplitRefusal reports whether err is a split refused for its key.
func IsSplitRefusal(err error) bool { return errors.Is(err, partition.ErrBadSplitKey) }

// maxChildAllocs bounds the IDs one split allocates looking for one of
// the best rank (ChildRank): IDs are handed out in sequence and placement
// cycles through the members with them, so a cluster of up to this many
// members finds one unless other splits allocate at the same time.
const maxChildAllocs = 16

// allocChild allocates the ID of the new partition of a split of parent.
// With choose it allocates IDs until one has the best rank (at most
// maxChildAllocs) and takes the best it got; the others are never used.
// (A meta command taking the wanted placement would not waste IDs, but a
// node of an earlier version would apply it differently.)
func (s *Store) allocChild(ctx context.Context, parent uint64, choose ChildRank) (uint64, error) {
	alloc := func() (uint64, error) {
		var id uint64
		err := s.metaCall(ctx, OpMetaAllocPartition, func() error {
			var err error
			id, err = s.meta.AllocPartitionID(ctx)
			return err
		}, nil, func(b []byte) error {
			v, _, err := readInts(b, 1)
			if err == nil {
				id = uint64(v[0])
			}
			return err
		})
		return id, err
	}
	if choose == nil {
		return alloc()
	}
	rank, best := choose(parent)
	var chosen uint64
	chosenRank := 0
	for i := 0; i < maxChildAllocs; i++ {
		id, err := alloc()
		if err != nil {
			if chosen != 0 {
				break // use what we have
			}
			return 0, err
		}
		if r := rank(id); chosen == 0 || r < chosenRank {
			chosen, chosenRank = id, r
		}
		if chosenRank <= best {
			break
		}
	}
	return chosen, nil
}
