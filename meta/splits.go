package meta

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3/raftpb"
)

// The partition map's history. The initial partitions come from the
// cluster's split points (every node has them); each later split is a
// Split record, appended in the order the parent's leader reports them
// (RecordSplits). Replaying the records over the initial partitions, each
// once its parent is known, gives the map (see server's partition map).

// Split records a split: keys from Key on, up to the parent's end at the
// time, moved from partition Parent to partition Child.
type Split struct {
	Parent uint64 `json:"parent"`
	Child  uint64 `json:"child"`
	Key    []byte `json:"key"`
}

// FirstAllocatedPartition is the first partition ID AllocPartitionID
// hands out: IDs below are the initial partitions'.
const FirstAllocatedPartition = 1 << 16

// Keys: GroupKey(id, "S"+BE64(seq)) -> JSON Split; GroupKey(id, "nextpart")
// -> BE64(the next partition ID to allocate).
func (m *Meta) splitKey(seq uint64) []byte {
	return engine.PutUint64(engine.GroupKey(m.id, "S"), seq)
}

func (m *Meta) nextPartKey() []byte { return engine.GroupKey(m.id, "nextpart") }

func (m *Meta) loadSplitsLocked() error {
	m.mu.splits = nil
	m.mu.children = make(map[uint64]bool)
	m.mu.nextPart = FirstAllocatedPartition
	prefix := engine.GroupKey(m.id, "S")
	it, err := m.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: engine.PrefixEnd(prefix)})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		var s Split
		if err := json.Unmarshal(it.Value(), &s); err != nil {
			it.Close()
			return errors.New("meta: corrupt split record")
		}
		m.mu.splits = append(m.mu.splits, s)
		m.mu.children[s.Child] = true
	}
	if err := it.Close(); err != nil {
		return err
	}
	if v, closer, err := m.db.Get(m.nextPartKey()); err == nil {
		m.mu.nextPart = binary.BigEndian.Uint64(v)
		closer.Close()
	} else if err != pebble.ErrNotFound {
		return err
	}
	return nil
}

// SetOnSplits sets a function called (without locks held, on the raft
// worker: it must not block) after the split records changed.
func (m *Meta) SetOnSplits(f func()) { m.onSplits = f }

// Splits returns the split records in the order they were recorded.
func (m *Meta) Splits() []Split {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]Split(nil), m.mu.splits...)
}

// RecordSplits appends the splits of one parent not recorded yet, in
// order, through raft (on the leader).
func (m *Meta) RecordSplits(ctx context.Context, splits []Split) error {
	payload, err := json.Marshal(splits)
	if err != nil {
		return err
	}
	_, err = m.proposePayload(ctx, cmdSplits, payload)
	return err
}

// AllocPartitionID returns a partition ID never handed out before.
func (m *Meta) AllocPartitionID(ctx context.Context) (uint64, error) {
	res, err := m.proposePayload(ctx, cmdAllocPartition, nil)
	if err != nil {
		return 0, err
	}
	return res.id, nil
}

// proposePayload proposes a command of the given kind in the current
// term and returns its result. A proposal raft refused because this
// replica does not lead (or no longer does) fails with ErrNotLeader, the
// error callers retry on the leader: it did not execute.
func (m *Meta) proposePayload(ctx context.Context, kind byte, payload []byte) (result, error) {
	m.mu.RLock()
	leader, term := m.mu.leader, m.mu.term
	m.mu.RUnlock()
	g := m.group.Load()
	if !leader || g == nil {
		return result{}, ErrNotLeader
	}
	b := append(raftgroup.NewCommand(9+len(payload)), kind)
	b = binary.BigEndian.AppendUint64(b, term)
	b = append(b, payload...)
	// With its fate: a command in flight when the leadership moves (a
	// planned transfer) gets its result if the next leader commits it, and
	// ErrNotLeader (not executed: the caller retries at the leader) if it
	// never will; "leader changed" only if this replica is cut off.
	done := make(chan struct{})
	var res any
	var err error
	g.ProposeAsyncFate(b, func(r any, e error) {
		res, err = r, e
		close(done)
	})
	select {
	case <-done:
	case <-ctx.Done():
		return result{}, ctx.Err()
	}
	if errors.Is(err, raftgroup.ErrNotLeader) {
		return result{}, ErrNotLeader
	}
	if err != nil {
		return result{}, err
	}
	r := res.(result)
	return r, r.err
}

// applyPayload applies the commands with a payload other than members.
func (m *Meta) applyPayload(ac *raftgroup.ApplyContext, e *raftpb.Entry, cmd []byte) any {
	if term := binary.BigEndian.Uint64(cmd[1:9]); term != e.Term {
		return result{err: ErrStaleTerm}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch cmd[0] {
	case cmdAllocPartition:
		id := m.mu.nextPart
		m.mu.nextPart++
		must(ac.Batch.Set(m.nextPartKey(), engine.PutUint64(nil, m.mu.nextPart), nil))
		return result{id: id}
	case cmdSplits:
		var splits []Split
		if err := json.Unmarshal(cmd[9:], &splits); err != nil {
			m.log.Error("malformed splits command; rejected", "index", e.Index)
			return result{err: errors.New("meta: malformed splits command")}
		}
		added := false
		for _, s := range splits {
			if s.Child == 0 || m.mu.children[s.Child] {
				continue
			}
			v, _ := json.Marshal(s)
			must(ac.Batch.Set(m.splitKey(uint64(len(m.mu.splits))), v, nil))
			m.mu.splits = append(m.mu.splits, s)
			m.mu.children[s.Child] = true
			added = true
		}
		if added && m.onSplits != nil {
			ac.AfterCommit(m.onSplits)
		}
		return result{}
	}
	return result{err: errors.New("meta: unknown command")}
}
