package cluster

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

// TLS carries gossip over mutually authenticated TLS: every connection,
// both ways, presents Certificate and must present a certificate that
// Roots signed. A node without such a certificate can neither join nor
// read what members gossip.
//
// The peer's host name is not checked (members reach each other's gossip
// at advertised IPs, which a certificate issued for a peer URL's host name
// does not list); the CA is the authority, as with etcd's
// --peer-client-cert-auth.
type TLS struct {
	Certificate tls.Certificate
	Roots       *x509.CertPool
}

// tlsTransport is a memberlist.Transport over TLS on TCP: memberlist's
// streams are TLS connections, and its packets (probes, gossip) are
// frames on one long-lived TLS connection per destination. Packets keep
// memberlist's best-effort semantics: a packet to a destination whose
// queue is full, or that cannot be reached, is dropped.
//
// Each connection starts, after the handshake, with a byte: 's' for a
// stream, or 'p' for packets followed by the sender's advertised address
// (a uint16 length and the address; memberlist replies to it) and then
// frames, each a uint32 length and a packet.
type tlsTransport struct {
	ln        net.Listener
	server    *tls.Config
	client    *tls.Config
	bindAddr  string
	advertise string // host:port, set by FinalAdvertiseAddr
	log       *slog.Logger

	packetCh chan *memberlist.Packet
	streamCh chan net.Conn

	mu       sync.Mutex
	senders  map[string]*packetSender // by destination address
	incoming map[net.Conn]struct{}    // packet connections being read
	closed   atomic.Bool
	stopc    chan struct{}

	refusals       atomic.Int64
	lastRefusalLog atomic.Int64 // unix nanos
	wg             sync.WaitGroup
}

const (
	modeStream = 's'
	modePacket = 'p'
	// maxPacket bounds a packet frame (memberlist's packets are at most
	// a few KiB).
	maxPacket = 1 << 20
	// senderQueue is how many packets wait for one destination before
	// further ones are dropped.
	senderQueue = 128
	// senderIdle closes a destination's connection after this long
	// without a packet.
	senderIdle = time.Minute
	// packetWriteTimeout bounds a packet's write to a stalled peer.
	packetWriteTimeout = time.Second
	// handshakeTimeout bounds an incoming connection's TLS handshake and
	// its first bytes.
	handshakeTimeout = 5 * time.Second
)

// verifyChain checks a peer's certificate chain against roots, for any
// key usage, without a host name (see TLS).
func verifyChain(roots *x509.CertPool) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("cluster: gossip peer presented no certificate")
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, b := range raw {
			c, err := x509.ParseCertificate(b)
			if err != nil {
				return fmt.Errorf("cluster: gossip peer certificate: %w", err)
			}
			certs[i] = c
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err
	}
}

func newTLSTransport(cfg *TLS, bindAddr string, bindPort int, log *slog.Logger) (*tlsTransport, error) {
	verify := verifyChain(cfg.Roots)
	t := &tlsTransport{
		server: &tls.Config{
			Certificates:          []tls.Certificate{cfg.Certificate},
			ClientAuth:            tls.RequireAnyClientCert,
			VerifyPeerCertificate: verify,
			MinVersion:            tls.VersionTLS13,
		},
		client: &tls.Config{
			Certificates: []tls.Certificate{cfg.Certificate},
			// The chain is checked by VerifyPeerCertificate, without
			// the host name (see TLS).
			InsecureSkipVerify:    true, //nolint:gosec
			VerifyPeerCertificate: verify,
			MinVersion:            tls.VersionTLS13,
		},
		bindAddr: bindAddr,
		log:      log,
		packetCh: make(chan *memberlist.Packet, 256),
		streamCh: make(chan net.Conn),
		senders:  make(map[string]*packetSender),
		incoming: make(map[net.Conn]struct{}),
		stopc:    make(chan struct{}),
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(bindAddr, strconv.Itoa(bindPort)))
	if err != nil {
		return nil, err
	}
	t.ln = ln
	t.wg.Add(1)
	go t.accept()
	return t, nil
}

