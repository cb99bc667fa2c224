package cluster

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// NodeInfo is what a node publishes about itself.
type NodeInfo struct {
	ID         uint64   `json:"id"`
	Name       string   `json:"name"`
	PeerAddr   string   `json:"peer"`   // host:port of the internal gRPC service (raft, kvapi)
	ClientURLs []string `json:"client"` // etcd API URLs
	Leads      []uint64 `json:"leads"`  // raft groups this node leads
	// LeadsOmitted is set when Leads did not fit in the gossip message
	// and was left out: the node leads groups it does not list.
	LeadsOmitted bool `json:"leads_omitted,omitempty"`
	// NodeLoad is the node's leader write load; its fields travel at the
	// top level of the JSON ("load", "unmeasured", "windows").
	NodeLoad
}

// NodeLoad is a node's published leader load.
type NodeLoad struct {
	// Load is the writes per second the partitions this node leads took
	// over the last window it measured them in, and on the TSO leader the
	// TSO requests it answered, weighted by what one costs against a
	// write (the leader balancer evens it out).
	Load float64 `json:"load,omitempty"`
	// Recent is the same partitions' remembered rates (each the larger
	// of its last rate and its remembered one, decaying with a half-life
	// of minutes), which the leader balancer's preferred-node rule
	// compares, so a pause in the writes does not undo its load moves.
	Recent float64 `json:"recent,omitempty"`
	// Unmeasured counts the partitions this node leads that it has not
	// measured yet (it got their leadership since its last window): Load
	// is low by their rates.
	Unmeasured int `json:"unmeasured,omitempty"`
	// Windows counts the windows the node measured its load over since it
	// started, so others can tell a load measured after some moment from
	// an older one.
	Windows uint64 `json:"windows,omitempty"`
	// Moving counts the partitions this node leads whose replicas are
	// not at their placement yet (a replica move is under way or due).
	// Splits across placements wait until no node has any: the loads do
	// not show a half that is still moving to its new nodes.
	Moving int `json:"moving,omitempty"`
	// Unsplittable is set when the node leads no partition a split for
	// balance could split (each has too few keys or writes): of the
	// busiest nodes, the one that splits across placements is one that
	// can.
	Unsplittable bool `json:"unsplittable,omitempty"`
}

// Config configures Membership.
type Config struct {
	Self NodeInfo
	// BindAddr and BindPort are the gossip listen address (TCP and UDP).
	BindAddr string
	BindPort int
	// AdvertiseAddr is the address peers gossip to (default BindAddr).
	AdvertiseAddr string
	// Seeds are gossip addresses of other nodes to join through.
	Seeds []string
	// Static are the cluster's members (the raft membership: their IDs,
	// names and peer addresses; SetMembers replaces them). Only members
	// count: a node gossip knows that is not one is ignored, and a
	// member's peer address is always the one given here, never one that
	// gossip claims (a node that could speak the gossip could otherwise
	// redirect a member's traffic to itself).
	Static []NodeInfo
	// SecretKey, if set, encrypts and authenticates gossip (AES-GCM; 16,
	// 24 or 32 bytes): nodes without the key can neither read it nor join.
	SecretKey []byte
	// Label, if set, marks every gossip packet and stream; a node drops
	// those of another label (another cluster's nodes). It is no secret.
	Label string
	// TLS, if set, carries gossip over mutually authenticated TLS (see
	// TLS): the nodes with peer TLS on gossip only with holders of a
	// certificate from the peer CA.
	TLS *TLS
	// Fast uses memberlist's local-network timings (tests).
	Fast   bool
	Logger *slog.Logger
}

// Membership is a node's gossip membership.
type Membership struct {
	cfg Config
	ml  *memberlist.Memberlist
	tls *tlsTransport // nil without Config.TLS
	log *slog.Logger

	mu struct {
		sync.RWMutex
		self   NodeInfo                // protected by mu
		nodes  map[uint64]*nodeState   // what gossip says; protected by mu
		static map[uint64]NodeInfo     // the members; protected by mu
		leader map[uint64]leaderRecord // group -> leader, protected by mu
	}
	stopc chan struct{}
	wg    sync.WaitGroup
}

type nodeState struct {
	info      NodeInfo
	alive     bool
	deadSince time.Time
}

type leaderRecord struct {
	node uint64
	at   time.Time
}

