package peerconn

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout sets TCP_USER_TIMEOUT on c, which gRPC sets on the
// connections it dials and accepts when they are *net.TCPConn (a wrapped
// connection is not): unacknowledged data fails the connection after
// timeout instead of the kernel's many minutes of retransmissions.
func setUserTimeout(c net.Conn, timeout time.Duration) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(timeout/time.Millisecond))
	})
}
