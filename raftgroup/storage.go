package raftgroup

import (
	"encoding/binary"
	"fmt"

	"github.com/brainkv/brain/engine"
	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// InitialIndex and InitialTerm are the synthetic truncated state every new
// group starts from (as CockroachDB's raftInitialLogIndex): the log is empty
// up to InitialIndex, and the initial voters are the conf state at that
// point, so all replicas of a group agree on the log from the start.
const (
	InitialIndex = 5
	InitialTerm  = 5
)

// Raft keys: RaftPrefix + BE64(group) + kind [+ BE64(index)].
const (
	kindLog       = 'l'
	kindHardState = 'h'
	kindTruncated = 't'
	kindConfState = 'c'
	kindApplied   = 'a'
)

func raftKey(group uint64, kind byte) []byte {
	k := make([]byte, 0, 18)
	k = append(k, engine.RaftPrefix)
	k = engine.PutUint64(k, group)
	return append(k, kind)
}

func logKey(group, index uint64) []byte {
	return engine.PutUint64(raftKey(group, kindLog), index)
}

// groupSpan returns the span of every raft key of group.
func groupSpan(group uint64) (start, end []byte) {
	start = append([]byte{engine.RaftPrefix}, engine.PutUint64(nil, group)...)
	return start, engine.PrefixEnd(start)
}

// persistedState is what a group loads on restart.
type persistedState struct {
	hard      raftpb.HardState
	conf      raftpb.ConfState
	truncIdx  uint64
	truncTerm uint64
	applied   uint64
	entries   []raftpb.Entry
	exists    bool
}

func getProto(r pebble.Reader, key []byte, m interface{ Unmarshal([]byte) error }) (bool, error) {
	v, closer, err := r.Get(key)
	if err == pebble.ErrNotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer closer.Close()
	return true, m.Unmarshal(v)
}

func loadState(db *pebble.DB, group uint64) (*persistedState, error) {
	st := &persistedState{}
	ok, err := getProto(db, raftKey(group, kindHardState), &st.hard)
	if err != nil {
		return nil, fmt.Errorf("raftgroup: load hard state of group %d: %w", group, err)
	}
	st.exists = ok
	if !ok {
		return st, nil
	}
	if _, err := getProto(db, raftKey(group, kindConfState), &st.conf); err != nil {
		return nil, fmt.Errorf("raftgroup: load conf state of group %d: %w", group, err)
	}
	if v, closer, err := db.Get(raftKey(group, kindTruncated)); err == nil {
		st.truncIdx = binary.BigEndian.Uint64(v[0:8])
		st.truncTerm = binary.BigEndian.Uint64(v[8:16])
		closer.Close()
	} else {
		return nil, fmt.Errorf("raftgroup: load truncated state of group %d: %w", group, err)
	}
	if v, closer, err := db.Get(raftKey(group, kindApplied)); err == nil {
		st.applied = binary.BigEndian.Uint64(v)
		closer.Close()
	} else if err != pebble.ErrNotFound {
		return nil, err
	}
	if st.applied < st.truncIdx {
		// A snapshot was applied: it is the applied state.
		st.applied = st.truncIdx
	}
	// A snapshot is committed by definition. Data written before the hard
	// state was saved with the snapshot can hold a commit index (and term)
	// below it, which raft refuses to load.
	if st.hard.Commit < st.truncIdx {
		st.hard.Commit = st.truncIdx
	}
	if st.hard.Term < st.truncTerm {
		st.hard.Term, st.hard.Vote = st.truncTerm, 0
	}
	iter, err := db.NewIter(&pebble.IterOptions{
		LowerBound: logKey(group, st.truncIdx+1),
		UpperBound: engine.PrefixEnd(raftKey(group, kindLog)),
	})
	if err != nil {
		return nil, err
	}
	defer iter.Close()
	next := st.truncIdx + 1
	for iter.First(); iter.Valid(); iter.Next() {
		var e raftpb.Entry
		if err := e.Unmarshal(iter.Value()); err != nil {
			return nil, fmt.Errorf("raftgroup: group %d: corrupt log entry: %w", group, err)
		}
		if e.Index != next {
			return nil, fmt.Errorf("raftgroup: group %d: log gap: want index %d, found %d", group, next, e.Index)
		}
		next++
		st.entries = append(st.entries, e)
	}
	return st, iter.Error()
}

// writeBootstrap writes the initial persisted state of a new group.
// WriteBootstrap writes into b the initial state of a new replica of group
// with configuration cs, as CreateGroup does: replicas bootstrapped with
// the same configuration agree on their log (a split creates its child
// group this way on every replica of the parent, in the parent's apply).
func WriteBootstrap(b *pebble.Batch, group uint64, cs raftpb.ConfState) error {
	return writeBootstrap(b, group, cs)
}

func writeBootstrap(b *pebble.Batch, group uint64, cs raftpb.ConfState) error {
	hs := raftpb.HardState{Term: InitialTerm, Commit: InitialIndex}
	if err := setProto(b, raftKey(group, kindHardState), &hs); err != nil {
		return err
	}
	if err := setProto(b, raftKey(group, kindConfState), &cs); err != nil {
		return err
	}
	if err := setTruncated(b, group, InitialIndex, InitialTerm); err != nil {
		return err
	}
	return setApplied(b, group, InitialIndex, InitialTerm)
}

func setProto(b *pebble.Batch, key []byte, m interface{ Marshal() ([]byte, error) }) error {
	v, err := m.Marshal()
	if err != nil {
		return err
	}
	return b.Set(key, v, nil)
}

func setTruncated(b *pebble.Batch, group, index, term uint64) error {
	v := engine.PutUint64(engine.PutUint64(nil, index), term)
	return b.Set(raftKey(group, kindTruncated), v, nil)
}

// setApplied records the applied index and the term of that entry.
func setApplied(b *pebble.Batch, group, index, term uint64) error {
	return b.Set(raftKey(group, kindApplied), engine.PutUint64(engine.PutUint64(nil, index), term), nil)
}

// readApplied reads the applied index and term, and the conf state, from r
// (a Pebble snapshot when building a raft snapshot).
func readApplied(r pebble.Reader, group uint64) (index, term uint64, cs raftpb.ConfState, err error) {
	v, closer, err := r.Get(raftKey(group, kindApplied))
	if err != nil {
		return 0, 0, cs, err
	}
	if len(v) != 16 {
		closer.Close()
		return 0, 0, cs, fmt.Errorf("raftgroup: group %d: applied state has no term", group)
	}
	index, term = binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
	closer.Close()
	if _, err := getProto(r, raftKey(group, kindConfState), &cs); err != nil {
		return 0, 0, cs, err
	}
	return index, term, cs, nil
}

// appendReady writes a Ready's entries and hard state to b. lastIndex is the
// group's last log index before this Ready; entries that overwrite a suffix
// of the log delete the rest of the old suffix.
func appendReady(b *pebble.Batch, group uint64, rd *raft.Ready, lastIndex uint64) error {
	var key []byte
	for i := range rd.Entries {
		e := &rd.Entries[i]
		key = engine.PutUint64(append(key[:0], raftKey(group, kindLog)...), e.Index)
		op := b.SetDeferred(len(key), e.Size())
		copy(op.Key, key)
		if _, err := e.MarshalToSizedBuffer(op.Value); err != nil {
			return err
		}
		if err := op.Finish(); err != nil {
			return err
		}
	}
	if n := len(rd.Entries); n > 0 {
		last := rd.Entries[n-1].Index
		if last < lastIndex {
			if err := b.DeleteRange(logKey(group, last+1), logKey(group, lastIndex+1), nil); err != nil {
				return err
			}
		}
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		if err := setProto(b, raftKey(group, kindHardState), &rd.HardState); err != nil {
			return err
		}
	}
	return nil
}

// newMemoryStorage rebuilds a group's in-memory log from its persisted state.
func newMemoryStorage(st *persistedState) (*raft.MemoryStorage, error) {
	ms := raft.NewMemoryStorage()
	snap := raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{
		Index: st.truncIdx, Term: st.truncTerm, ConfState: st.conf,
	}}
	if err := ms.ApplySnapshot(snap); err != nil {
		return nil, err
	}
	if err := ms.SetHardState(st.hard); err != nil {
		return nil, err
	}
	if len(st.entries) > 0 {
		if err := ms.Append(st.entries); err != nil {
			return nil, err
		}
	}
	return ms, nil
}

// HasState reports whether db holds raft state for group: the node has a
// replica of it (bootstrapped, or added and not removed).
func HasState(db *pebble.DB, group uint64) (bool, error) {
	st, err := loadState(db, group)
	if err != nil {
		return false, err
	}
	return st.exists, nil
}
