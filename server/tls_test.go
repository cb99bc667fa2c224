package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brainkv/brain/cluster"
	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/server"
	"github.com/hashicorp/memberlist"
	"go.etcd.io/etcd/api/v3/authpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// testCA is a throwaway certificate authority.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a certificate for 127.0.0.1 usable by servers and clients
// and returns the PEM of the certificate and of its key.
func (ca *testCA) issue(t *testing.T, name string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startClientCertNode starts a node on an https client URL with a
// certificate from ca and --client-cert-auth (base's other fields kept).
func startClientCertNode(t *testing.T, dir string, ca *testCA, base server.Config) *server.Server {
	t.Helper()
	srvCert, srvKey := ca.issue(t, "brainnode")
	base.ListenClientURLs = []string{"https://127.0.0.1:0"}
	base.CertFile = writeFile(t, dir, "server.crt", srvCert)
	base.KeyFile = writeFile(t, dir, "server.key", srvKey)
	base.TrustedCAFile = writeFile(t, dir, "ca.crt", ca.pem)
	base.ClientCertAuth = true
	return testutil.StartBrain(t, base)
}

// TestClientTLS checks https client URLs with --client-cert-auth: a client
// with a certificate from the trusted CA works (etcd client and /health);
// one without a certificate, one with a certificate from another CA, and a
// plaintext client are refused.
func TestClientTLS(t *testing.T) {
	dir := t.TempDir()
	ca, rogue := newTestCA(t, "brain-test-ca"), newTestCA(t, "rogue-ca")
	cliCert, cliKey := ca.issue(t, "client")
	rogueCert, rogueKey := rogue.issue(t, "intruder")
	s := startClientCertNode(t, dir, ca, server.Config{})
	if u := s.ClientURLs()[0]; u[:8] != "https://" {
		t.Fatalf("client URL %s is not https", u)
	}
	ep := testutil.Endpoint(s)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
	pair := func(c, k []byte) []tls.Certificate {
		kp, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{kp}
	}
	dial := func(tc *tls.Config) (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: []string{ep}, TLS: tc, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	}

	good, err := dial(&tls.Config{RootCAs: roots, Certificates: pair(cliCert, cliKey)})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := good.Put(ctx, "/tls/k", "v"); err != nil {
		t.Fatalf("put with a trusted client certificate: %v", err)
	}
	if r, err := good.Get(ctx, "/tls/k"); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("get with a trusted client certificate: %v %v", r, err)
	}
	hc := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: pair(cliCert, cliKey)}}}
	resp, err := hc.Get("https://" + ep + "/health")
	if err != nil {
		t.Fatalf("/health over TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/health over TLS: %s", resp.Status)
	}

	for name, tc := range map[string]*tls.Config{
		"no client certificate":              {RootCAs: roots},
		"a certificate from an untrusted CA": {RootCAs: roots, Certificates: pair(rogueCert, rogueKey)},
	} {
		c, err := dial(tc)
		if err == nil {
			cctx, ccancel := context.WithTimeout(context.Background(), 3*time.Second)
			_, err = c.Put(cctx, "/tls/intruder", "x")
			ccancel()
			c.Close()
		}
		if err == nil {
			t.Errorf("a client with %s could write", name)
		}
	}
	plain, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err == nil {
		cctx, ccancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err = plain.Put(cctx, "/tls/plain", "x")
		ccancel()
		plain.Close()
	}
	if err == nil {
		t.Error("a plaintext client could write to an https URL")
	}
	if r, err := good.Get(ctx, "/tls/", clientv3.WithPrefix()); err != nil || r.Count != 1 {
		t.Fatalf("after the refused clients: %d keys under /tls/ (want 1), %v", r.Count, err)
	}
}

