package rpccodec

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"
)

// TestPooledOutgrown: a message that outgrew its pooled buffer goes out
// as it is, as a Raw message.
func TestPooledOutgrown(t *testing.T) {
	p := NewPooled(10)
	b := append(p.Buf, bytes.Repeat([]byte{1}, cap(p.Buf)+1)...)
	m, ok := p.Message(b).(*Raw)
	if !ok || !bytes.Equal(m.B, b) {
		t.Fatalf("outgrown pooled message: %T", p.Message(b))
	}
	p = NewPooled(2000)
	b = append(p.Buf, "abc"...)
	pm, ok := p.Message(b).(*Pooled)
	if !ok || string(pm.Bytes()) != "abc" {
		t.Fatalf("pooled message: %T", p.Message(b))
	}
	bs, err := New().Marshal(pm)
	if err != nil || string(bs.Materialize()) != "abc" {
		t.Fatalf("marshalled %q, %v", bs.Materialize(), err)
	}
	bs.Free()
}

var sinkDesc = grpc.ServiceDesc{
	ServiceName: "brain.TestSink",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Sink",
		ClientStreams: true,
		Handler: func(_ any, s grpc.ServerStream) error {
			for i := 0; ; i++ {
				var m blob
				if err := s.RecvMsg(&m); err != nil {
					return s.SendMsg(&blob{b: []byte(fmt.Sprint(i))})
				}
				if want := pooledPayload(i); !bytes.Equal(m.b, want) {
					return s.SendMsg(&blob{b: []byte(fmt.Sprintf("message %d: got %d bytes starting %x, want %d starting %x", i, len(m.b), m.b[:min(8, len(m.b))], len(want), want[:8]))})
				}
			}
		},
	}},
}

// pooledPayload is message i of TestPooledMessagesArriveIntact: sizes
// across the pool's tiers, each filled with its own byte.
func pooledPayload(i int) []byte {
	sizes := []int{300, 5000, 40000, 1 << 20, 3 << 20}
	return bytes.Repeat([]byte{byte(i)}, sizes[i%len(sizes)]+i)
}

// TestPooledMessagesArriveIntact sends pooled messages back to back on a
// stream, each written as soon as the previous SendMsg returned: a
// buffer put back in the pool before gRPC wrote it would be reused by a
// later message and reach the receiver with that message's bytes.
func TestPooledMessagesArriveIntact(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(PeerServerOptions()...)
	srv.RegisterService(&sinkDesc, nil)
	go srv.Serve(l)
	defer srv.Stop()
	conn, err := grpc.NewClient(l.Addr().String(), PeerDialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s, err := conn.NewStream(context.Background(), &sinkDesc.Streams[0], "/brain.TestSink/Sink")
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	for i := 0; i < n; i++ {
		want := pooledPayload(i)
		p := NewPooled(len(want))
		if err := s.SendMsg(p.Message(append(p.Buf, want...))); err != nil {
			break // the receiver stopped: its answer says why
		}
	}
	_ = s.CloseSend()
	var got blob
	if err := s.RecvMsg(&got); err != nil {
		t.Fatal(err)
	}
	if string(got.b) != fmt.Sprint(n) {
		t.Fatalf("the receiver says: %s", got.b)
	}
}
