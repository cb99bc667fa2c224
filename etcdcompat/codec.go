package etcdcompat

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// rawFrame is a message already in protobuf wire format. The watch path
// builds WatchResponses by splicing event bytes encoded once for all the
// watchers that share them (KEP-1152) and sends them as raw frames.
type rawFrame struct{ b []byte }

// frameCodec is the server's codec: raw frames go out as they are, and
// everything else through gRPC's protobuf codec.
type frameCodec struct{ proto encoding.CodecV2 }

func newFrameCodec() frameCodec { return frameCodec{proto: encoding.GetCodecV2("proto")} }

func (c frameCodec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*rawFrame); ok {
		return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
	}
	return c.proto.Marshal(v)
}

func (c frameCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

func (c frameCodec) Name() string { return "proto" }
