package raftgroup

import (
	"github.com/brainkv/brain/engine"

	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Snapshots.
//
// raft's Storage.Snapshot returns metadata only (snapStorage). When raft
// asks to send a snapshot (a MsgSnap), the host takes a Pebble snapshot,
// reads the group's applied index, its term and the conf state from it - so
// the metadata describes exactly the data - and lets the state machine emit
// its replicated key/values from the same Pebble snapshot. The transport
// carries the envelope; the receiver steps the message, and when raft
// accepts it, the round clears the state machine's state and writes the
// snapshot's key/values, the raft state and the log truncation in the
// round's batch, atomically.
//
// Snapshot data is held in memory (fine for the metadata sizes brain is
// built for; streaming through a temporary file is future work).

// Snapshotter is implemented by state machines whose replicas can be
// created or caught up from a snapshot.
type Snapshotter interface {
	// WriteSnapshot emits every key/value of the state machine's replicated
	// state in r, a consistent Pebble snapshot.
	WriteSnapshot(r pebble.Reader, emit func(key, value []byte) error) error
	// ClearState deletes the state machine's replicated state into b; the
	// snapshot's key/values are written after it in the same batch.
	ClearState(b *pebble.Batch) error
	// SnapshotApplied runs after a snapshot committed: the state machine
	// reloads what it keeps in memory. Called on the worker goroutine.
	SnapshotApplied() error
}

// SnapshotChecker is implemented by state machines that may refuse a
// snapshot before raft sees it (the sender then retries later).
type SnapshotChecker interface {
	// CheckSnapshot inspects a snapshot's key/values (ForEachSnapshotKV).
	CheckSnapshot(data []byte) error
}

// ForEachSnapshotKV calls fn for each key/value of snapshot data until
// fn returns false.
func ForEachSnapshotKV(data []byte, fn func(k, v []byte) bool) error {
	for len(data) > 0 {
		k, rest, err := readChunk(data)
		if err != nil {
			return err
		}
		v, rest, err := readChunk(rest)
		if err != nil {
			return err
		}
		if !fn(k, v) {
			return nil
		}
		data = rest
	}
	return nil
}

// SnapshotEnvelope is a snapshot in transit: the raft message (whose
// Snapshot metadata describes Data) and the state machine's key/values.
type SnapshotEnvelope struct {
	Group uint64
	Msg   raftpb.Message
	// Data is a sequence of uvarint-length-prefixed key, value pairs.
	Data []byte
}

// ErrNoSnapshotter: the group's state machine cannot be snapshotted.
var ErrNoSnapshotter = errors.New("raftgroup: state machine does not support snapshots")

// snapStorage is the raft.Storage of a group: the in-memory log, and
// snapshot metadata at the applied index (the data is produced when the
// snapshot is sent).
type snapStorage struct {
	*raft.MemoryStorage
	g *Group
}

// Snapshot implements raft.Storage. It runs on the worker that owns g.
func (s snapStorage) Snapshot() (raftpb.Snapshot, error) {
	g := s.g
	term, err := s.MemoryStorage.Term(g.applied)
	if err != nil {
		// The applied index is behind the in-memory log's start (just
		// after a snapshot was applied): the stored snapshot is current.
		return s.MemoryStorage.Snapshot()
	}
	return raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: g.applied, Term: term, ConfState: g.conf}}, nil
}

// snapTo names the replica a snapshot goes to.
type snapTo struct{ group, to uint64 }

