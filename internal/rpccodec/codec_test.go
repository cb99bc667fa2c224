package rpccodec

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// blob is an internal message of any size.
type blob struct{ b []byte }

func (*blob) BrainMessage()              {}
func (m *blob) Marshal() ([]byte, error) { return m.b, nil }
func (m *blob) Unmarshal(b []byte) error { m.b = append([]byte(nil), b...); return nil }

var echoDesc = grpc.ServiceDesc{
	ServiceName: "brain.Test",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var m blob
			if err := dec(&m); err != nil {
				return nil, err
			}
			return &m, nil
		},
	}},
}

// tee records what a connection writes.
type tee struct {
	net.Conn
	mu  *sync.Mutex
	out *bytes.Buffer
}

func (t tee) Write(b []byte) (int, error) {
	t.mu.Lock()
	t.out.Write(b)
	t.mu.Unlock()
	return t.Conn.Write(b)
}

// wrapListener wraps every connection it accepts with wrap.
type wrapListener struct {
	net.Listener
	wrap func(net.Conn) net.Conn
}

func (l wrapListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.wrap(c), nil
}

// controlFrames makes calls echoing size bytes each over one connection
// and returns the PING (not acks) and WINDOW_UPDATE frames both sides
// sent.
func controlFrames(t *testing.T, calls, size int, srvOpts []grpc.ServerOption, dialOpts []grpc.DialOption) (pings, updates int) {
	t.Helper()
	var mu sync.Mutex
	var fromServer, fromClient bytes.Buffer
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(srvOpts...)
	srv.RegisterService(&echoDesc, nil)
	go srv.Serve(wrapListener{l, func(c net.Conn) net.Conn { return tee{c, &mu, &fromServer} }})
	defer srv.Stop()
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return tee{c, &mu, &fromClient}, nil
	}
	conn, err := grpc.NewClient(l.Addr().String(), append(dialOpts, grpc.WithContextDialer(dial))...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	payload := bytes.Repeat([]byte{7}, size)
	for i := 0; i < calls; i++ {
		var out blob
		if err := conn.Invoke(context.Background(), "/brain.Test/Echo", &blob{b: payload}, &out); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.b, payload) {
			t.Fatalf("call %d echoed %d bytes, want %d", i, len(out.b), size)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	client := fromClient.Bytes()
	if !bytes.HasPrefix(client, []byte(http2.ClientPreface)) {
		t.Fatalf("client stream does not start with the HTTP/2 preface")
	}
	for _, stream := range [][]byte{client[len(http2.ClientPreface):], fromServer.Bytes()} {
		fr := http2.NewFramer(nil, bytes.NewReader(stream))
		fr.SetMaxReadFrameSize(1 << 24)
		for {
			f, err := fr.ReadFrame()
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			switch f := f.(type) {
			case *http2.PingFrame:
				// Keepalive pings (zero data: the peer options ping a
				// connection idle for a second, as a slow test run's can be)
				// are not the flow control's; BDP estimation pings carry
				// data.
				if !f.IsAck() && f.Data != [8]byte{} {
					pings++
				}
			case *http2.WindowUpdateFrame:
				updates++
			}
		}
	}
	return pings, updates
}

// TestStaticWindowsSendFewControlFrames checks that connections between
// nodes carry no bandwidth-estimation PINGs and one WINDOW_UPDATE per
// quarter window received, where gRPC's default dynamic windows send
// control frames for every few data frames.
func TestStaticWindowsSendFewControlFrames(t *testing.T) {
	const calls, size = 100, 256 << 10
	pings, updates := controlFrames(t, calls, size, PeerServerOptions(), PeerDialOptions())
	// Each side receives calls*size bytes: a connection update per
	// StaticWindow/4 received, none per stream (a stream gets size bytes).
	maxUpdates := 2 * (calls*size/(StaticWindow/4) + 1)
	t.Logf("static windows: %d pings, %d window updates for %d calls of %d bytes", pings, updates, calls, size)
	if pings != 0 || updates > maxUpdates {
		t.Errorf("static windows: %d pings and %d window updates, want 0 and at most %d", pings, updates, maxUpdates)
	}

	dpings, dupdates := controlFrames(t, calls, size,
		[]grpc.ServerOption{grpc.ForceServerCodecV2(New()), grpc.MaxRecvMsgSize(1 << 30)},
		[]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(New()))})
	t.Logf("gRPC's default windows: %d pings, %d window updates", dpings, dupdates)
	if dpings+dupdates <= 4*(pings+updates) {
		t.Errorf("default windows sent %d control frames, static %d: the test no longer shows what static windows save", dpings+dupdates, pings+updates)
	}
}
