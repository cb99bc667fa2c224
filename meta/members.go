package meta

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"sort"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3/raftpb"
)

// Member is a cluster member added after the cluster started (the initial
// members are fixed by --initial-cluster and kept by every node) or an
// initial member removed since.
type Member struct {
	ID       uint64   `json:"id"`
	Name     string   `json:"name"`
	PeerURLs []string `json:"peer_urls"`
	// Removed marks a member taken out of the cluster.
	Removed bool `json:"removed,omitempty"`
}

// Keys: GroupKey(id, "M"+BE64(member)) -> JSON Member.
func (m *Meta) memberKey(id uint64) []byte {
	return engine.PutUint64(engine.GroupKey(m.id, "M"), id)
}

func (m *Meta) loadMembersLocked() error {
	prefix := engine.GroupKey(m.id, "M")
	it, err := m.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: engine.PrefixEnd(prefix)})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		var mem Member
		if err := json.Unmarshal(it.Value(), &mem); err != nil {
			it.Close()
			return errors.New("meta: corrupt member record")
		}
		m.mu.members[mem.ID] = mem
	}
	return it.Close()
}

// SetMember records an added, changed or removed member through raft.
func (m *Meta) SetMember(ctx context.Context, mem Member) error {
	payload, err := json.Marshal(mem)
	if err != nil {
		return err
	}
	_, err = m.proposePayload(ctx, cmdMember, payload)
	return err
}

func (m *Meta) applyMember(ac *raftgroup.ApplyContext, e *raftpb.Entry, cmd []byte) any {
	if term := binary.BigEndian.Uint64(cmd[1:9]); term != e.Term {
		return result{err: ErrStaleTerm}
	}
	var mem Member
	if err := json.Unmarshal(cmd[9:], &mem); err != nil || mem.ID == 0 {
		m.log.Error("malformed member command; rejected", "index", e.Index)
		return result{err: errors.New("meta: malformed member command")}
	}
	v, _ := json.Marshal(mem)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.members[mem.ID] = mem
	must(ac.Batch.Set(m.memberKey(mem.ID), v, nil))
	return result{}
}

// Members returns the member records, by ID.
func (m *Meta) Members() []Member {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]Member, 0, len(m.mu.members))
	for _, mem := range m.mu.members {
		out = append(out, mem)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
