package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/brainkv/brain/cluster"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// loadCAPool reads a PEM bundle of CA certificates.
func loadCAPool(path, flag string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("server: %s: %w", flag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("server: %s %s holds no PEM certificate", flag, path)
	}
	return pool, nil
}

// clientTLSConfig is the TLS configuration of https client URLs: the
// node's certificate, and with --client-cert-auth a required client
// certificate signed by --trusted-ca-file. ALPN offers h2 (gRPC clients
// require it) and http/1.1 (/health, /metrics).
func (c *Config) clientTLSConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("server: --cert-file/--key-file: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	if c.TrustedCAFile != "" {
		if cfg.ClientCAs, err = loadCAPool(c.TrustedCAFile, "--trusted-ca-file"); err != nil {
			return nil, err
		}
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	if c.ClientCertAuth {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// peerCredentials returns the gRPC credentials of peer traffic: the server
// side (this node's certificate; with --peer-client-cert-auth the peer's
// certificate is required) and the dialing side (this node's certificate,
// the peer's verified against --peer-trusted-ca-file). Both are nil
// without peer TLS.
func (c *Config) peerCredentials() (server, dial credentials.TransportCredentials, err error) {
	if c.PeerCertFile == "" {
		return nil, nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.PeerCertFile, c.PeerKeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("server: --peer-cert-file/--peer-key-file: %w", err)
	}
	pool, err := loadCAPool(c.PeerTrustedCAFile, "--peer-trusted-ca-file")
	if err != nil {
		return nil, nil, err
	}
	srv := &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	if c.PeerClientCertAuth {
		srv.ClientAuth = tls.RequireAndVerifyClientCert
	}
	cli := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}
	return credentials.NewTLS(srv), credentials.NewTLS(cli), nil
}

// gossipTLS is how gossip runs with peer TLS on: over TLS, both ways with
// the peer certificate, only with nodes whose certificate the peer CA
// signed (whatever --peer-client-cert-auth says: gossip decides where a
// member's traffic goes, so it is never open). Nil without peer TLS.
func (c *Config) gossipTLS() (*cluster.TLS, error) {
	if c.PeerCertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.PeerCertFile, c.PeerKeyFile)
	if err != nil {
		return nil, fmt.Errorf("server: --peer-cert-file/--peer-key-file: %w", err)
	}
	pool, err := loadCAPool(c.PeerTrustedCAFile, "--peer-trusted-ca-file")
	if err != nil {
		return nil, err
	}
	return &cluster.TLS{Certificate: cert, Roots: pool}, nil
}

// peerDialOptions are the extra dial options of peer connections (TLS
// credentials with peer TLS, none without).
func (c *Config) peerDialOptions() ([]grpc.DialOption, error) {
	_, dial, err := c.peerCredentials()
	if err != nil || dial == nil {
		return nil, err
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(dial)}, nil
}

// joinTLSConfig is how a node started with an https --join URL talks to
// that member's client port: it verifies the member against
// --trusted-ca-file (or, without one, --peer-trusted-ca-file) and presents
// --cert-file/--key-file (or its peer certificate) as its client
// certificate, for members with --client-cert-auth.
func (c *Config) joinTLSConfig() (*tls.Config, error) {
	ca, caFlag := c.TrustedCAFile, "--trusted-ca-file"
	if ca == "" {
		ca, caFlag = c.PeerTrustedCAFile, "--peer-trusted-ca-file"
	}
	if ca == "" {
		return nil, fmt.Errorf("server: --join over https needs --trusted-ca-file (or --peer-trusted-ca-file) to verify the member")
	}
	pool, err := loadCAPool(ca, caFlag)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	certFile, keyFile := c.CertFile, c.KeyFile
	if certFile == "" {
		certFile, keyFile = c.PeerCertFile, c.PeerKeyFile
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("server: client certificate for --join: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