// TestClientTLSConfigErrors checks settings that cannot work (TLS, the
// gossip key, a negative interval) are refused at start with a clear
// error.
func TestClientTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for name, cfg := range map[string]server.Config{
		"a gossip key file that does not exist": {GossipKeyFile: "/nonexistent.key"},
		"a gossip key that is not base64":       {GossipKeyFile: writeFile(t, dir, "bad.key", []byte("not base64!"))},
		"a gossip key of 10 bytes":              {GossipKeyFile: writeFile(t, dir, "short.key", []byte("MDEyMzQ1Njc4OQ=="))},
		"https without a certificate":           {ListenClientURLs: []string{"https://127.0.0.1:0"}},
		"client-cert-auth without a CA":         {ListenClientURLs: []string{"https://127.0.0.1:0"}, CertFile: "a", KeyFile: "b", ClientCertAuth: true},
		"a certificate without an https URL":    {ListenClientURLs: []string{"http://127.0.0.1:0"}, CertFile: "a", KeyFile: "b"},
		"certificate files that do not exist":   {ListenClientURLs: []string{"https://127.0.0.1:0"}, CertFile: "/nonexistent.crt", KeyFile: "/nonexistent.key"},
		"peer TLS with an http peer URL":        {PeerCertFile: "a", PeerKeyFile: "b", PeerTrustedCAFile: "c"},
		"peer TLS without a CA":                 {PeerCertFile: "a", PeerKeyFile: "b"},
		"an https peer URL without peer TLS":    {ListenPeerURLs: []string{"https://127.0.0.1:0"}},
		"a negative leader balance interval":    {LeaderBalanceInterval: -time.Second},
	} {
		cfg.DataDir = t.TempDir()
		if cfg.ListenPeerURLs == nil {
			cfg.ListenPeerURLs = []string{"http://127.0.0.1:0"}
		}
		if cfg.ListenClientURLs == nil {
			cfg.ListenClientURLs = []string{"http://127.0.0.1:0"}
		}
		cfg.Logger = testutil.Quiet()
		s, err := server.New(cfg)
		if err == nil {
			s.Stop()
			t.Errorf("%s: started", name)
			continue
		}
		t.Logf("%s: %v", name, err)
	}
}

