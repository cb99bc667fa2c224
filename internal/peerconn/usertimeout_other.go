//go:build !linux

package peerconn

import (
	"net"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT is not available
// (gRPC sets it only on Linux too).
func setUserTimeout(net.Conn, time.Duration) {}
