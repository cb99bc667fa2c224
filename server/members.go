package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/meta"
	"github.com/cockroachdb/pebble/v2"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Cluster membership.
//
// The initial members (--initial-cluster of a new cluster) are in every
// node's identity; members added later (etcd's MemberAdd, or a node
// started with --join) are records in the meta group. A joining node asks
// a member for the cluster's description (clusterInfo) and starts with no
// replicas: the leaders of the TSO and meta groups add it as a learner,
// and it serves every request through the partitions' leaders and feeds.

// clusterMembers returns the current members, sorted by ID.
func (s *Server) clusterMembers() []member {
	byID := map[uint64]member{}
	for _, m := range s.id.Members {
		byID[m.ID] = m
	}
	for _, m := range s.joinedMembers {
		byID[m.ID] = m
	}
	for _, m := range s.meta.Members() {
		if m.Removed {
			delete(byID, m.ID)
		} else {
			byID[m.ID] = member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs}
		}
	}
	out := make([]member, 0, len(byID))
	for _, m := range byID {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// memberIDs returns the current members' IDs, sorted.
func (s *Server) memberIDs() []uint64 {
	var ids []uint64
	for _, m := range s.clusterMembers() {
		ids = append(ids, m.ID)
	}
	return ids
}

// members lists the members for etcd's MemberList, with the client URLs
// gossip knows.
func (s *Server) members() []*pb.Member {
	client := map[uint64][]string{}
	if s.membership != nil {
		for _, n := range s.membership.Nodes() {
			client[n.Info.ID] = n.Info.ClientURLs
		}
	}
	client[s.id.MemberID] = s.cfg.AdvertiseClientURLs
	var out []*pb.Member
	for _, m := range s.clusterMembers() {
		out = append(out, &pb.Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: client[m.ID]})
	}
	return out
}

// etcd's errors for MemberAdd.
var (
	errPeerURLExist = status.Error(codes.FailedPrecondition, "etcdserver: Peer URLs already exists")
	errNoPeerURLs   = status.Error(codes.InvalidArgument, "etcdserver: member not found") // etcd rejects empty peer URLs while parsing
	errLearnerAdd   = status.Error(codes.Unimplemented, "brain: learner members are not supported; add a voting member (brain decides which replicas each node holds)")
	// errStandalone: a single node started without --allow-join opens no
	// peer port, so a member added to it could never reach it.
	errStandalone = status.Error(codes.FailedPrecondition, "brain: this node is a single-node store and takes no members; restart it with --allow-join (its data stays) so that it serves its peer URL, then add or --join members")
)