// TestPeerTLS runs a 3-node cluster with peer TLS,
// --peer-client-cert-auth and encrypted gossip (--gossip-key-file): writes through one node are read through
// another (raft and forwarding over TLS), and the peer port refuses a
// caller with a certificate from another CA, one without a certificate,
// and plaintext.
func TestPeerTLS(t *testing.T) {
	dir := t.TempDir()
	ca, rogue := newTestCA(t, "brain-peer-ca"), newTestCA(t, "rogue-ca")
	cert, key := ca.issue(t, "peer")
	c := testutil.StartCluster(t, 3, server.Config{
		PeerCertFile:       writeFile(t, dir, "peer.crt", cert),
		PeerKeyFile:        writeFile(t, dir, "peer.key", key),
		PeerTrustedCAFile:  writeFile(t, dir, "ca.crt", ca.pem),
		PeerClientCertAuth: true,
		GossipKeyFile:      writeFile(t, dir, "gossip.key", []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n")),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c1, c3 := testutil.Client(t, testutil.Endpoint(c.Nodes[0])), testutil.Client(t, testutil.Endpoint(c.Nodes[2]))
	var put *clientv3.PutResponse
	var err error
	for put == nil { // the cluster may still be electing
		if put, err = c1.Put(ctx, "/registry/pods/tls", "v"); err != nil {
			if ctx.Err() != nil {
				t.Fatalf("put on a peer-TLS cluster: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	r, err := c3.Get(ctx, "/registry/pods/tls")
	if err != nil || len(r.Kvs) != 1 || r.Kvs[0].ModRevision != put.Header.Revision {
		t.Fatalf("read through another node: %v %v (put at %d)", r, err, put.Header.Revision)
	}

	peer := strings.TrimPrefix(c.Configs[1].ListenPeerURLs[0], "https://")
	call := func(opts ...grpc.DialOption) error {
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		defer ccancel()
		_, err := kvapi.CallAddr(cctx, peer, &kvapi.CallRequest{Op: kvapi.OpClusterInfo}, opts...)
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
	withCert := func(c, k []byte) grpc.DialOption {
		kp, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{kp}}))
	}
	if err := call(withCert(cert, key)); err != nil {
		t.Fatalf("a peer with a trusted certificate was refused: %v", err)
	}
	rc, rk := rogue.issue(t, "intruder")
	for name, opt := range map[string]grpc.DialOption{
		"a certificate from another CA": withCert(rc, rk),
		"no certificate":                grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots})),
		"plaintext":                     nil,
	} {
		var opts []grpc.DialOption
		if opt != nil {
			opts = append(opts, opt)
		}
		if err := call(opts...); err == nil {
			t.Errorf("a caller with %s was served on the peer port", name)
		}
	}
}

// TestJoinOverHTTPS: a node joins through a member's https client URL
// (with --client-cert-auth), verifying the member with --trusted-ca-file
// and presenting its --cert-file; a node without a client certificate is
// refused and does not start.
func TestJoinOverHTTPS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "brain-join-ca")
	cert, key := ca.issue(t, "brainnode")
	crt, k, caf := writeFile(t, dir, "n.crt", cert), writeFile(t, dir, "n.key", key), writeFile(t, dir, "ca.crt", ca.pem)
	node := func(name string) server.Config {
		peer := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePortPair(t))
		return server.Config{
			Name: name, DataDir: filepath.Join(dir, name), FastGossip: true,
			ListenClientURLs: []string{fmt.Sprintf("https://127.0.0.1:%d", testutil.FreePort(t))},
			ListenPeerURLs:   []string{peer}, InitialAdvertisePeerURLs: []string{peer}, InitialCluster: name + "=" + peer,
			CertFile: crt, KeyFile: k, TrustedCAFile: caf, ClientCertAuth: true,
			HeartbeatInterval: 50 * time.Millisecond, ElectionTimeout: 500 * time.Millisecond,
		}
	}
	// A 2-member cluster (a single node serves no peers until it has some).
	n1, n2 := node("n1"), node("n2")
	initial := n1.InitialCluster + "," + n2.InitialCluster
	n1.InitialCluster, n2.InitialCluster = initial, initial
	errc := make(chan error, 2)
	for _, c := range []server.Config{n1, n2} {
		go func(c server.Config) {
			c.Logger = testutil.Quiet()
			s, err := server.New(c)
			if err == nil {
				t.Cleanup(s.Stop)
			}
			errc <- err
		}(c)
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	join := n1.ListenClientURLs[0]

	bad := node("nocert")
	bad.ListenClientURLs = []string{"http://127.0.0.1:0"}
	bad.CertFile, bad.KeyFile, bad.ClientCertAuth = "", "", false
	bad.Join, bad.Logger = join, testutil.Quiet()
	if s, err := server.New(bad); err == nil {
		s.Stop()
		t.Fatal("a node without a client certificate joined a --client-cert-auth member")
	} else {
		t.Logf("without a client certificate: %v", err)
	}

	third := node("n3")
	third.Join = join
	s3 := testutil.StartBrain(t, third)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
	kp, err := tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testutil.Endpoint(s3)}, DialTimeout: 3 * time.Second, Logger: zap.NewNop(),
		TLS: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{kp}}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		ml, err := cli.MemberList(ctx)
		if err == nil && len(ml.Members) == 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("MemberList on the joined node: %v %v", ml, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := cli.Put(ctx, "/joined", "v"); err != nil {
		t.Fatalf("put through the node that joined over https: %v", err)
	}
}