// FinalAdvertiseAddr implements memberlist.Transport.
func (t *tlsTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if port == 0 {
		port = t.ln.Addr().(*net.TCPAddr).Port
	}
	if ip == "" {
		ip = t.bindAddr
		if a := net.ParseIP(ip); ip == "" || (a != nil && a.IsUnspecified()) {
			var err error
			if ip, err = sockaddr.GetPrivateIP(); err != nil {
				return nil, 0, fmt.Errorf("cluster: no address to advertise for gossip: %w", err)
			}
			if ip == "" {
				return nil, 0, errors.New("cluster: no private IP address to advertise for gossip, and none configured")
			}
		}
	}
	addr := net.ParseIP(ip)
	if addr == nil {
		return nil, 0, fmt.Errorf("cluster: gossip advertise address %q is not an IP", ip)
	}
	if a4 := addr.To4(); a4 != nil {
		addr = a4
	}
	t.advertise = net.JoinHostPort(addr.String(), strconv.Itoa(port))
	return addr, port, nil
}

// PacketCh implements memberlist.Transport.
func (t *tlsTransport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// StreamCh implements memberlist.Transport.
func (t *tlsTransport) StreamCh() <-chan net.Conn { return t.streamCh }

// DialTimeout implements memberlist.Transport: a stream.
func (t *tlsTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", addr, t.client)
	if err != nil {
		return nil, err
	}
	_ = conn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte{modeStream}); err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetWriteDeadline(time.Time{})
	return conn, nil
}

// WriteTo implements memberlist.Transport: the packet is queued for its
// destination's connection (dropped when the queue is full).
func (t *tlsTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	now := time.Now()
	if t.closed.Load() {
		return now, errors.New("cluster: gossip transport is shut down")
	}
	t.mu.Lock()
	s := t.senders[addr]
	if s == nil {
		s = &packetSender{t: t, addr: addr, q: make(chan []byte, senderQueue)}
		t.senders[addr] = s
		t.wg.Add(1)
		go s.run()
	}
	t.mu.Unlock()
	select {
	case s.q <- append([]byte(nil), b...):
	default: // as a UDP packet would be
	}
	return now, nil
}

