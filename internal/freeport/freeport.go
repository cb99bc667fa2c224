package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
)

// low and high bound the ports drawn from: above the well-known and
// registered ports most services use, below the ephemeral range.
const low = 15000

var (
	mu     sync.Mutex
	handed = map[int]bool{} // protected by mu
)

// high returns the first port of the ephemeral range (exclusive bound).
func high() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		var lo, hi int
		if _, err := fmt.Sscanf(string(b), "%d %d", &lo, &hi); err == nil && lo > low+1000 {
			return lo
		}
	}
	return 32768
}

func tcpFree(p int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func udpFree(p int) bool {
	u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		return false
	}
	u.Close()
	return true
}

// pick returns a port p such that p..p+n-1 are free (TCP; the last also
// UDP when n > 1: a node's gossip port) and were never handed out.
func pick(n int) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	hi := high()
	for range 1000 {
		p := low + rand.IntN(hi-low-n)
		ok := true
		for i := range n {
			if handed[p+i] || !tcpFree(p+i) {
				ok = false
				break
			}
		}
		if ok && n > 1 && !udpFree(p+n-1) {
			ok = false
		}
		if ok {
			for i := range n {
				handed[p+i] = true
			}
			return p, nil
		}
	}
	return 0, errors.New("freeport: no free loopback port found")
}

// Port returns a free loopback TCP port.
func Port() (int, error) { return pick(1) }

// Pair returns a port p with p and p+1 free: a node's peer port and, by
// convention, its gossip port (TCP and UDP).
func Pair() (int, error) { return pick(2) }
