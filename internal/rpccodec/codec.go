package rpccodec

import (
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

// PeerDialOptions are the dial options of connections between nodes: the
// codec, message limits, and keepalive pings so a connection to a node that
// stopped answering (paused, partitioned) breaks within about two seconds
// instead of hanging its requests.
func PeerDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(New()), grpc.MaxCallRecvMsgSize(1<<30), grpc.MaxCallSendMsgSize(1<<30)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: time.Second, Timeout: time.Second, PermitWithoutStream: true}),
	}
}

// PeerServerOptions are the options of the server for connections from
// other nodes (it accepts their keepalive pings).
func PeerServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(New()),
		grpc.MaxRecvMsgSize(1 << 30),
		grpc.MaxSendMsgSize(1 << 30),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 500 * time.Millisecond, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Second, Timeout: time.Second}),
	}
}
