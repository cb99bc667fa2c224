package peerconn

import (
	"errors"
	"fmt"
	"sync"

	"github.com/brainkv/brain/internal/rpccodec"
	"google.golang.org/grpc"
)

// ErrClosed is returned by a closed Pool.
var ErrClosed = errors.New("peerconn: pool closed")

// Pool holds the connection to each peer node, dialed on first use and
// redialed when the node's address changes.
type Pool struct {
	resolve func(node uint64) (addr string, ok bool)
	opts    []grpc.DialOption

	mu     sync.Mutex
	conns  map[uint64]peerConn // protected by mu
	closed bool                // protected by mu
}

type peerConn struct {
	addr string
	conn *grpc.ClientConn
}

// New returns a pool that finds nodes' addresses with resolve; opts are
// added to rpccodec's peer dial options (credentials, cluster identity).
func New(resolve func(node uint64) (string, bool), opts ...grpc.DialOption) *Pool {
	return &Pool{
		resolve: resolve,
		opts:    append(rpccodec.PeerDialOptions(), opts...),
		conns:   make(map[uint64]peerConn),
	}
}

// Conn returns the connection to node. gRPC connects lazily and
// reconnects by itself; a connection whose node moved to another address
// is closed (its calls and streams fail and are retried by their users)
// and replaced.
func (p *Pool) Conn(node uint64) (*grpc.ClientConn, error) {
	addr, ok := p.resolve(node)
	if !ok {
		return nil, fmt.Errorf("peerconn: no address for node %x", node)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	pc, ok := p.conns[node]
	if ok && pc.addr == addr {
		return pc.conn, nil
	}
	if ok {
		pc.conn.Close()
		delete(p.conns, node)
	}
	conn, err := grpc.NewClient(addr, p.opts...)
	if err != nil {
		return nil, err
	}
	p.conns[node] = peerConn{addr: addr, conn: conn}
	return conn, nil
}

// Close closes every connection; later Conn calls fail with ErrClosed.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, pc := range p.conns {
		pc.conn.Close()
	}
	p.conns = nil
}
