package etcdcompat

import (
	"context"
	"crypto/tls"
	"net"

	"github.com/soheilhy/cmux"
	"google.golang.org/grpc/credentials"
)

// listenerTLS are gRPC server credentials for connections whose TLS the
// listener already terminated (client URLs serve gRPC and HTTP on one
// port: TLS first, then cmux): they do no handshake of their own but
// report the connection's TLS state, so that etcd's auth can take the user
// from the client certificate (--client-cert-auth), as etcd's gRPC TLS
// credentials let it. Plaintext connections report none.
type listenerTLS struct{}

func (listenerTLS) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	inner := c
	if m, ok := inner.(*cmux.MuxConn); ok {
		inner = m.Conn
	}
	tc, ok := inner.(*tls.Conn)
	if !ok {
		return c, nil, nil
	}
	if err := tc.HandshakeContext(context.Background()); err != nil {
		return nil, nil, err
	}
	return c, credentials.TLSInfo{State: tc.ConnectionState(), CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (listenerTLS) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, nil, nil
}

func (listenerTLS) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (l listenerTLS) Clone() credentials.TransportCredentials { return l }

func (listenerTLS) OverrideServerName(string) error { return nil }