// TestRogueGossipMember: a program that speaks memberlist with the
// cluster's label (which every etcd response header gives away: it is
// built from the cluster ID) joins the gossip claiming to be member 3 at
// an address of its own. With peer TLS it is refused at the handshake and
// never learns of the cluster; without peer TLS and a gossip key it gets
// in, but no node sends member 3's traffic to its address, and writes
// through every node keep succeeding (before, members 1 and 2 sent member
// 3's raft and forwarded calls to the rogue: writes fell to nearly none).
func TestRogueGossipMember(t *testing.T) {
	for _, peerTLS := range []bool{true, false} {
		t.Run(fmt.Sprintf("peerTLS=%v", peerTLS), func(t *testing.T) {
			dir := t.TempDir()
			var cfg server.Config
			if peerTLS {
				ca := newTestCA(t, "brain-peer-ca")
				cert, key := ca.issue(t, "peer")
				cfg = server.Config{
					PeerCertFile:       writeFile(t, dir, "peer.crt", cert),
					PeerKeyFile:        writeFile(t, dir, "peer.key", key),
					PeerTrustedCAFile:  writeFile(t, dir, "ca.crt", ca.pem),
					PeerClientCertAuth: true,
				}
			}
			c := testutil.StartCluster(t, 3, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			clients := []*clientv3.Client{testutil.Client(t, testutil.Endpoint(c.Nodes[0])), testutil.Client(t, testutil.Endpoint(c.Nodes[1])), testutil.Client(t, testutil.Endpoint(c.Nodes[2]))}
			ml, err := clients[0].MemberList(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var victim uint64
			for _, m := range ml.Members {
				if m.Name == "n3" {
					victim = m.ID
				}
			}
			// The rogue's "peer address": it counts who connects.
			trap, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer trap.Close()
			var trapped atomic.Int64
			go func() {
				for {
					conn, err := trap.Accept()
					if err != nil {
						return
					}
					trapped.Add(1)
					conn.Close()
				}
			}()
			seed, err := cluster.GossipAddr(strings.TrimPrefix(strings.TrimPrefix(c.Configs[0].ListenPeerURLs[0], "https://"), "http://"))
			if err != nil {
				t.Fatal(err)
			}
			// The rogue speaks memberlist under a name of its own, with the
			// cluster's label, and publishes member 3's ID with its own
			// address, as brain's nodes publish theirs.
			mc := memberlist.DefaultLocalConfig()
			mc.Name, mc.Label = "rogue", fmt.Sprintf("brain-cluster-%x", ml.Header.ClusterId)
			mc.BindAddr, mc.BindPort, mc.AdvertisePort = "127.0.0.1", testutil.FreePort(t), 0
			mc.AdvertisePort = mc.BindPort
			mc.LogOutput = io.Discard
			meta, _ := json.Marshal(cluster.NodeInfo{ID: victim, Name: "n3", PeerAddr: trap.Addr().String()})
			mc.Delegate = rogueMeta(meta)
			rogue, err := memberlist.Create(mc)
			if err != nil {
				t.Fatal(err)
			}
			defer rogue.Shutdown()
			_, joinErr := rogue.Join([]string{seed})
			if peerTLS {
				if joinErr == nil {
					t.Fatal("the rogue joined the TLS gossip")
				}
				// Its joins reached node 1 and failed the handshake.
				for refusedGossip(t, c.Nodes[0]) == 0 {
					if ctx.Err() != nil {
						t.Fatal("node 1 never refused the rogue's gossip")
					}
					time.Sleep(50 * time.Millisecond)
				}
			} else if joinErr != nil {
				t.Fatalf("the rogue could not join the plain gossip: %v", joinErr)
			}
			// Member 3 restarts: every connection to it is dialled anew,
			// at the address its peers resolve.
			c.Stop(2)
			c.Start(2)
			clients[2] = testutil.Client(t, testutil.Endpoint(c.Nodes[2]))
			// Writes through every node, for a while with the rogue in.
			for i := range 60 {
				cl := clients[i%3]
				wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := cl.Put(wctx, fmt.Sprintf("/registry/pods/rogue-%d", i), "v")
				wcancel()
				if err != nil {
					t.Fatalf("put %d through node %d with a rogue gossip member: %v", i, i%3+1, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if n := trapped.Load(); n != 0 {
				t.Fatalf("nodes connected %d times to the rogue's address", n)
			}
			if peerTLS && rogue.NumMembers() != 1 {
				t.Fatalf("the refused rogue learned of %d nodes", rogue.NumMembers()-1)
			}
		})
	}
}

// rogueMeta is a memberlist delegate that publishes a fixed node meta.
type rogueMeta []byte

func (m rogueMeta) NodeMeta(int) []byte           { return m }
func (rogueMeta) NotifyMsg([]byte)                {}
func (rogueMeta) GetBroadcasts(int, int) [][]byte { return nil }
func (rogueMeta) LocalState(bool) []byte          { return nil }
func (rogueMeta) MergeRemoteState([]byte, bool)   {}

// refusedGossip reads brain_gossip_connections_refused_total off a node.
func refusedGossip(t *testing.T, s *server.Server) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "brain_gossip_connections_refused_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no brain_gossip_connections_refused_total")
	return 0
}

// TestKubeUserByCertificate: with --client-cert-auth and auth on, a client
// certificate's common name is the user, as kube-apiserver connects
// (--etcd-certfile, no password): a "kube-apiserver" user with readwrite
// on /registry/ and compact_rev_key does what kube-apiserver does (lease
// grant, put with a lease, a create txn, a guarded update, a list, a watch
// from a revision, its compactor's txn and compaction), and nothing else;
// the "root" certificate is root.
func TestKubeUserByCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "brain-kube-ca")
	s := startClientCertNode(t, dir, ca, server.Config{BcryptCost: 4})
	ep := testutil.Endpoint(s)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
	as := func(cn string) *clientv3.Client {
		c, k := ca.issue(t, cn)
		kp, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		cl, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, TLS: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{kp}}, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root := as("root")
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error {
			_, err := root.UserAddWithOptions(ctx, "kube-apiserver", "", &clientv3.UserAddOptions{NoPassword: true})
			return err
		},
		func() error { _, err := root.RoleAdd(ctx, "kube"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "kube", "/registry/", clientv3.GetPrefixRangeEnd("/registry/"), clientv3.PermissionType(authpb.READWRITE))
			return err
		},
		func() error {
			_, err := root.RoleGrantPermission(ctx, "kube", "compact_rev_key", "", clientv3.PermissionType(authpb.READWRITE))
			return err
		},
		func() error { _, err := root.UserGrantRole(ctx, "kube-apiserver", "kube"); return err },
		func() error { _, err := root.Put(ctx, "/other/secret", "s"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	kube := as("kube-apiserver")
	lease, err := kube.Grant(ctx, 60)
	if err != nil {
		t.Fatalf("kube-apiserver lease grant: %v", err)
	}
	if _, err := kube.Put(ctx, "/registry/events/default/e1", "e", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatalf("put with a lease: %v", err)
	}
	key := "/registry/pods/default/p1"
	tr, err := kube.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, "v1")).Else(clientv3.OpGet(key)).Commit()
	if err != nil || !tr.Succeeded {
		t.Fatalf("create txn: %v %v", tr, err)
	}
	created := tr.Header.Revision
	wch := kube.Watch(clientv3.WithRequireLeader(ctx), "/registry/pods/", clientv3.WithPrefix(), clientv3.WithRev(created), clientv3.WithPrevKV())
	tr, err = kube.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", created)).Then(clientv3.OpPut(key, "v2")).Else(clientv3.OpGet(key)).Commit()
	if err != nil || !tr.Succeeded {
		t.Fatalf("guarded update: %v %v", tr, err)
	}
	var events int
	for events < 2 {
		select {
		case wr := <-wch:
			if err := wr.Err(); err != nil {
				t.Fatalf("watch: %v", err)
			}
			events += len(wr.Events)
		case <-ctx.Done():
			t.Fatalf("watch saw %d of 2 events", events)
		}
	}
	if r, err := kube.Get(ctx, "/registry/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != 2 {
		t.Fatalf("list /registry/: %v %v", r, err)
	}
	// kube-apiserver's compactor: a txn on compact_rev_key, then Compact.
	ct, err := kube.Txn(ctx).If(clientv3.Compare(clientv3.Version("compact_rev_key"), "=", 0)).
		Then(clientv3.OpPut("compact_rev_key", fmt.Sprint(created))).Else(clientv3.OpGet("compact_rev_key")).Commit()
	if err != nil || !ct.Succeeded {
		t.Fatalf("compactor's txn: %v %v", ct, err)
	}
	if _, err := kube.Compact(ctx, created); err != nil {
		t.Fatalf("compaction: %v", err)
	}
	if _, err := kube.Get(ctx, "/other/secret"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("kube-apiserver read outside /registry/: %v", err)
	}
	if _, err := kube.AuthDisable(ctx); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("kube-apiserver disabled auth: %v", err)
	}
	if r, err := root.Get(ctx, "/other/secret"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("root certificate: %v %v", r, err)
	}
	if _, err := as("nobody").Get(ctx, "/registry/pods/default/p1"); err == nil {
		t.Fatal("a certificate naming no user read /registry/")
	}
}
