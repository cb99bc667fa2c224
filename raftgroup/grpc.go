package raftgroup

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"google.golang.org/grpc/connectivity"
	"io"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/brainkv/brain/internal/peerconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
)

// The raft transport between nodes is a gRPC service with two
// client-streaming methods: Messages carries batches of raft messages (one
// stream per pair of nodes, each Send carrying every message queued for
// the destination, heartbeats of all groups included), and Snapshot
// carries one snapshot in chunks. Messages are brain's own binary
// encoding (rpccodec), so the service needs no generated code.

// RaftBatch is the raft messages one node sends another in one Send.
type RaftBatch struct {
	From uint64
	Msgs []GroupMessage
	// Queued is the sender's wall clock (Unix nanoseconds) when the
	// oldest of Msgs was handed to its transport; 0: not known (a sender
	// from before the field). It is encoded after the messages, which
	// receivers from before it ignore, and it only feeds
	// brain_raft_batch_transit_seconds.
	Queued int64
}

// BrainMessage marks an internal message (see rpccodec).
func (*RaftBatch) BrainMessage() {}

// Marshal encodes the batch.
func (b *RaftBatch) Marshal() ([]byte, error) {
	size := 20
	for i := range b.Msgs {
		size += 20 + b.Msgs[i].Msg.Size()
	}
	out := make([]byte, 0, size)
	out = binary.AppendUvarint(out, b.From)
	out = binary.AppendUvarint(out, uint64(len(b.Msgs)))
	for i := range b.Msgs {
		m := &b.Msgs[i]
		out = binary.AppendUvarint(out, m.Group)
		n := m.Msg.Size()
		out = binary.AppendUvarint(out, uint64(n))
		off := len(out)
		out = append(out, make([]byte, n)...)
		if _, err := m.Msg.MarshalToSizedBuffer(out[off:]); err != nil {
			return nil, err
		}
	}
	if b.Queued > 0 {
		out = binary.AppendUvarint(out, uint64(b.Queued))
	}
	return out, nil
}

// Unmarshal decodes the batch.
func (b *RaftBatch) Unmarshal(data []byte) error {
	d := byteReader{b: data}
	b.From = d.uvarint()
	n := d.uvarint()
	if d.err != nil || n > uint64(len(data)) {
		return errCorruptMessage
	}
	b.Msgs = make([]GroupMessage, 0, n)
	for i := uint64(0); i < n; i++ {
		var m GroupMessage
		m.Group = d.uvarint()
		body := d.chunk()
		if d.err != nil {
			return d.err
		}
		if err := m.Msg.Unmarshal(body); err != nil {
			return err
		}
		b.Msgs = append(b.Msgs, m)
	}
	b.Queued = 0
	if len(d.b) > 0 {
		if q := d.uvarint(); d.err == nil && q <= math.MaxInt64 {
			b.Queued = int64(q)
		}
	}
	return nil
}

// SnapshotChunk is one message of a snapshot stream: the first carries the
// group and raft message, the others data.
type SnapshotChunk struct {
	Group uint64
	Msg   *raftpb.Message
	Data  []byte
}

// BrainMessage marks an internal message.
func (*SnapshotChunk) BrainMessage() {}

// Marshal encodes the chunk.
func (c *SnapshotChunk) Marshal() ([]byte, error) {
	var msg []byte
	if c.Msg != nil {
		var err error
		if msg, err = c.Msg.Marshal(); err != nil {
			return nil, err
		}
	}
	out := binary.AppendUvarint(nil, c.Group)
	out = binary.AppendUvarint(out, uint64(len(msg)))
	out = append(out, msg...)
	out = binary.AppendUvarint(out, uint64(len(c.Data)))
	return append(out, c.Data...), nil
}

// Unmarshal decodes the chunk.
func (c *SnapshotChunk) Unmarshal(data []byte) error {
	d := byteReader{b: data}
	c.Group = d.uvarint()
	msg := d.chunk()
	c.Data = append([]byte(nil), d.chunk()...)
	if d.err != nil {
		return d.err
	}
	if len(msg) > 0 {
		c.Msg = &raftpb.Message{}
		return c.Msg.Unmarshal(msg)
	}
	return nil
}

// Ack answers a stream; Err is empty on success.
type Ack struct{ Err string }

// BrainMessage marks an internal message.
func (*Ack) BrainMessage() {}

// Marshal encodes the ack.
func (a *Ack) Marshal() ([]byte, error) { return []byte(a.Err), nil }

// Unmarshal decodes the ack.
func (a *Ack) Unmarshal(b []byte) error { a.Err = string(b); return nil }

var errCorruptMessage = errors.New("raftgroup: corrupt transport message")

type byteReader struct {
	b   []byte
	err error
}

func (r *byteReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errCorruptMessage
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *byteReader) chunk() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if uint64(len(r.b)) < n {
		r.err = errCorruptMessage
		return nil
	}
	c := r.b[:n]
	r.b = r.b[n:]
	return c
}

