package peerconn

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// checkUserTimeout checks c, a lingerConn over TCP, has TCP_USER_TIMEOUT
// set to want: gRPC sets it only on a bare *net.TCPConn.
func checkUserTimeout(t *testing.T, c net.Conn, want time.Duration) {
	t.Helper()
	raw, err := c.(*lingerConn).Conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ms int
	var gerr error
	raw.Control(func(fd uintptr) {
		ms, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	})
	if gerr != nil {
		t.Fatal(gerr)
	}
	if got := time.Duration(ms) * time.Millisecond; got != want {
		t.Fatalf("TCP_USER_TIMEOUT = %v, want %v", got, want)
	}
}