// Shutdown implements memberlist.Transport.
func (t *tlsTransport) Shutdown() error {
	if t.closed.Swap(true) {
		return nil
	}
	close(t.stopc)
	err := t.ln.Close()
	t.mu.Lock()
	for c := range t.incoming {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return err
}

func (t *tlsTransport) accept() {
	defer t.wg.Done()
	for {
		conn, err := t.ln.Accept()
		if err != nil {
			if t.closed.Load() {
				return
			}
			t.log.Debug("gossip accept failed", "err", err)
			select {
			case <-t.stopc:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		t.wg.Add(1)
		go t.serve(conn)
	}
}

// serve handles an incoming connection: the handshake (which checks the
// peer's certificate), then a stream for memberlist or a run of packets.
func (t *tlsTransport) serve(raw net.Conn) {
	defer t.wg.Done()
	conn := tls.Server(raw, t.server)
	_ = conn.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := conn.Handshake(); err != nil {
		t.refused(raw.RemoteAddr(), err)
		conn.Close()
		return
	}
	r := bufio.NewReader(conn)
	mode, err := r.ReadByte()
	if err != nil {
		conn.Close()
		return
	}
	switch mode {
	case modeStream:
		_ = conn.SetDeadline(time.Time{})
		select {
		case t.streamCh <- &bufferedConn{Conn: conn, r: r}:
		case <-t.stopc:
			conn.Close()
		}
	case modePacket:
		t.readPackets(conn, r)
	default:
		conn.Close()
	}
}

// refused logs a connection whose handshake failed (a peer without a
// certificate from the cluster's CA), at most once per 10 s with a count.
func (t *tlsTransport) refused(from net.Addr, err error) {
	n := t.refusals.Add(1)
	now := time.Now().UnixNano()
	last := t.lastRefusalLog.Load()
	if now-last < int64(10*time.Second) || !t.lastRefusalLog.CompareAndSwap(last, now) {
		return
	}
	t.log.Warn("gossip connection refused: no valid peer certificate", "remote", from.String(), "err", err, "refused-so-far", n)
}

// Refusals returns how many incoming gossip connections failed their TLS
// handshake.
func (t *tlsTransport) Refusals() int64 { return t.refusals.Load() }

func (t *tlsTransport) readPackets(conn *tls.Conn, r *bufio.Reader) {
	t.mu.Lock()
	if t.closed.Load() {
		t.mu.Unlock()
		conn.Close()
		return
	}
	t.incoming[conn] = struct{}{}
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.incoming, conn)
		t.mu.Unlock()
		conn.Close()
	}()
	var n [4]byte
	if _, err := io.ReadFull(r, n[:2]); err != nil {
		return
	}
	hello := make([]byte, binary.BigEndian.Uint16(n[:2]))
	if _, err := io.ReadFull(r, hello); err != nil {
		return
	}
	from, err := net.ResolveTCPAddr("tcp", string(hello))
	if err != nil || from.IP == nil {
		return
	}
	_ = conn.SetDeadline(time.Time{})
	for {
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(n[:])
		if size > maxPacket {
			t.log.Warn("gossip packet too large; connection closed", "from", from.String(), "bytes", size)
			return
		}
		buf := make([]byte, size)
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		select {
		case t.packetCh <- &memberlist.Packet{Buf: buf, From: from, Timestamp: time.Now()}:
		case <-t.stopc:
			return
		}
	}
}

// bufferedConn is a connection whose first bytes were read through r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// packetSender writes one destination's packets on a connection of its
// own, dialled when a packet comes and none is open.
type packetSender struct {
	t    *tlsTransport
	addr string
	q    chan []byte
	conn net.Conn
}

func (s *packetSender) run() {
	defer s.t.wg.Done()
	idle := time.NewTimer(senderIdle)
	defer idle.Stop()
	defer func() {
		if s.conn != nil {
			s.conn.Close()
		}
	}()
	for {
		select {
		case <-s.t.stopc:
			return
		case <-idle.C:
			s.t.mu.Lock()
			if len(s.q) == 0 {
				delete(s.t.senders, s.addr)
				s.t.mu.Unlock()
				return
			}
			s.t.mu.Unlock()
			idle.Reset(senderIdle)
		case b := <-s.q:
			idle.Reset(senderIdle)
			s.send(b)
		}
	}
}

func (s *packetSender) send(b []byte) {
	if s.conn == nil {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: packetWriteTimeout}, "tcp", s.addr, s.t.client)
		if err != nil {
			s.t.log.Debug("gossip packet dropped: cannot reach the peer", "to", s.addr, "err", err)
			return
		}
		hello := make([]byte, 3+len(s.t.advertise))
		hello[0] = modePacket
		binary.BigEndian.PutUint16(hello[1:3], uint16(len(s.t.advertise)))
		copy(hello[3:], s.t.advertise)
		_ = conn.SetWriteDeadline(time.Now().Add(packetWriteTimeout))
		if _, err := conn.Write(hello); err != nil {
			conn.Close()
			return
		}
		s.conn = conn
	}
	frame := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(frame, uint32(len(b)))
	copy(frame[4:], b)
	_ = s.conn.SetWriteDeadline(time.Now().Add(packetWriteTimeout))
	if _, err := s.conn.Write(frame); err != nil {
		s.t.log.Debug("gossip packet dropped: connection failed", "to", s.addr, "err", err)
		s.conn.Close()
		s.conn = nil
	}
}

var _ memberlist.Transport = (*tlsTransport)(nil)