const raftServiceName = "brain.Raft"

type raftServer interface {
	messages(grpc.ServerStream) error
	snapshot(grpc.ServerStream) error
}

var raftServiceDesc = grpc.ServiceDesc{
	ServiceName: raftServiceName,
	HandlerType: (*raftServer)(nil),
	Streams: []grpc.StreamDesc{
		{StreamName: "Messages", ClientStreams: true, Handler: func(srv any, s grpc.ServerStream) error { return srv.(raftServer).messages(s) }},
		{StreamName: "Snapshot", ClientStreams: true, Handler: func(srv any, s grpc.ServerStream) error { return srv.(raftServer).snapshot(s) }},
	},
	Metadata: "brain/raft",
}

// RegisterService serves the raft transport for h on s.
func RegisterService(s *grpc.Server, h *Host) {
	s.RegisterService(&raftServiceDesc, hostServer{h})
}

type hostServer struct{ h *Host }

func (hs hostServer) messages(s grpc.ServerStream) error {
	var from uint64
	for {
		var b RaftBatch
		if err := s.RecvMsg(&b); err != nil {
			if errors.Is(err, io.EOF) {
				return s.SendMsg(&Ack{})
			}
			// The sender's end broke without closing its stream: its
			// process died (a kill, a crash) or the connection failed.
			if from != 0 && s.Context().Err() != nil {
				hs.h.PeerLost(from)
			}
			return err
		}
		from = b.From
		hs.h.metrics.batchesReceived.Inc()
		if b.Queued > 0 {
			// Clamped at 0: the two nodes' clocks may disagree.
			hs.h.metrics.batchTransit.Observe(max(time.Since(time.Unix(0, b.Queued)).Seconds(), 0))
		}
		for i := range b.Msgs {
			hs.h.metrics.received(b.Msgs[i].Msg.Type).Inc()
		}
		hs.h.Deliver(b.Msgs)
	}
}

func (hs hostServer) snapshot(s grpc.ServerStream) error {
	var first SnapshotChunk
	if err := s.RecvMsg(&first); err != nil {
		return err
	}
	if first.Msg == nil {
		return s.SendMsg(&Ack{Err: "snapshot stream without a header"})
	}
	data := first.Data
	for {
		var c SnapshotChunk
		err := s.RecvMsg(&c)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		data = append(data, c.Data...)
	}
	ack := &Ack{}
	if err := hs.h.ReceiveSnapshot(&SnapshotEnvelope{Group: first.Group, Msg: *first.Msg, Data: data}); err != nil {
		ack.Err = err.Error()
	}
	return s.SendMsg(ack)
}

// GRPCTransport sends raft traffic to peers over gRPC.
type GRPCTransport struct {
	self  uint64
	conns *peerconn.Pool
	log   *slog.Logger
	host  *Host

	mu struct {
		sync.Mutex
		peers  map[uint64]*peer
		closed bool
	}
}

// NewGRPCTransport returns a transport for node self that reaches peers
// through conns (which its owner closes). Bind it to the host before
// starting it.
func NewGRPCTransport(self uint64, conns *peerconn.Pool, log *slog.Logger) *GRPCTransport {
	t := &GRPCTransport{self: self, conns: conns, log: log.With("component", "raft-transport")}
	t.mu.peers = make(map[uint64]*peer)
	return t
}

// Bind sets the host to report unreachable peers to.
func (t *GRPCTransport) Bind(h *Host) { t.host = h }

// Close stops every sender.
func (t *GRPCTransport) Close() {
	t.mu.Lock()
	t.mu.closed = true
	peers := t.mu.peers
	t.mu.peers = map[uint64]*peer{}
	t.mu.Unlock()
	for _, p := range peers {
		p.close()
	}
}

func (t *GRPCTransport) peer(to uint64) *peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.closed {
		return nil
	}
	p := t.mu.peers[to]
	if p == nil {
		p = newPeer(t, to)
		t.mu.peers[to] = p
	}
	return p
}

// Send implements Transport: messages are queued for the peer's sender.
func (t *GRPCTransport) Send(to uint64, msgs []GroupMessage) {
	if p := t.peer(to); p != nil {
		p.enqueue(msgs)
	}
}

