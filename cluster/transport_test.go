package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"testing"
	"time"
)

// testCA issues certificates for gossip tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
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
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// tls returns gossip TLS with a certificate from ca for a host name that
// is not the address gossip uses (the host name is not checked), trusting
// ca.
func (ca *testCA) tls(t *testing.T, name string) *TLS {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{name}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return &TLS{Certificate: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, Roots: ca.pool}
}

// TestGossipOverTLS: members with certificates from the peer CA gossip
// with each other over TLS (their certificates name other hosts and allow
// server auth only, as many peer certificates do); a node with a
// certificate from another CA, and one speaking plain gossip with the
// cluster's label, are refused at the handshake and never join, though
// both claim to be members.
func TestGossipOverTLS(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ca, other := newTestCA(t, "peer-ca"), newTestCA(t, "rogue-ca")
	start := func(id uint64, tlsCfg *TLS, seeds []string) (*Membership, string) {
		port := freePort(t)
		m, err := Start(Config{
			Self:     NodeInfo{ID: id, Name: fmt.Sprint("n", id), PeerAddr: fmt.Sprintf("127.0.0.1:%d", 10000+id)},
			BindAddr: "127.0.0.1", BindPort: port, Seeds: seeds, Fast: true, Logger: log,
			Label: "brain-cluster-1", TLS: tlsCfg, Static: members(4),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Stop)
		return m, fmt.Sprintf("127.0.0.1:%d", port)
	}
	m1, seed := start(1, ca.tls(t, "brain1"), nil)
	m2, _ := start(2, ca.tls(t, "brain2"), []string{seed})
	eventually(t, func() bool { return m1.Alive(2) && m2.Alive(1) && m1.ml.NumMembers() == 2 })
	m3, _ := start(3, other.tls(t, "brain3"), []string{seed})
	m4, _ := start(4, nil, []string{seed})
	// Both have tried: their joins reached the TLS listener and failed
	// the handshake.
	eventually(t, func() bool { return m1.tls.Refusals() >= 2 })
	// Gossip converges in a few 50 ms gossip rounds; give the refused
	// nodes as long to get in another way.
	time.Sleep(time.Second)
	for _, id := range []uint64{3, 4} {
		if m1.Alive(id) || m2.Alive(id) {
			t.Fatalf("node %d joined the TLS gossip without a certificate from the peer CA", id)
		}
	}
	if n := m1.ml.NumMembers(); n != 2 {
		t.Fatalf("the TLS gossip has %d members, want 2", n)
	}
	if m3.ml.NumMembers() != 1 || m4.ml.NumMembers() != 1 {
		t.Fatalf("a refused node learned of the cluster: %d and %d members", m3.ml.NumMembers(), m4.ml.NumMembers())
	}
	// The members still gossip: a stopped one is found dead, over TLS
	// probes.
	m2.Stop()
	eventually(t, func() bool { return !m1.Alive(2) })
}

// TestGossipCannotRedirectMembers: without TLS or a key, anyone who knows
// the label can speak the gossip. It still cannot redirect a member's
// traffic (its peer address is the configured one, whatever gossip
// claims), and a node that is no member counts for nothing: not alive,
// not listed, its leaderships ignored.
func TestGossipCannotRedirectMembers(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func(self NodeInfo, seeds []string, static []NodeInfo) (*Membership, string) {
		port := freePort(t)
		m, err := Start(Config{
			Self:     self,
			BindAddr: "127.0.0.1", BindPort: port, Seeds: seeds, Fast: true, Logger: log,
			Label: "brain-cluster-1", Static: static,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Stop)
		return m, fmt.Sprintf("127.0.0.1:%d", port)
	}
	ms := members(3)
	m1, seed := start(ms[0], nil, ms)
	// A rogue claims to be member 3, at an address of its own, and to
	// lead group 7; another, no member, claims group 8.
	rogue, _ := start(NodeInfo{ID: 3, Name: "n3", PeerAddr: "127.0.0.1:6666"}, []string{seed}, nil)
	rogue.SetLeadsAndLoad([]uint64{7}, NodeLoad{})
	stranger, _ := start(NodeInfo{ID: 99, Name: "x", PeerAddr: "127.0.0.1:6667"}, []string{seed}, nil)
	stranger.SetLeadsAndLoad([]uint64{8}, NodeLoad{})
	eventually(t, func() bool {
		l, ok := m1.LeaderHint(7)
		return m1.ml.NumMembers() == 3 && ok && l == 3
	})
	if a, ok := m1.Resolve(3); !ok || a != "127.0.0.1:10003" {
		t.Fatalf("member 3 resolves to %q (%v), want its configured 127.0.0.1:10003", a, ok)
	}
	if a, ok := m1.Resolve(99); ok {
		t.Fatalf("a node that is no member resolves to %q", a)
	}
	if m1.Alive(99) {
		t.Fatal("a node that is no member is alive")
	}
	if l, ok := m1.LeaderHint(8); ok {
		t.Fatalf("a node that is no member leads group 8 (%d)", l)
	}
	for _, n := range m1.Nodes() {
		if n.Info.ID == 99 {
			t.Fatal("Nodes lists a node that is no member")
		}
	}
	if _, ok := m1.Published()[99]; ok {
		t.Fatal("Published lists a node that is no member")
	}
	// Once it becomes a member, it counts (at its configured address).
	m1.SetMembers(append(ms, NodeInfo{ID: 99, Name: "x", PeerAddr: "127.0.0.1:10099"}))
	stranger.SetLeadsAndLoad([]uint64{8, 9}, NodeLoad{})
	eventually(t, func() bool { l, ok := m1.LeaderHint(9); return ok && l == 99 && m1.Alive(99) })
	if a, _ := m1.Resolve(99); a != "127.0.0.1:10099" {
		t.Fatalf("the new member resolves to %q, want 127.0.0.1:10099", a)
	}
}

// TestTLSTransportPackets: packets arrive whole, in order, from the
// sender's advertised address (memberlist answers a probe there, not at
// the connection's source port); a stream carries bytes both ways.
func TestTLSTransportPackets(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ca := newTestCA(t, "peer-ca")
	a, err := newTLSTransport(ca.tls(t, "a"), "127.0.0.1", 0, log)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	b, err := newTLSTransport(ca.tls(t, "b"), "127.0.0.1", 0, log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	for _, tr := range []*tlsTransport{a, b} {
		if _, _, err := tr.FinalAdvertiseAddr("", 0); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		if _, err := a.WriteTo([]byte(fmt.Sprint("packet ", i)), b.advertise); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		select {
		case p := <-b.PacketCh():
			if string(p.Buf) != fmt.Sprint("packet ", i) || p.From.String() != a.advertise {
				t.Fatalf("packet %d: %q from %v, want %q from %s", i, p.Buf, p.From, fmt.Sprint("packet ", i), a.advertise)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("packet %d never arrived", i)
		}
	}
	conn, err := a.DialTimeout(b.advertise, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	var in net.Conn
	select {
	case in = <-b.StreamCh():
	case <-time.After(10 * time.Second):
		t.Fatal("no stream arrived")
	}
	defer in.Close()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(in, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("stream read %q, %v", buf, err)
	}
	if _, err := in.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "world" {
		t.Fatalf("stream reply %q, %v", buf, err)
	}
}
