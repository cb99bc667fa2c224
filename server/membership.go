package server

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/brainkv/brain/cluster"
	"github.com/cockroachdb/pebble/v2"
)

// membership is the node's gossip membership.
type membership = cluster.Membership

// loadOrCreateIdentity loads the node's identity, or creates it (and the
// cluster's membership) from the configuration on first start.
func (s *Server) loadOrCreateIdentity() error {
	cfg := s.cfg
	id, err := loadIdentity(s.db)
	if err != nil {
		return err
	}
	if id != nil {
		if id.Removed {
			return fmt.Errorf("server: this member (%s) was removed from the cluster; its store cannot serve again: to add the node back, start it with a new --data-dir and --join", formatID(id.MemberID))
		}
		if len(id.Members) == 0 { // a store created before clusters existed
			id.Members = []member{{ID: id.MemberID, Name: id.Name, PeerURLs: id.PeerURLs}}
			id.Replicas = 1
		}
		if fmt.Sprint(id.SplitPoints) != fmt.Sprint(cfg.InitialSplitPoints) {
			s.log.Warn("--initial-split-points differ from the store's; using the store's", "store", id.SplitPoints)
		}
		if fmt.Sprint(id.PeerURLs) != fmt.Sprint(cfg.InitialAdvertisePeerURLs) {
			// The member's peer URLs are fixed when its store is created
			// (its ID derives from them); the other members reach it there.
			s.log.Warn("--initial-advertise-peer-urls differ from the store's; the store's stay this member's peer URLs", "store", id.PeerURLs, "flag", cfg.InitialAdvertisePeerURLs)
		}
		s.id = id
		if cfg.AllowJoin && !s.clustered() {
			s.id.Clustered = true
			if err := s.saveIdentity(); err != nil {
				return err
			}
			s.log.Info("this single-node store now serves peers (--allow-join): other nodes can --join it", "peer-urls", id.PeerURLs)
		}
		return nil
	}
	if cfg.InitialClusterState == "existing" {
		if id, err = s.joinIdentity(); err != nil {
			return err
		}
		s.id = id
		if err := s.saveIdentity(); err != nil {
			return err
		}
		s.log.Info("joined a running cluster", "member-id", formatID(id.MemberID), "cluster-id", formatID(id.ClusterID), "revision", id.JoinedAt)
		return nil
	}
	members, err := initialMembers(cfg.InitialCluster, cfg.InitialClusterToken)
	if err != nil {
		return err
	}
	id = &identity{
		Name:        cfg.Name,
		PeerURLs:    cfg.InitialAdvertisePeerURLs,
		SplitPoints: append([]string(nil), cfg.InitialSplitPoints...),
		Members:     members,
		Replicas:    cfg.Replicas,
		Placement:   cfg.Placement,
	}
	id.MemberID = memberID(id.PeerURLs, cfg.InitialClusterToken)
	found := false
	var ids []uint64
	for _, m := range members {
		ids = append(ids, m.ID)
		found = found || m.ID == id.MemberID
	}
	if !found {
		return fmt.Errorf("server: --initial-advertise-peer-urls %v do not match this member's (%s) URLs in --initial-cluster", id.PeerURLs, cfg.Name)
	}
	id.ClusterID = clusterID(ids)
	id.Clustered = cfg.AllowJoin && len(members) == 1
	b := s.db.NewBatch()
	if err := saveIdentity(b, id); err != nil {
		return err
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return err
	}
	s.id = id
	s.log.Info("created a new store", "data-dir", cfg.DataDir, "members", len(members), "replicas", id.Replicas, "placement", id.Placement, "split-points", id.SplitPoints)
	return nil
}

// peerHostPort returns the host:port of a peer URL.
func peerHostPort(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	return u.Host, nil
}