// Start joins the gossip.
func Start(cfg Config) (*Membership, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Membership{cfg: cfg, log: cfg.Logger.With("component", "cluster"), stopc: make(chan struct{})}
	m.mu.self = cfg.Self
	m.mu.nodes = make(map[uint64]*nodeState)
	m.mu.static = make(map[uint64]NodeInfo)
	m.mu.leader = make(map[uint64]leaderRecord)
	for _, n := range cfg.Static {
		m.mu.static[n.ID] = n
	}
	mc := memberlist.DefaultLANConfig()
	if cfg.Fast {
		mc = memberlist.DefaultLocalConfig()
		mc.ProbeInterval = 200 * time.Millisecond
		mc.GossipInterval = 50 * time.Millisecond
	}
	// Gossip messages are a few hundred bytes (NodeMeta stays under
	// memberlist's 512-byte limit): LZW saves little on them and
	// allocates its tables for every packet, sent and received; in CPU
	// profiles of six busy nodes (3.5% of their CPU in memberlist),
	// compressing and decompressing was two fifths of memberlist's cost.
	// Peers read compressed messages either way.
	mc.EnableCompression = false
	mc.Name = fmt.Sprintf("%x", cfg.Self.ID)
	mc.BindAddr, mc.BindPort = cfg.BindAddr, cfg.BindPort
	mc.AdvertiseAddr, mc.AdvertisePort = cfg.AdvertiseAddr, cfg.BindPort
	if ip := net.ParseIP(cfg.BindAddr); mc.AdvertiseAddr == "" && ip != nil && !ip.IsUnspecified() {
		mc.AdvertiseAddr = cfg.BindAddr
	}
	// Otherwise (a wildcard bind and nothing to advertise) memberlist
	// advertises a private address of this host: advertising the wildcard
	// itself would make every probe of this node fail, and gossip would
	// call it dead.
	mc.Label = cfg.Label
	if len(cfg.SecretKey) > 0 {
		mc.SecretKey = cfg.SecretKey
	}
	mc.Delegate = delegate{m}
	mc.Events = events{m}
	mc.Logger = log.New(slogWriter{m.log}, "", 0)
	if cfg.TLS != nil {
		t, err := newTLSTransport(cfg.TLS, cfg.BindAddr, cfg.BindPort, m.log)
		if err != nil {
			return nil, fmt.Errorf("cluster: start gossip on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
		}
		mc.Transport, m.tls = t, t
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		if m.tls != nil {
			_ = m.tls.Shutdown()
		}
		return nil, fmt.Errorf("cluster: start gossip on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
	}
	m.ml = ml
	m.wg.Add(1)
	go m.joinLoop()
	return m, nil
}

// joinLoop joins the seeds until at least one answers, then keeps retrying
// while no other node is known (a node that started first waits for the
// rest).
func (m *Membership) joinLoop() {
	defer m.wg.Done()
	for {
		if len(m.cfg.Seeds) > 0 && m.ml.NumMembers() <= 1 {
			if _, err := m.ml.Join(m.cfg.Seeds); err != nil {
				m.log.Debug("gossip join failed; retrying", "err", err)
			}
		}
		select {
		case <-m.stopc:
			return
		case <-time.After(time.Second):
		}
	}
}

// Stop leaves the gossip.
func (m *Membership) Stop() {
	select {
	case <-m.stopc:
		return
	default:
	}
	close(m.stopc)
	m.wg.Wait()
	_ = m.ml.Leave(500 * time.Millisecond)
	_ = m.ml.Shutdown()
}

// SetLeadsAndLoad publishes the groups this node leads and its leader
// load in one gossip message, so no node sees the leaderships with a load
// from before them (see Published).
func (m *Membership) SetLeadsAndLoad(groups []uint64, l NodeLoad) {
	m.mu.Lock()
	same := fmt.Sprint(m.mu.self.Leads) == fmt.Sprint(groups) && m.mu.self.NodeLoad == l
	m.mu.self.Leads = append([]uint64(nil), groups...)
	m.mu.self.NodeLoad = l
	m.mu.Unlock()
	if !same {
		_ = m.ml.UpdateNode(time.Second)
	}
}

// Published returns what every alive member gossip knows, this one
// included, last published: its leaderships and leader load come from
// the same message, so a group a node leads but did not list (and did
// not omit: NodeInfo.LeadsOmitted) is one it got after the load it
// published.
func (m *Membership) Published() map[uint64]NodeInfo {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := map[uint64]NodeInfo{m.mu.self.ID: m.mu.self}
	for id, n := range m.mu.nodes {
		if n.alive && id != m.mu.self.ID && m.memberLocked(id) {
			out[id] = n.info
		}
	}
	return out
}

// Refusals returns how many incoming gossip connections failed the TLS
// handshake (0 without Config.TLS).
func (m *Membership) Refusals() int64 {
	if m.tls == nil {
		return 0
	}
	return m.tls.Refusals()
}

// SetMembers replaces the cluster's members (see Config.Static): the
// raft membership as this node knows it now.
func (m *Membership) SetMembers(members []NodeInfo) {
	static := make(map[uint64]NodeInfo, len(members))
	for _, n := range members {
		static[n.ID] = n
	}
	m.mu.Lock()
	m.mu.static = static
	m.mu.Unlock()
}

// memberLocked reports whether id is this node or a member; m.mu is held.
func (m *Membership) memberLocked(id uint64) bool {
	_, ok := m.mu.static[id]
	return ok || id == m.mu.self.ID
}

// Resolve returns the internal address of node id: a member's configured
// peer address, never one gossip claims.
func (m *Membership) Resolve(id uint64) (string, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if id == m.mu.self.ID {
		return m.mu.self.PeerAddr, true
	}
	if n, ok := m.mu.static[id]; ok && n.PeerAddr != "" {
		return n.PeerAddr, true
	}
	return "", false
}

// Alive reports whether member id is alive as far as gossip knows (this
// node is always alive; a node gossip never saw, or that is no member, is
// not).
func (m *Membership) Alive(id uint64) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if id == m.mu.self.ID {
		return true
	}
	n := m.mu.nodes[id]
	return n != nil && n.alive && m.memberLocked(id)
}

// DownFor returns how long gossip has considered node id dead (0 if it is
// alive or was never seen).
func (m *Membership) DownFor(id uint64) time.Duration {
	m.mu.RLock()
	defer m.mu.RUnlock()
	n := m.mu.nodes[id]
	if n == nil || n.alive || n.deadSince.IsZero() {
		return 0
	}
	return time.Since(n.deadSince)
}

// LeaderHint returns the node that gossip says leads group, if any.
func (m *Membership) LeaderHint(group uint64) (uint64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.mu.leader[group]
	if !ok || !m.memberLocked(r.node) {
		return 0, false
	}
	return r.node, true
}

// Nodes returns every member gossip knows, this one included, with
// liveness.
func (m *Membership) Nodes() []NodeStatus {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := []NodeStatus{{Info: m.mu.self, Alive: true}}
	for _, n := range m.mu.nodes {
		if n.info.ID != m.mu.self.ID && m.memberLocked(n.info.ID) {
			out = append(out, NodeStatus{Info: n.info, Alive: n.alive})
		}
	}
	return out
}

// NodeStatus is a node and whether it is alive.
type NodeStatus struct {
	Info  NodeInfo
	Alive bool
}

func (m *Membership) update(node *memberlist.Node, alive bool) {
	var info NodeInfo
	if err := json.Unmarshal(node.Meta, &info); err != nil || info.ID == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.mu.nodes[info.ID]
	if n == nil {
		n = &nodeState{}
		m.mu.nodes[info.ID] = n
	}
	n.info = info
	if alive != n.alive {
		if alive {
			n.deadSince = time.Time{}
		} else {
			n.deadSince = time.Now()
		}
		n.alive = alive
		m.log.Info("node liveness changed", "node", fmt.Sprintf("%x", info.ID), "name", info.Name, "alive", alive)
	}
	if !m.memberLocked(info.ID) {
		return // no member: its leadership claims route nothing
	}
	if !alive || !info.LeadsOmitted {
		// A node that no longer lists a group it was the last to claim
		// (it stepped down, or moved the leadership away) or that died
		// leads it no more as far as it knows: forget the claim rather
		// than route there until another node claims the group. A
		// caller that finds no hint asks the group's replicas instead.
		listed := make(map[uint64]bool, len(info.Leads))
		if alive {
			for _, g := range info.Leads {
				listed[g] = true
			}
		}
		for g, r := range m.mu.leader {
			if r.node == info.ID && !listed[g] {
				delete(m.mu.leader, g)
			}
		}
	}
	if alive {
		now := time.Now()
		for _, g := range info.Leads {
			if r, ok := m.mu.leader[g]; !ok || r.node == info.ID || now.After(r.at) {
				m.mu.leader[g] = leaderRecord{node: info.ID, at: now}
			}
		}
	}
}

type delegate struct{ m *Membership }

func (d delegate) NodeMeta(limit int) []byte {
	d.m.mu.RLock()
	self := d.m.mu.self
	d.m.mu.RUnlock()
	b, _ := json.Marshal(self)
	if len(b) > limit {
		self.Leads, self.LeadsOmitted = nil, true // too many groups to gossip; peers learn from errors
		b, _ = json.Marshal(self)
	}
	return b
}
func (delegate) NotifyMsg([]byte)                {}
func (delegate) GetBroadcasts(int, int) [][]byte { return nil }
func (delegate) LocalState(bool) []byte          { return nil }
func (delegate) MergeRemoteState([]byte, bool)   {}

type events struct{ m *Membership }

func (e events) NotifyJoin(n *memberlist.Node)   { e.m.update(n, true) }
func (e events) NotifyLeave(n *memberlist.Node)  { e.m.update(n, false) }
func (e events) NotifyUpdate(n *memberlist.Node) { e.m.update(n, n.State == memberlist.StateAlive) }

type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Debug(strings.TrimSpace(string(p)))
	return len(p), nil
}

// GossipAddr returns the gossip address of a node whose peer address is
// peer: the same host, port + 1.
func GossipAddr(peer string) (string, error) {
	host, port, err := net.SplitHostPort(peer)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1)), nil
}

var _ io.Writer = slogWriter{}