// sendSnapshot builds and sends the snapshot a MsgSnap announces, off the
// worker, and reports the outcome to raft.
//
// While a snapshot is on its way to a replica, another MsgSnap for it is
// not sent: the one on its way answers both. Raft asks for another when
// the leadership changed meanwhile (the new term's progress starts over),
// or when the report of an earlier term's snapshot moved the replica out
// of waiting for the later one; each costs the leader a build and the
// replica an install of the group's whole state (in a 6-node benchmark
// round, three of 15 MB went to one learner within 17 s, each taking
// 11-16 s at 0.1 CPU). The replica installs the one on its way; if the
// log after it was truncated meanwhile, raft asks for another after its
// report, when none is on its way.
func (h *Host) sendSnapshot(g *Group, m raftpb.Message) {
	key := snapTo{g.id, m.To}
	h.snaps.Lock()
	if h.snaps.sending[key] {
		h.snaps.Unlock()
		h.metrics.snapshotsJoined.Inc()
		h.log.Info("a snapshot is already on its way to the replica; not sending another", "group", g.id, "to", m.To)
		return
	}
	if h.snaps.sending == nil {
		h.snaps.sending = make(map[snapTo]bool)
	}
	h.snaps.sending[key] = true
	h.snaps.Unlock()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		status := raft.SnapshotFinish
		if err := h.buildAndSend(g, m); err != nil {
			h.log.Warn("sending snapshot failed", "group", g.id, "to", m.To, "err", err)
			status = raft.SnapshotFailure
		}
		// Done before the report, so a MsgSnap raft sends after it is
		// sent.
		h.snaps.Lock()
		delete(h.snaps.sending, key)
		h.snaps.Unlock()
		g.inbox.Lock()
		g.inbox.snapReports = append(g.inbox.snapReports, snapReport{to: m.To, status: status})
		g.inbox.Unlock()
		h.sched.enqueue(g)
	}()
}

func (h *Host) buildAndSend(g *Group, m raftpb.Message) error {
	sn, ok := g.sm.(Snapshotter)
	if !ok {
		return ErrNoSnapshotter
	}
	snap := h.db.NewSnapshot()
	defer snap.Close()
	index, term, cs, err := readApplied(snap, g.id)
	if err != nil {
		return err
	}
	var data []byte
	n := 0
	err = sn.WriteSnapshot(snap, func(k, v []byte) error {
		data = binary.AppendUvarint(data, uint64(len(k)))
		data = append(data, k...)
		data = binary.AppendUvarint(data, uint64(len(v)))
		data = append(data, v...)
		n++
		return nil
	})
	if err != nil {
		return err
	}
	// The metadata describes the data: the state at the applied index read
	// from the same Pebble snapshot, which may be past what raft asked for.
	m.Snapshot = &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: index, Term: term, ConfState: cs}}
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.SnapshotTimeout)
	defer cancel()
	start := time.Now()
	err = h.transport.SendSnapshot(ctx, m.To, &SnapshotEnvelope{Group: g.id, Msg: m, Data: data})
	if err == nil {
		h.metrics.snapshotsSent.Inc()
		h.log.Info("sent snapshot", "group", g.id, "to", m.To, "index", index, "keys", n, "bytes", len(data), "took", time.Since(start))
	}
	return err
}

// ReceiveSnapshot hands a snapshot received from a peer to its group,
// creating the replica if this node does not host it yet. It returns once
// the group has taken the message (raft decides whether to apply it).
func (h *Host) ReceiveSnapshot(env *SnapshotEnvelope) error {
	g, err := h.groupOrCreate(env.Group)
	if err != nil {
		return err
	}
	if g == nil {
		return fmt.Errorf("raftgroup: no group %d here and no replica factory", env.Group)
	}
	if c, ok := g.sm.(SnapshotChecker); ok {
		if err := c.CheckSnapshot(env.Data); err != nil {
			return err
		}
	}
	g.inbox.Lock()
	if g.inbox.snapData == nil {
		g.inbox.snapData = make(map[uint64][]byte)
	}
	g.inbox.snapData[env.Msg.Snapshot.Metadata.Index] = env.Data
	g.inbox.msgs = append(g.inbox.msgs, env.Msg)
	g.inbox.Unlock()
	h.sched.enqueue(g)
	h.metrics.snapshotsReceived.Inc()
	return nil
}