// SendSnapshot implements Transport.
func (t *GRPCTransport) SendSnapshot(ctx context.Context, to uint64, env *SnapshotEnvelope) error {
	p := t.peer(to)
	if p == nil {
		return errors.New("raftgroup: transport closed")
	}
	conn, err := p.t.conns.Conn(p.to)
	if err != nil {
		return err
	}
	s, err := conn.NewStream(ctx, &raftServiceDesc.Streams[1], "/"+raftServiceName+"/Snapshot")
	if err != nil {
		return err
	}
	msg := env.Msg
	if err := s.SendMsg(&SnapshotChunk{Group: env.Group, Msg: &msg}); err != nil {
		return err
	}
	const chunk = 1 << 20
	for off := 0; off < len(env.Data); off += chunk {
		end := min(off+chunk, len(env.Data))
		if err := s.SendMsg(&SnapshotChunk{Group: env.Group, Data: env.Data[off:end]}); err != nil {
			return err
		}
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	var ack Ack
	if err := s.RecvMsg(&ack); err != nil {
		return err
	}
	if ack.Err != "" {
		return errors.New(ack.Err)
	}
	return nil
}

// maxQueued bounds the messages queued for one peer; past it messages are
// dropped (raft retransmits).
const maxQueued = 10000

// peer is the sender to one node: a queue drained by one goroutine into
// one gRPC stream, one Send per batch.
type peer struct {
	t  *GRPCTransport
	to uint64

	mu     sync.Mutex
	cond   *sync.Cond
	queue  []GroupMessage // protected by mu
	queued int64          // when the first of queue was queued (Unix ns); protected by mu
	closed bool           // protected by mu
	done   chan struct{}
}

func newPeer(t *GRPCTransport, to uint64) *peer {
	p := &peer{t: t, to: to, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	go p.run()
	return p
}

func (p *peer) enqueue(msgs []GroupMessage) {
	p.mu.Lock()
	if len(p.queue)+len(msgs) <= maxQueued {
		if len(p.queue) == 0 {
			p.queued = time.Now().UnixNano()
		}
		p.queue = append(p.queue, msgs...)
	}
	p.cond.Signal()
	p.mu.Unlock()
}

func (p *peer) close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
	<-p.done
}

func (p *peer) run() {
	defer close(p.done)
	var stream grpc.ClientStream
	var cancel context.CancelFunc
	backoff := 10 * time.Millisecond
	var sent *sentCounters
	if p.t.host != nil {
		to := fmt.Sprintf("%x", p.to)
		sent = &sentCounters{p.t.host.metrics.batchesSent.WithLabelValues(to), p.t.host.metrics.messagesSent.WithLabelValues(to)}
	}
	for {
		p.mu.Lock()
		if len(p.queue) == 0 && !p.closed {
			for len(p.queue) == 0 && !p.closed {
				p.cond.Wait()
			}
			// As kvapi's Calls stream does: let the other ready
			// goroutines (raft workers finishing their rounds) queue
			// their messages, so that one Send carries them all; the
			// wake-up made this goroutine the next to run.
			p.mu.Unlock()
			runtime.Gosched()
			p.mu.Lock()
		}
		if p.closed {
			p.mu.Unlock()
			if cancel != nil {
				cancel()
			}
			return
		}
		batch, queued := p.queue, p.queued
		p.queue = nil
		p.mu.Unlock()
		if p.t.host != nil {
			p.t.host.metrics.sendQueue.Observe(time.Since(time.Unix(0, queued)).Seconds())
		}

		var conn *grpc.ClientConn
		if stream == nil {
			var err error
			conn, err = p.t.conns.Conn(p.to)
			if err == nil {
				var ctx context.Context
				ctx, cancel = context.WithCancel(context.Background())
				stream, err = conn.NewStream(ctx, &raftServiceDesc.Streams[0], "/"+raftServiceName+"/Messages")
				if err != nil {
					cancel()
				}
			}
			if err != nil {
				p.unreachable(batch, err)
				waitReconnect(conn, backoff)
				backoff = min(2*backoff, time.Second)
				continue
			}
		}
		if err := stream.SendMsg(&RaftBatch{From: p.t.self, Msgs: batch, Queued: queued}); err != nil {
			cancel()
			stream = nil
			p.unreachable(batch, err)
			waitReconnect(conn, backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		if sent != nil {
			sent.batches.Inc()
			sent.messages.Add(float64(len(batch)))
		}
		backoff = 10 * time.Millisecond
	}
}

// waitReconnect pauses a sender whose stream failed for up to d, but
// returns as soon as conn (nil: none yet) is connected again: a node back
// from a restart hears its leaders' heartbeats within gRPC's reconnection
// delay (rpccodec.PeerReconnect), not after a pause that grew while it was
// down. A connection that is up although the stream failed (the peer
// refused it) waits the whole d.
func waitReconnect(conn *grpc.ClientConn, d time.Duration) {
	if conn == nil || conn.GetState() == connectivity.Ready {
		time.Sleep(d)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
		if st == connectivity.Idle {
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, st) {
			return
		}
	}
}

// sentCounters count what a peer's sender sent
// (brain_raft_batches_sent_total and _messages_sent_total).
type sentCounters struct{ batches, messages prometheus.Counter }

// unreachable tells raft the peer did not get messages, so it backs off
// replicating to it.
func (p *peer) unreachable(batch []GroupMessage, err error) {
	p.t.log.Debug("peer unreachable", "to", fmt.Sprintf("%x", p.to), "err", err)
	if p.t.host == nil {
		return
	}
	seen := map[uint64]bool{}
	for _, m := range batch {
		if !seen[m.Group] {
			seen[m.Group] = true
			p.t.host.ReportUnreachable(m.Group, p.to)
		}
	}
}
