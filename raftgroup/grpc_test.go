package raftgroup

import (
	"net"
	"sync"
	"testing"

	"github.com/brainkv/brain/internal/peerconn"
	"github.com/brainkv/brain/internal/rpccodec"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
)

// TestGRPCTransport runs a group over real gRPC connections on loopback:
// replication, then a new replica caught up by a snapshot stream.
func TestGRPCTransport(t *testing.T) {
	var mu sync.Mutex
	addrs := map[uint64]string{}
	resolve := func(id uint64) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		a, ok := addrs[id]
		return a, ok
	}
	type gnode struct {
		*testNode
		srv *grpc.Server
		tr  *GRPCTransport
	}
	start := func(id uint64, voters []uint64) *gnode {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		addrs[id] = l.Addr().String()
		mu.Unlock()
		db := openMem(t, vfs.NewMem())
		cfg := testConfig(id)
		cfg.MaxFollowerLag = 40
		cfg.NewReplica = func(group uint64) (StateMachine, error) {
			return &snapCounter{counterSM: newCounterSM(t, db, group), db: db}, nil
		}
		conns := peerconn.New(resolve)
		t.Cleanup(conns.Close)
		tr := NewGRPCTransport(id, conns, testLogger())
		h, err := NewHost(cfg, db, tr)
		if err != nil {
			t.Fatal(err)
		}
		tr.Bind(h)
		srv := grpc.NewServer(grpc.ForceServerCodecV2(rpccodec.New()))
		RegisterService(srv, h)
		go srv.Serve(l)
		if voters != nil {
			if _, err := h.CreateGroup(testGroup, voters, &snapCounter{counterSM: newCounterSM(t, db, testGroup), db: db}); err != nil {
				t.Fatal(err)
			}
		}
		h.Start()
		return &gnode{testNode: &testNode{id: id, db: db, host: h}, srv: srv, tr: tr}
	}
	var nodes []*gnode
	for id := uint64(1); id <= 3; id++ {
		nodes = append(nodes, start(id, []uint64{1, 2, 3}))
	}
	n4 := start(4, nil)
	nodes = append(nodes, n4)
	defer func() {
		for _, n := range nodes {
			n.srv.Stop()
			n.tr.Close()
			n.host.Stop()
		}
	}()
	nodes[0].host.Group(testGroup).Campaign()
	var gs []*Group
	for _, n := range nodes[:3] {
		gs = append(gs, n.host.Group(testGroup))
	}
	leader := waitLeader(t, gs...)
	propose(t, leader, 200)
	for _, n := range nodes[:3] {
		waitCount(t, n.testNode, 200)
	}
	changeConf(t, leader, raftpb.ConfChangeAddLearnerNode, 4)
	waitCount(t, n4.testNode, 200)
	propose(t, leader, 10)
	waitCount(t, n4.testNode, 210)
}