func (s *Server) startMembership() error {
	self, err := peerHostPort(s.id.PeerURLs[0])
	if err != nil {
		return err
	}
	gossip := s.cfg.GossipAddr
	if gossip == "" {
		listen, err := listenAddr(s.cfg.ListenPeerURLs[0])
		if err != nil {
			return err
		}
		if gossip, err = cluster.GossipAddr(listen); err != nil {
			return err
		}
	}
	host, port, err := net.SplitHostPort(gossip)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	advertise, _, err := net.SplitHostPort(self)
	if err != nil {
		return err
	}
	var static []cluster.NodeInfo
	var seeds []string
	// The members as far as the identity knows; the meta group's records
	// replace them once it is open (syncGossipMembers).
	for _, m := range append(slices.Clone(s.id.Members), s.joinedMembers...) {
		addr, err := peerHostPort(m.PeerURLs[0])
		if err != nil {
			return err
		}
		static = append(static, cluster.NodeInfo{ID: m.ID, Name: m.Name, PeerAddr: addr})
		if m.ID != s.id.MemberID {
			g, err := cluster.GossipAddr(addr)
			if err != nil {
				return err
			}
			seeds = append(seeds, g)
		}
	}
	advertise = gossipAdvertiseAddr(advertise)
	key, err := s.cfg.gossipKey()
	if err != nil {
		return err
	}
	gossipTLS, err := s.cfg.gossipTLS()
	if err != nil {
		return err
	}
	s.membership, err = cluster.Start(cluster.Config{
		SecretKey:     key,
		TLS:           gossipTLS,
		Label:         "brain-cluster-" + formatID(s.id.ClusterID),
		Self:          cluster.NodeInfo{ID: s.id.MemberID, Name: s.id.Name, PeerAddr: self, ClientURLs: s.cfg.AdvertiseClientURLs},
		BindAddr:      host,
		BindPort:      p,
		AdvertiseAddr: advertise,
		Seeds:         seeds,
		Static:        static,
		Fast:          s.cfg.FastGossip,
		Logger:        s.log,
	})
	return err
}

// gossipAdvertiseAddr returns the IP to advertise for gossip given the
// host of this node's advertised peer URL: that IP, the address a host
// name resolves to (in containers, the name other nodes reach this one
// by), or "" to let memberlist pick a private address (a wildcard, or a
// name that does not resolve yet).
func gossipAdvertiseAddr(host string) string {
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsUnspecified() {
			return ""
		}
		return host
	}
	addrs, err := net.LookupIP(host)
	if err != nil {
		return ""
	}
	for _, ip := range addrs {
		if ip4 := ip.To4(); ip4 != nil && !ip4.IsUnspecified() {
			return ip4.String()
		}
	}
	return ""
}

// gossipMembers are every member the cluster has had (the initial ones
// and those the meta group records, removed ones too: their replicas are
// reached until they are replaced) as gossip's member list: the only nodes
// gossip counts, at their configured peer addresses.
func (s *Server) gossipMembers() []cluster.NodeInfo {
	byID := map[uint64]member{}
	for _, m := range append(slices.Clone(s.id.Members), s.joinedMembers...) {
		byID[m.ID] = m
	}
	for _, m := range s.meta.Members() {
		if _, ok := byID[m.ID]; !ok || len(m.PeerURLs) > 0 {
			byID[m.ID] = member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs}
		}
	}
	ids := slices.Sorted(maps.Keys(byID))
	var out []cluster.NodeInfo
	for _, id := range ids {
		m := byID[id]
		if len(m.PeerURLs) == 0 {
			continue
		}
		addr, err := peerHostPort(m.PeerURLs[0])
		if err != nil {
			continue
		}
		out = append(out, cluster.NodeInfo{ID: m.ID, Name: m.Name, PeerAddr: addr})
	}
	return out
}

// syncGossipMembers keeps gossip's member list the raft membership's.
func (s *Server) syncGossipMembers() {
	last := ""
	s.every(500*time.Millisecond, nil, func() {
		ms := s.gossipMembers()
		if k := fmt.Sprint(ms); k != last {
			s.membership.SetMembers(ms)
			last = k
		}
	})
}
