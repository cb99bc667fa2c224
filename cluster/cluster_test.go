package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestGossipMembershipAndLeaders starts three memberships, checks that each
// learns the others' addresses, leaderships and loads, that a leadership a
// node stops listing is forgotten, and that a stopped node is reported dead
// (and has no load or leaderships).
func TestGossipMembershipAndLeaders(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var ms []*Membership
	var seeds []string
	for i := 1; i <= 3; i++ {
		port := freePort(t)
		cfg := Config{
			Self:     NodeInfo{ID: uint64(i), Name: fmt.Sprint("n", i), PeerAddr: fmt.Sprintf("127.0.0.1:%d", 10000+i)},
			BindAddr: "127.0.0.1", BindPort: port, Seeds: seeds, Fast: true, Logger: log, Static: members(3),
		}
		m, err := Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
		seeds = append(seeds, fmt.Sprintf("127.0.0.1:%d", port))
	}
	defer func() {
		for _, m := range ms[:2] {
			m.Stop()
		}
	}()
	ms[1].SetLeadsAndLoad([]uint64{7, 100}, NodeLoad{})
	ms[2].SetLeadsAndLoad(nil, NodeLoad{Load: 250.5, Recent: 300.25, Unmeasured: 2, Windows: 7})
	// Too many groups to fit in a gossip message: left out, and said so.
	var many []uint64
	for g := range uint64(300) {
		many = append(many, 1000+g)
	}
	ms[0].SetLeadsAndLoad(many, NodeLoad{})
	eventually(t, func() bool {
		for _, m := range ms {
			p := m.Published()
			if len(p) != 3 || p[3].NodeLoad != (NodeLoad{Load: 250.5, Recent: 300.25, Unmeasured: 2, Windows: 7}) || p[1].NodeLoad != (NodeLoad{}) || p[2].NodeLoad != (NodeLoad{}) {
				return false
			}
			for id := uint64(1); id <= 3; id++ {
				if a, ok := m.Resolve(id); !ok || a != fmt.Sprintf("127.0.0.1:%d", 10000+id) || !m.Alive(id) {
					return false
				}
			}
			if l, ok := m.LeaderHint(100); !ok || l != 2 {
				return false
			}
			if fmt.Sprint(p[2].Leads) != "[7 100]" || p[2].LeadsOmitted || p[3].Leads != nil || p[3].LeadsOmitted {
				return false
			}
			if m != ms[0] && (p[1].Leads != nil || !p[1].LeadsOmitted) {
				return false
			}
		}
		return true
	})
	// A node that stops listing a group (it stepped down) no longer leads
	// it as far as gossip says, and neither does a node that died.
	ms[1].SetLeadsAndLoad([]uint64{7}, NodeLoad{})
	ms[2].SetLeadsAndLoad([]uint64{9}, NodeLoad{Load: 250.5, Recent: 300.25, Unmeasured: 2, Windows: 7})
	eventually(t, func() bool {
		for _, m := range ms {
			if _, ok := m.LeaderHint(100); ok {
				return false
			}
			if l, ok := m.LeaderHint(7); !ok || l != 2 {
				return false
			}
			if l, ok := m.LeaderHint(9); !ok || l != 3 {
				return false
			}
		}
		return true
	})
	ms[2].Stop()
	eventually(t, func() bool { return !ms[0].Alive(3) && ms[0].DownFor(3) > 0 })
	if l, ok := ms[0].LeaderHint(9); ok {
		t.Errorf("gossip says dead node %d leads group 9", l)
	}
	if l, ok := ms[0].LeaderHint(7); !ok || l != 2 {
		t.Errorf("gossip says %d (%v) leads group 7 after another node died, want 2", l, ok)
	}
	if _, ok := ms[0].Published()[3]; ok {
		t.Fatal("a dead node's load is still listed")
	}
}

// members are nodes 1..n at the peer addresses the tests give them.
func members(n int) []NodeInfo {
	var out []NodeInfo
	for i := 1; i <= n; i++ {
		out = append(out, NodeInfo{ID: uint64(i), Name: fmt.Sprint("n", i), PeerAddr: fmt.Sprintf("127.0.0.1:%d", 10000+i)})
	}
	return out
}

func eventually(t *testing.T, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGossipEncryption: nodes sharing a secret key gossip with each other;
// a node with another key (or none) cannot join them.
func TestGossipEncryption(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	keyA := []byte("0123456789abcdef0123456789abcdef")
	keyB := []byte("fedcba9876543210fedcba9876543210")
	start := func(id uint64, key []byte, seeds []string) (*Membership, string) {
		port := freePort(t)
		m, err := Start(Config{
			Self:     NodeInfo{ID: id, Name: fmt.Sprint("n", id), PeerAddr: fmt.Sprintf("127.0.0.1:%d", 10000+id)},
			BindAddr: "127.0.0.1", BindPort: port, Seeds: seeds, Fast: true, Logger: log, SecretKey: key, Static: members(4),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Stop)
		return m, fmt.Sprintf("127.0.0.1:%d", port)
	}
	m1, seed := start(1, keyA, nil)
	m2, _ := start(2, keyA, []string{seed})
	m3, _ := start(3, keyB, []string{seed})
	m4, _ := start(4, nil, []string{seed})
	eventually(t, func() bool { return m1.Alive(2) && m2.Alive(1) })
	time.Sleep(2 * time.Second) // the others have had many chances to join
	for _, id := range []uint64{3, 4} {
		if m1.Alive(id) || m2.Alive(id) {
			t.Fatalf("node %d joined without the gossip key", id)
		}
	}
	if m3.Alive(1) || m4.Alive(1) {
		t.Fatal("a node without the key learned of the cluster")
	}
}

// TestWildcardBindStaysAlive binds gossip to every interface with no
// address to advertise (as a node listening on 0.0.0.0 whose peer URL
// names a host does): the nodes must advertise an address the others can
// probe, not the wildcard, or they call each other dead.
func TestWildcardBindStaysAlive(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var ms []*Membership
	var seeds []string
	for i := 1; i <= 2; i++ {
		port := freePort(t)
		m, err := Start(Config{
			Self:     NodeInfo{ID: uint64(i), Name: fmt.Sprint("n", i), PeerAddr: fmt.Sprintf("127.0.0.1:%d", 10000+i)},
			BindAddr: "0.0.0.0", BindPort: port, Seeds: seeds, Fast: true, Logger: log, Static: members(2),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Stop()
		if a := m.ml.LocalNode().Addr; a.IsUnspecified() {
			t.Fatalf("node %d advertises the wildcard address %v", i, a)
		}
		ms = append(ms, m)
		seeds = append(seeds, fmt.Sprintf("127.0.0.1:%d", port))
	}
	eventually(t, func() bool { return ms[0].Alive(2) && ms[1].Alive(1) })
	// Fast probes every 200 ms: a node advertising an unreachable address
	// is suspected and declared dead well within this.
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if !ms[0].Alive(2) || !ms[1].Alive(1) {
			t.Fatal("a node bound to the wildcard address was declared dead")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
