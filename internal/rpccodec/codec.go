package rpccodec

import (
	"google.golang.org/grpc/backoff"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
)

// Name is the codec's name. It replaces "proto" on brain's servers and on
// node-to-node connections; etcd clients keep sending "proto" and get
// protobuf.
const Name = "proto"

// Raw is a message already in wire format.
type Raw struct{ B []byte }

// Pooled is a message already in wire format, written into a buffer of
// gRPC's buffer pool, which gRPC puts back once it has written the
// message: for large messages sent often (watch responses), whose fresh
// buffers would cost the garbage collector and page faults. Write the
// message into Buf, keep it within Buf's capacity, and send it once
// (Message); touch neither afterwards.
type Pooled struct {
	// Buf has room for the message (len 0, cap at least the size asked).
	Buf  []byte
	pool *[]byte
}

// NewPooled returns a Pooled message with room for size bytes.
func NewPooled(size int) *Pooled {
	p := mem.DefaultBufferPool().Get(size)
	return &Pooled{Buf: (*p)[:0], pool: p}
}

// Bytes is the message Message made (for fakes of a stream in tests:
// gRPC may have put the buffer back by the time SendMsg returned).
func (p *Pooled) Bytes() []byte { return *p.pool }

// Message returns what to send: b (Buf with the message appended) in the
// pooled buffer, or, if b outgrew it, b as a Raw message.
func (p *Pooled) Message(b []byte) any {
	if len(b) == 0 || cap(b) != cap(*p.pool) || &b[:1][0] != &(*p.pool)[:1][0] {
		return &Raw{B: b}
	}
	*p.pool = (*p.pool)[:len(b)]
	return p
}

// Binary is a message that marshals itself.
type Binary interface {
	Marshal() ([]byte, error)
	Unmarshal([]byte) error
}

// Codec implements encoding.CodecV2.
type Codec struct{ proto encoding.CodecV2 }

// New returns the codec.
func New() Codec { return Codec{proto: encoding.GetCodecV2("proto")} }

// Marshal implements encoding.CodecV2.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *Raw:
		return mem.BufferSlice{mem.SliceBuffer(m.B)}, nil
	case *Pooled:
		return mem.BufferSlice{mem.NewBuffer(m.pool, mem.DefaultBufferPool())}, nil
	case scattered:
		parts := m.MarshalScattered()
		bs := make(mem.BufferSlice, len(parts))
		for i, p := range parts {
			bs[i] = mem.SliceBuffer(p)
		}
		return bs, nil
	case internal:
		b, err := m.Marshal()
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.proto.Marshal(v)
}

// Unmarshal implements encoding.CodecV2.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(internal); ok {
		return m.Unmarshal(data.Materialize())
	}
	return c.proto.Unmarshal(data, v)
}

// Name implements encoding.CodecV2.
func (Codec) Name() string { return Name }

// internal marks brain's own messages (they implement Binary and
// BrainMessage), which must never go through the protobuf codec.
type internal interface {
	Binary
	BrainMessage()
}

// Scattered is an internal message that marshals itself as several byte
// slices, which go out as they are (not first copied into one): a batch
// of encoded calls.
type Scattered interface {
	MarshalScattered() [][]byte
}

type scattered interface {
	internal
	Scattered
}

// Keepalive of connections between nodes. A side that has read nothing
// from its peer for PeerKeepaliveTime pings it, and closes the connection
// if it then reads nothing for PeerKeepaliveTimeout more: a connection to
// a node that stopped (paused, partitioned) breaks instead of hanging its
// streams and calls.
//
// The bound must not be reached by a node that is only slow. A node
// starved of CPU by its cgroup quota, or a test process under -race on a
// loaded machine, can fail to read for a second or two; with 1 s and 1 s
// such nodes lost their connections, and every forwarded write in flight
// on them failed with "leader changed". etcd's peer streams time out
// after 5 s of silence (rafthttp's ConnReadTimeout); so do these.
//
// The dialling side pings after PeerDialKeepaliveTime at the earliest:
// gRPC clients may not ping more often than every 10 s. Calls carry their
// own deadlines, so a request to a stopped node fails in its time anyway.
const (
	PeerKeepaliveTime     = 2 * time.Second
	PeerKeepaliveTimeout  = 3 * time.Second
	PeerDialKeepaliveTime = 10 * time.Second
)

// PeerReconnect is how connections between nodes reconnect: gRPC's
// default backoff starts at 1 s and grows by 1.6 up to 2 minutes, so a
// node back from a restart of a few seconds was reached by its peers only
// 1-3 s later (its raft groups heard no leader, and it served nothing,
// meanwhile), and after a longer outage (a rolling upgrade) tens of
// seconds later. etcd's peers redial every 100 ms (rafthttp). These retry
// from 50 ms up to 250 ms; an attempt gets 5 s to connect (a handshake with a
// node short of CPU is slow; a node that is down refuses at once).
var PeerReconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 250 * time.Millisecond},
	MinConnectTimeout: 5 * time.Second,
}

// PeerDialOptions are the dial options of connections between nodes: the
// codec, message limits, keepalive pings (see PeerKeepaliveTime), the
// reconnection backoff (PeerReconnect) and static flow-control windows
// (see StaticWindow).
func PeerDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithConnectParams(PeerReconnect),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(New()), grpc.MaxCallRecvMsgSize(1<<30), grpc.MaxCallSendMsgSize(1<<30)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: PeerDialKeepaliveTime, Timeout: PeerKeepaliveTimeout, PermitWithoutStream: true}),
		grpc.WithStaticStreamWindowSize(StaticWindow),
		grpc.WithStaticConnWindowSize(StaticWindow),
	}
}

// StaticWindow is the flow-control window (per stream and per connection,
// in bytes) of brain's gRPC servers and of the connections between nodes.
//
// gRPC's default windows are dynamic: they start at 64 KiB and grow by
// bandwidth-delay estimation, which sends a PING (answered by the peer)
// for each burst of data received, while the small windows make the
// receiver send a WINDOW_UPDATE every 16 KiB. Between nodes on a LAN or
// loopback, where bursts are small and frequent, these control frames made
// about a third of a cluster's socket reads and writes per write (brain's
// cost per write is dominated by system calls on a node short of CPU). A
// static window of the size the estimator grows to at most (16 MiB) needs
// neither; it bounds the data buffered per connection as the estimator
// does.
const StaticWindow = 16 << 20

// PeerServerOptions are the options of the server for connections from
// other nodes (it accepts their keepalive pings; static windows).
func PeerServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(New()),
		grpc.MaxRecvMsgSize(1 << 30),
		grpc.MaxSendMsgSize(1 << 30),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 500 * time.Millisecond, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: PeerKeepaliveTime, Timeout: PeerKeepaliveTimeout}),
		grpc.StaticStreamWindowSize(StaticWindow),
		grpc.StaticConnWindowSize(StaticWindow),
	}
}