// applySnapshot writes an accepted snapshot into the round's batch. It runs
// on the worker before the Ready's entries are appended.
func (h *Host) applySnapshot(b *pebble.Batch, g *Group, snap raftpb.Snapshot) error {
	idx := snap.Metadata.Index
	g.inbox.Lock()
	data, ok := g.inbox.snapData[idx]
	for i := range g.inbox.snapData {
		if i <= idx {
			delete(g.inbox.snapData, i)
		}
	}
	g.inbox.Unlock()
	if !ok {
		return fmt.Errorf("raftgroup: group %d: accepted snapshot at %d without its data", g.id, idx)
	}
	sn, ok := g.sm.(Snapshotter)
	if !ok {
		return ErrNoSnapshotter
	}
	if err := sn.ClearState(b); err != nil {
		return err
	}
	var setErr error
	if err := ForEachSnapshotKV(data, func(k, v []byte) bool {
		setErr = b.Set(k, v, nil)
		return setErr == nil
	}); err != nil {
		return err
	}
	if setErr != nil {
		return setErr
	}
	// The whole local log is replaced: entries after the snapshot, if any,
	// come in the Ready's Entries and are written after this.
	if err := b.DeleteRange(logKey(g.id, 0), engine.PrefixEnd(raftKey(g.id, kindLog)), nil); err != nil {
		return err
	}
	if err := setProto(b, raftKey(g.id, kindConfState), &snap.Metadata.ConfState); err != nil {
		return err
	}
	if err := setTruncated(b, g.id, idx, snap.Metadata.Term); err != nil {
		return err
	}
	return setApplied(b, g.id, idx, snap.Metadata.Term)
}

func readChunk(b []byte) (chunk, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return nil, nil, errors.New("raftgroup: corrupt snapshot data")
	}
	return b[k : k+int(n)], b[k+int(n):], nil
}

// snapshotApplied updates the group's in-memory raft state after the round
// holding the snapshot committed.
func (h *Host) snapshotApplied(g *Group, snap raftpb.Snapshot) error {
	if err := g.ms.ApplySnapshot(snap); err != nil && err != raft.ErrSnapOutOfDate {
		return err
	}
	idx := snap.Metadata.Index
	g.applied, g.appliedTerm = idx, snap.Metadata.Term
	g.firstIndex, g.lastIndex = idx+1, idx
	g.conf = snap.Metadata.ConfState
	g.pruneHeartbeatState()
	h.log.Info("applied snapshot", "group", g.id, "index", idx, "voters", g.conf.Voters, "learners", g.conf.Learners)
	if sn, ok := g.sm.(Snapshotter); ok {
		return sn.SnapshotApplied()
	}
	return nil
}

// installSnapshot writes an accepted snapshot (and the Ready's hard state)
// in its own synced batch and reloads the group.
func (h *Host) installSnapshot(g *Group, snap raftpb.Snapshot, hs raftpb.HardState) error {
	b := h.db.NewBatch()
	defer b.Close()
	if err := h.applySnapshot(b, g, snap); err != nil {
		return err
	}
	// The hard state that came with the snapshot (its commit index is at
	// least the snapshot's) goes in the same batch: a crash between the
	// two would leave a commit index below the log's first index, which
	// raft refuses to load.
	if !raft.IsEmptyHardState(hs) {
		// Entries after the snapshot are persisted later in the round.
		hs.Commit = min(hs.Commit, snap.Metadata.Index)
		if err := setProto(b, raftKey(g.id, kindHardState), &hs); err != nil {
			return err
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("raftgroup: install snapshot: %w", err)
	}
	return h.snapshotApplied(g, snap)
}

func confContext(cc raftpb.ConfChangeI) []byte {
	switch c := cc.(type) {
	case raftpb.ConfChange:
		return c.Context
	case raftpb.ConfChangeV2:
		return c.Context
	}
	return nil
}
