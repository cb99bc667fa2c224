package raftgroup

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/raft/v3/raftpb"
)

// GroupMessage is a raft message addressed to one group.
type GroupMessage struct {
	Group uint64
	Msg   raftpb.Message
}

// Transport carries raft messages between hosts. Send must not block for
// long and may drop messages: raft retransmits. SendSnapshot delivers a
// snapshot to the peer's Host.ReceiveSnapshot and returns its outcome.
type Transport interface {
	Send(to uint64, msgs []GroupMessage)
	SendSnapshot(ctx context.Context, to uint64, env *SnapshotEnvelope) error
}

type nopTransport struct{}

func (nopTransport) Send(uint64, []GroupMessage) {}

func (nopTransport) SendSnapshot(context.Context, uint64, *SnapshotEnvelope) error {
	return errors.New("raftgroup: no transport")
}

// MemTransport connects hosts in one process, for tests. A Filter, if set,
// can drop or delay messages.
type MemTransport struct {
	mu    sync.RWMutex
	hosts map[uint64]*Host
	// Filter returns false to drop msg from -> to. Protected by mu.
	filter func(from, to uint64, m GroupMessage) bool
}

// NewMemTransport returns an empty in-process transport.
func NewMemTransport() *MemTransport {
	return &MemTransport{hosts: make(map[uint64]*Host)}
}

// Register makes h reachable as node id.
func (t *MemTransport) Register(id uint64, h *Host) {
	t.mu.Lock()
	t.hosts[id] = h
	t.mu.Unlock()
}

// Unregister makes node id unreachable.
func (t *MemTransport) Unregister(id uint64) {
	t.mu.Lock()
	delete(t.hosts, id)
	t.mu.Unlock()
}

// SetFilter installs a message filter (nil: deliver everything).
func (t *MemTransport) SetFilter(f func(from, to uint64, m GroupMessage) bool) {
	t.mu.Lock()
	t.filter = f
	t.mu.Unlock()
}

// From returns the Transport for node from.
func (t *MemTransport) From(from uint64) Transport { return memSender{t, from} }

type memSender struct {
	t    *MemTransport
	from uint64
}

func (s memSender) SendSnapshot(ctx context.Context, to uint64, env *SnapshotEnvelope) error {
	s.t.mu.RLock()
	h, f := s.t.hosts[to], s.t.filter
	s.t.mu.RUnlock()
	if h == nil || f != nil && !f(s.from, to, GroupMessage{Group: env.Group, Msg: env.Msg}) {
		return fmt.Errorf("raftgroup: node %d unreachable", to)
	}
	return h.ReceiveSnapshot(env)
}

func (s memSender) Send(to uint64, msgs []GroupMessage) {
	s.t.mu.RLock()
	h, f := s.t.hosts[to], s.t.filter
	s.t.mu.RUnlock()
	if h == nil {
		return
	}
	out := make([]GroupMessage, 0, len(msgs))
	for _, m := range msgs {
		if f == nil || f(s.from, to, m) {
			out = append(out, m)
		}
	}
	h.Deliver(out)
}