// memberAdd implements etcd's MemberAdd: the member is recorded in the meta
// group; its node then joins with --initial-cluster-state=existing (or
// --join), and the TSO and meta leaders give it learners.
func (s *Server) memberAdd(ctx context.Context, r *pb.MemberAddRequest) (*pb.Member, []*pb.Member, error) {
	if r.IsLearner {
		return nil, nil, errLearnerAdd
	}
	if !s.clustered() {
		return nil, nil, errStandalone
	}
	if len(r.PeerURLs) == 0 {
		return nil, nil, errNoPeerURLs
	}
	for _, u := range r.PeerURLs {
		if _, err := listenAddr(u); err != nil {
			return nil, nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	for _, m := range s.clusterMembers() {
		for _, u := range m.PeerURLs {
			if slices.Contains(r.PeerURLs, u) {
				return nil, nil, errPeerURLExist
			}
		}
	}
	// The ID is derived from the peer URLs and the cluster, so a retried
	// MemberAdd names the same member.
	id := memberID(r.PeerURLs, formatID(s.id.ClusterID))
	if err := s.store.SetMember(ctx, meta.Member{ID: id, PeerURLs: r.PeerURLs}); err != nil {
		return nil, nil, err
	}
	s.log.Info("member added", "member-id", formatID(id), "peer-urls", r.PeerURLs)
	// The record is applied on the meta leader; this node's replica may
	// trail it.
	if err := s.meta.Refresh(ctx); err != nil && !errors.Is(err, meta.ErrNoReplica) {
		s.log.Warn("member list may trail the added member", "err", err)
	}
	return &pb.Member{ID: id, PeerURLs: r.PeerURLs}, s.members(), nil
}

var (
	errMemberNotFound = status.Error(codes.NotFound, "etcdserver: member not found")
	errLastMember     = status.Error(codes.FailedPrecondition, "etcdserver: re-configuration failed due to not enough started members")
)

// memberRemove implements etcd's MemberRemove: the member is marked
// removed in the meta group; the leaders of its groups then replace its
// replicas (when other nodes can take them) and drop it, and the removed
// node stops itself once it learns of its removal.
func (s *Server) memberRemove(ctx context.Context, id uint64) ([]*pb.Member, error) {
	var found *member
	members := s.clusterMembers()
	for i := range members {
		if members[i].ID == id {
			found = &members[i]
		}
	}
	if found == nil {
		return nil, errMemberNotFound
	}
	if len(members) == 1 {
		return nil, errLastMember
	}
	if err := s.store.SetMember(ctx, meta.Member{ID: id, Name: found.Name, PeerURLs: found.PeerURLs, Removed: true}); err != nil {
		return nil, err
	}
	s.log.Info("member removed", "member-id", formatID(id), "name", found.Name)
	if err := s.meta.Refresh(ctx); err != nil && !errors.Is(err, meta.ErrNoReplica) {
		s.log.Warn("member list may trail the removal", "err", err)
	}
	return s.members(), nil
}

// removedSelf reports whether the meta group records this node's removal.
func (s *Server) removedSelf() bool {
	for _, m := range s.meta.Members() {
		if m.ID == s.id.MemberID && m.Removed {
			return true
		}
	}
	return false
}

// clusterInfo is what a joining node learns from a member.
type clusterInfo struct {
	ClusterID   uint64   `json:"cluster_id"`
	SplitPoints []string `json:"split_points"`
	Replicas    int      `json:"replicas"`
	Placement   string   `json:"placement,omitempty"`
	Initial     []member `json:"initial"`
	Members     []member `json:"members"`
	// Revision is the cluster's revision when asked.
	Revision int64 `json:"revision"`
}

// clusterInfo answers kvapi.OpClusterInfo.
func (s *Server) clusterInfo() ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rev, err := s.tso.Fresh(ctx)
	if err != nil {
		return nil, err
	}
	// Members added through another node are applied here first.
	if err := s.meta.Refresh(ctx); err != nil {
		return nil, err
	}
	return json.Marshal(clusterInfo{
		ClusterID: s.id.ClusterID, SplitPoints: s.id.SplitPoints, Replicas: s.id.Replicas,
		Placement: s.id.Placement, Initial: s.id.Members, Members: s.clusterMembers(), Revision: rev,
	})
}

// joinIdentity creates the identity of a node joining a running cluster:
// with --join it first asks that member to add it; then it fetches the
// cluster's description from a member and finds itself in it by peer URL.
//
// A join that added this node and then failed removes it again, so a
// failed join leaves no member that never started.
func (s *Server) joinIdentity() (id *identity, err error) {
	cfg := s.cfg
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var peers []string
	if cfg.Join != "" {
		creds := insecure.NewCredentials()
		if strings.HasPrefix(cfg.Join, "https://") {
			tc, err := cfg.joinTLSConfig()
			if err != nil {
				return nil, err
			}
			creds = credentials.NewTLS(tc)
		}
		ms, added, err := addSelf(ctx, cfg.Join, creds, cfg.InitialAdvertisePeerURLs)
		if err != nil {
			return nil, fmt.Errorf("server: --join %s: %w", cfg.Join, err)
		}
		if added != 0 {
			defer func() {
				if err == nil {
					return
				}
				if rerr := removeAdded(cfg.Join, creds, added); rerr != nil {
					err = fmt.Errorf("%w (and removing the member this join added, %s, failed: %v; remove it with etcdctl member remove %s)", err, formatID(added), rerr, formatID(added))
					return
				}
				s.log.Info("join failed; removed the member it added", "member-id", formatID(added))
			}()
		}
		for _, m := range ms {
			peers = append(peers, m.PeerURLs...)
		}
	} else {
		members, err := parseInitialCluster(cfg.InitialCluster)
		if err != nil {
			return nil, err
		}
		for name, urls := range members {
			if name != cfg.Name {
				peers = append(peers, urls...)
			}
		}
	}
	dialOpts, err := cfg.peerDialOptions()
	if err != nil {
		return nil, err
	}
	var info clusterInfo
	var lastErr error = errors.New("no other member's peer URL")
	for _, u := range peers {
		if slices.Contains(cfg.InitialAdvertisePeerURLs, u) {
			continue
		}
		addr, err := listenAddr(u)
		if err != nil {
			continue
		}
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		b, err := kvapi.CallAddr(cctx, addr, &kvapi.CallRequest{Op: kvapi.OpClusterInfo}, dialOpts...)
		ccancel()
		if err == nil {
			err = json.Unmarshal(b, &info)
		}
		if err == nil {
			lastErr = nil
			break
		}
		lastErr = fmt.Errorf("%s: %w", u, err)
	}
	if lastErr != nil {
		return nil, fmt.Errorf("server: cannot learn the cluster from its members: %w", lastErr)
	}
	id = &identity{
		Name: cfg.Name, PeerURLs: cfg.InitialAdvertisePeerURLs, ClusterID: info.ClusterID,
		SplitPoints: info.SplitPoints, Members: info.Initial, Replicas: info.Replicas,
		Placement: info.Placement, Bootstrapped: true, JoinedAt: info.Revision,
	}
	for _, m := range info.Members {
		for _, u := range m.PeerURLs {
			if slices.Contains(cfg.InitialAdvertisePeerURLs, u) {
				id.MemberID = m.ID
			}
		}
	}
	// Until its meta replica has them, the members the cluster had when
	// this node joined are the ones it knows (gossip gives no addresses).
	s.joinedMembers = info.Members
	if id.MemberID == 0 {
		return nil, fmt.Errorf("server: the cluster has no member with peer URLs %v; add it first (etcdctl member add %s --peer-urls=%s) or start with --join",
			cfg.InitialAdvertisePeerURLs, cfg.Name, strings.Join(cfg.InitialAdvertisePeerURLs, ","))
	}
	return id, nil
}

// addSelf calls MemberAdd on the member at clientURL; a member already
// added (a retried join, or one added with etcdctl member add) is found
// with MemberList. added is the ID of the member this call added (0 if it
// existed).
func addSelf(ctx context.Context, clientURL string, creds credentials.TransportCredentials, peerURLs []string) (ms []*pb.Member, added uint64, err error) {
	addr, err := listenAddr(clientURL)
	if err != nil {
		return nil, 0, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close()
	c := pb.NewClusterClient(conn)
	// A leader change (or a member still starting) answers Unavailable, as
	// etcd's does; etcdctl users retry those, and so does a joining node.
	// An add that did happen before the error makes the retry find the
	// peer URLs taken (FailedPrecondition), answered from the member list.
	// A member that cannot be reached at all (nothing listens there, a
	// wrong address) fails the join within joinDialTimeout.
	start := time.Now()
	resp, err := c.MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: peerURLs})
	for backoff := 100 * time.Millisecond; status.Code(err) == codes.Unavailable; backoff = min(2*backoff, 2*time.Second) {
		if conn.GetState() != connectivity.Ready && time.Since(start) > joinDialTimeout {
			return nil, 0, fmt.Errorf("no member answers at %s within %v: %s", clientURL, joinDialTimeout, status.Convert(err).Message())
		}
		select {
		case <-ctx.Done():
			return nil, 0, err
		case <-time.After(backoff):
		}
		resp, err = c.MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: peerURLs})
	}
	if status.Convert(err).Message() == status.Convert(errPeerURLExist).Message() {
		list, lerr := c.MemberList(ctx, &pb.MemberListRequest{})
		if lerr != nil {
			return nil, 0, lerr
		}
		return list.Members, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	return resp.Members, resp.Member.GetID(), nil
}

// joinDialTimeout bounds the wait for a --join member that cannot be
// reached; a reachable one that answers Unavailable (a leader change) is
// retried up to the join's own deadline.
const joinDialTimeout = 5 * time.Second

// removeAdded undoes addSelf's MemberAdd after a join failed, so the
// cluster keeps no member that never started.
func removeAdded(clientURL string, creds credentials.TransportCredentials, id uint64) error {
	addr, err := listenAddr(clientURL)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pb.NewClusterClient(conn).MemberRemove(ctx, &pb.MemberRemoveRequest{ID: id})
	return err
}

// saveIdentity persists the node's identity.
func (s *Server) saveIdentity() error { return s.persistIdentity(s.id) }

// persistIdentity writes id as the node's identity, synced.
func (s *Server) persistIdentity(id *identity) error {
	b := s.db.NewBatch()
	defer b.Close()
	if err := saveIdentity(b, id); err != nil {
		return err
	}
	return b.Commit(pebble.Sync)
}
