package peerconn

import (
	"context"
	"net"
	"sync"
	"time"
)

// maxLingerBytes is how much a lingering connection holds before it
// writes without waiting: bulk traffic (snapshots, feed catch-up) leaves
// in writes of about this size, as it did in gRPC's own 32 KiB ones.
const maxLingerBytes = 64 << 10

// lingerConn holds what is written to it for up to linger and writes it
// to the socket in one system call, together with whatever else is written
// meanwhile.
//
// gRPC's writer flushes its buffer to the socket whenever it runs out of
// queued frames, after one yield of the processor. Between nodes short of
// CPU that is about once per message: a raft append, a forwarded write and
// its answer, each a system call on the sender and one on the receiver,
// and the system calls (with the network stack's work they carry) are a
// large share of a write's cost. With more nodes, each connection carries
// less of a node's traffic, so fewer messages share a flush and a write
// costs more the larger the cluster. Lingering lets the messages that a
// node produces within a short window share one write whatever the
// cluster's size, at the price of up to linger more latency per hop.
//
// Writes report success once buffered; a failed socket write is returned
// by the next Write (gRPC's reader sees the broken connection as well).
type lingerConn struct {
	net.Conn
	linger time.Duration

	mu    sync.Mutex
	buf   []byte // protected by mu
	armed bool   // protected by mu: timer will flush buf
	err   error  // protected by mu: the first failed socket write
	timer *time.Timer
}

func newLingerConn(c net.Conn, linger time.Duration) *lingerConn {
	l := &lingerConn{Conn: c, linger: linger}
	l.timer = time.AfterFunc(time.Hour, l.flushTimer)
	l.timer.Stop()
	return l
}

// Write buffers p, writing it and what was buffered before at once when
// together they reach maxLingerBytes.
func (l *lingerConn) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return 0, l.err
	}
	l.buf = append(l.buf, p...)
	if len(l.buf) >= maxLingerBytes {
		if err := l.flushLocked(); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	if !l.armed {
		l.armed = true
		l.timer.Reset(l.linger)
	}
	return len(p), nil
}

func (l *lingerConn) flushTimer() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = false
	if l.err == nil {
		l.flushLocked()
	}
}

// flushLocked writes the buffer to the socket. l.mu must be held.
func (l *lingerConn) flushLocked() error {
	if len(l.buf) == 0 {
		return nil
	}
	_, err := l.Conn.Write(l.buf)
	if err != nil {
		l.err = err
	}
	// Keep the buffer unless a burst grew it well past the usual size.
	if cap(l.buf) > 2*maxLingerBytes {
		l.buf = nil
	} else {
		l.buf = l.buf[:0]
	}
	return err
}

// Close writes what is buffered, if no write is under way and the socket
// takes it within a short deadline, and closes the connection. It never
// waits for a write blocked on a peer that does not read: closing the
// socket is what ends such a write.
func (l *lingerConn) Close() error {
	if l.mu.TryLock() {
		l.timer.Stop()
		l.armed = false
		if l.err == nil && len(l.buf) > 0 {
			l.Conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			l.flushLocked()
		}
		l.err = net.ErrClosed
		l.mu.Unlock()
	}
	return l.Conn.Close()
}

// LingerDialer returns a dialer for grpc.WithContextDialer whose
// connections linger writes (see lingerConn); userTimeout is set as the
// connections' TCP_USER_TIMEOUT.
func LingerDialer(linger, userTimeout time.Duration) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		setUserTimeout(c, userTimeout)
		return newLingerConn(c, linger), nil
	}
}

// LingerListener wraps l so that the connections it accepts linger writes
// (see lingerConn); userTimeout is set as their TCP_USER_TIMEOUT.
func LingerListener(l net.Listener, linger, userTimeout time.Duration) net.Listener {
	return lingerListener{Listener: l, linger: linger, userTimeout: userTimeout}
}

type lingerListener struct {
	net.Listener
	linger      time.Duration
	userTimeout time.Duration
}

func (l lingerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	setUserTimeout(c, l.userTimeout)
	return newLingerConn(c, l.linger), nil
}
