package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/brainkv/brain/auth"
	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/partition"
	"github.com/cockroachdb/pebble/v2"
	etcdauth "go.etcd.io/etcd/server/v3/auth"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The operator API: JSON over the client listener, used by "brainnode
// status" and "brainnode transfer-leader".
//
//	GET  /brain/v1/status                       this node's view (NodeStatus)
//	GET  /brain/v1/lsm                          the storage engine's levels (text)
//	POST /brain/v1/transfer-leader?group=G&to=ID hand this node's leadership of G to member ID
//	POST /brain/v1/move-replica?group=G&from=A&to=B move partition G's replica from member A to B (on G's leader)
//	POST /brain/v1/split?key=K                   split the partition holding key K at K (on any node)

// NodeStatus is one node's view of the cluster.
type NodeStatus struct {
	Name            string         `json:"name"`
	ID              string         `json:"id"`
	ClusterID       string         `json:"cluster_id"`
	ClientURLs      []string       `json:"client_urls"`
	Revision        int64          `json:"revision"`
	CompactRevision int64          `json:"compact_revision"`
	DiskBytes       uint64         `json:"disk_bytes"`
	Alarms          []string       `json:"alarms,omitempty"`
	Members         []MemberStatus `json:"members"`
	Groups          []GroupStatus  `json:"groups"`
	// StaleClosed lists this node's partition replicas whose closed
	// revision is older than --max-serializable-staleness: a serializable
	// read of them here waits for a close first.
	StaleClosed []uint64 `json:"stale_closed,omitempty"`
}

// MemberStatus is a member as a node sees it.
type MemberStatus struct {
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peer_urls"`
	ClientURLs []string `json:"client_urls,omitempty"`
	Alive      bool     `json:"alive"`
}

// GroupStatus is a node's replica of a raft group.
type GroupStatus struct {
	Group    uint64   `json:"group"`
	Kind     string   `json:"kind"` // tso, meta or partition
	Start    string   `json:"start,omitempty"`
	End      string   `json:"end,omitempty"` // empty: to the end of the keyspace
	Role     string   `json:"role"`          // leader, follower, learner
	Term     uint64   `json:"term"`
	Leader   string   `json:"leader"`
	Voters   []string `json:"voters"`
	Learners []string `json:"learners,omitempty"`
	Applied  uint64   `json:"applied"`
	// Closed and ClosedLag: a partition's closed revision, and how far it
	// trails the node's revision.
	Closed    int64 `json:"closed,omitempty"`
	ClosedLag int64 `json:"closed_lag,omitempty"`
	// ApproxBytes estimates the partition's MVCC data in flushed sstables
	// (recent writes still in the memtable and WAL are not counted).
	ApproxBytes uint64 `json:"approx_bytes,omitempty"`
}

func (s *Server) registerAdmin(mux *http.ServeMux) {
	mux.HandleFunc("GET /brain/v1/status", s.rootOnly(s.handleStatus))
	mux.HandleFunc("GET /brain/v1/lsm", s.rootOnly(lsmHandler(s.db)))
	mux.HandleFunc("POST /brain/v1/transfer-leader", s.rootOnly(s.handleTransferLeader))
	mux.HandleFunc("POST /brain/v1/move-replica", s.rootOnly(s.handleMoveReplica))
	mux.HandleFunc("POST /brain/v1/split", s.rootOnly(s.handleSplit))
}

// rootOnly serves h, with auth on, only to a user with the root role: the
// one of the token in the Authorization header (as etcd's HTTP gateway
// takes it), or with --client-cert-auth, of the client certificate's
// common name. It answers 401 with etcd's message when the request names
// no valid user, and 403 when the user is not root.
func (s *Server) rootOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.auth == nil {
			h(w, r)
			return
		}
		if err := s.auth.Fresh(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if !s.auth.Enabled() {
			h(w, r)
			return
		}
		ai, err := s.httpAuthInfo(r)
		if err == nil {
			err = s.auth.Etcd().IsAdminPermitted(ai)
		}
		if err != nil {
			code := http.StatusForbidden
			if errors.Is(err, etcdauth.ErrUserEmpty) || errors.Is(err, etcdauth.ErrInvalidAuthToken) || errors.Is(err, etcdauth.ErrUserNotFound) {
				code = http.StatusUnauthorized
			}
			msg := err.Error()
			if g, ok := auth.ToGRPC(err); ok {
				msg = status.Convert(g).Message()
			}
			http.Error(w, msg, code)
			return
		}
		h(w, r)
	}
}

// httpAuthInfo is the user an admin request names (nil: none).
func (s *Server) httpAuthInfo(r *http.Request) (*etcdauth.AuthInfo, error) {
	if tok := r.Header.Get("Authorization"); tok != "" {
		return s.auth.AuthInfo(metadata.NewIncomingContext(r.Context(), metadata.Pairs("token", tok)))
	}
	if s.cfg.ClientCertAuth && r.TLS != nil {
		for _, chain := range r.TLS.VerifiedChains {
			if len(chain) > 0 {
				return &etcdauth.AuthInfo{Username: chain[0].Subject.CommonName, Revision: s.auth.Revision()}, nil
			}
		}
	}
	return nil, nil
}

// Status returns this node's view of the cluster.
func (s *Server) Status(ctx context.Context) NodeStatus {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	rev, err := s.store.FreshRevision(ctx)
	if err != nil {
		rev = s.oracle.Current()
	}
	st := NodeStatus{
		Name: s.id.Name, ID: formatID(s.id.MemberID), ClusterID: formatID(s.id.ClusterID),
		ClientURLs: s.cfg.AdvertiseClientURLs, Revision: rev, CompactRevision: s.store.CompactRevision(),
		DiskBytes: s.db.Metrics().DiskSpaceUsage(),
	}
	for _, a := range s.meta.Alarms() {
		st.Alarms = append(st.Alarms, fmt.Sprintf("%s on %s", a.Alarm, formatID(a.MemberID)))
	}
	st.StaleClosed = s.staleClosed()
	for _, m := range s.members() {
		st.Members = append(st.Members, MemberStatus{ID: formatID(m.ID), Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Alive: s.alive(m.ID)})
	}
	ids := func(ns []uint64) []string {
		var out []string
		for _, n := range ns {
			out = append(out, formatID(n))
		}
		return out
	}
	spans := map[uint64]kvapi.Route{}
	for _, rt := range s.store.Routes() {
		spans[rt.ID] = rt
	}
	for _, g := range s.groupIDs() {
		rs, ok := s.groupStatus(g)
		if !ok {
			continue
		}
		gs := GroupStatus{Group: g, Term: rs.Term, Leader: formatID(rs.Lead), Voters: ids(rs.Voters), Learners: ids(rs.Learners), Applied: rs.Applied}
		switch {
		case rs.IsLeader:
			gs.Role = "leader"
		case slices.Contains(rs.Learners, s.id.MemberID):
			gs.Role = "learner"
		default:
			gs.Role = "follower"
		}
		switch g {
		case kvapi.TSOGroup:
			gs.Kind = "tso"
		case kvapi.MetaGroup:
			gs.Kind = "meta"
		default:
			gs.Kind = "partition"
			s.partsMu.Lock()
			p := s.parts[g]
			s.partsMu.Unlock()
			if rt, ok := spans[g]; ok {
				gs.Start, gs.End = string(rt.Start), string(rt.End)
			} else if p != nil {
				start, end := p.Span()
				gs.Start, gs.End = string(start), string(end)
			}
			if p != nil {
				gs.Closed = p.Closed()
				gs.ClosedLag = max(rev-gs.Closed, 0)
				gs.ApproxBytes = partitionBytes(s, p)
			}
		}
		st.Groups = append(st.Groups, gs)
	}
	return st
}

func partitionBytes(s *Server, p *partition.Partition) uint64 {
	lo, hi := p.MVCCBounds()
	n, err := s.db.EstimateDiskUsage(lo, hi)
	if err != nil {
		return 0
	}
	return n
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.Status(r.Context()))
}

// lsmHandler prints the node's storage engine state as Pebble formats it:
// per level the files, sizes, score and bytes in, flushed, compacted and
// read, then the compaction, cache and WAL counters. It is what to look at
// when brain_pebble_compacted_bytes_total grows faster than expected. db is
// the one the server opened (registration follows it), so the handler does
// not read s.db, which Close clears.
func lsmHandler(db *pebble.DB) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if db == nil {
			http.Error(w, "the store is not open", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, db.Metrics().String())
	}
}

func (s *Server) handleTransferLeader(w http.ResponseWriter, r *http.Request) {
	group, err1 := strconv.ParseUint(r.URL.Query().Get("group"), 10, 64)
	to, err2 := strconv.ParseUint(r.URL.Query().Get("to"), 16, 64)
	if err1 != nil || err2 != nil {
		http.Error(w, "want group=<number>&to=<member ID in hex>", http.StatusBadRequest)
		return
	}
	rs, ok := s.groupStatus(group)
	switch {
	case !ok:
		http.Error(w, fmt.Sprintf("group %d has no replica on this node", group), http.StatusNotFound)
		return
	case !rs.IsLeader:
		http.Error(w, fmt.Sprintf("this node does not lead group %d (leader: %s)", group, formatID(rs.Lead)), http.StatusConflict)
		return
	case to == s.id.MemberID:
		fmt.Fprintf(w, "this node already leads group %d\n", group)
		return
	case !slices.Contains(rs.Voters, to):
		http.Error(w, fmt.Sprintf("%s is not a voter of group %d (voters: %v)", formatID(to), group, rs.Voters), http.StatusBadRequest)
		return
	}
	// A transfer can fail for passing reasons (the target still catching
	// up after a restart, a busy target missing raft's timeout); an
	// operator's request tries a few times before it reports the last.
	var err error
	for attempt := 0; attempt < 3 && r.Context().Err() == nil; attempt++ {
		g := s.host.Group(group)
		if g == nil {
			break
		}
		if err = s.transferLeadership(g, to, "operator"); err == nil {
			break
		}
	}
	if now, _ := s.groupStatus(group); now.IsLeader {
		if err == nil {
			err = errTransferNotDone
		}
		http.Error(w, fmt.Sprintf("group %d to %s: %v (see the node's log)", group, formatID(to), err), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintf(w, "group %d: leadership handed to %s\n", group, formatID(to))
}

func (s *Server) handleMoveReplica(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	group, err1 := strconv.ParseUint(q.Get("group"), 10, 64)
	from, err2 := strconv.ParseUint(q.Get("from"), 16, 64)
	to, err3 := strconv.ParseUint(q.Get("to"), 16, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		http.Error(w, "want group=<number>&from=<member ID in hex>&to=<member ID in hex>", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
	defer cancel()
	err := s.MoveReplica(ctx, group, from, to)
	var nl errNotGroupLeader
	switch {
	case err == nil:
		fmt.Fprintf(w, "group %d: replica moved from %s to %s\n", group, formatID(from), formatID(to))
	case errors.Is(err, ErrMoveLeaderHandedOff):
		http.Error(w, err.Error(), http.StatusAccepted)
	case errors.As(err, &nl):
		http.Error(w, err.Error(), http.StatusConflict)
	default:
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
	}
}

func (s *Server) handleSplit(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if key == "" {
		http.Error(w, "want key=<split key> (not empty)", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	parent, child, err := s.Split(ctx, []byte(key))
	switch {
	case err == nil:
		fmt.Fprintf(w, "partition %d split at %q: keys from %q on are partition %d\n", parent, key, key, child)
	case kvapi.IsSplitRefusal(err):
		http.Error(w, fmt.Sprintf("%q already starts a partition", key), http.StatusBadRequest)
	default:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	}
}

// staleClosed lists this node's partition replicas whose closed revision
// is older than the serializable staleness bound: below the oldest
// revision the TSO confirmed to this node within it. Without a
// confirmation that recent (the node is idle) it knows of none.
func (s *Server) staleClosed() []uint64 {
	bound := s.cfg.MaxSerializableStaleness
	if bound == 0 {
		bound = kvapi.DefaultMaxStaleness
	}
	if bound < 0 {
		return nil
	}
	rev, ok := s.tso.ConfirmedSince(time.Now().Add(-bound))
	if !ok {
		return nil
	}
	var out []uint64
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	for id, p := range s.parts {
		if p.Initialized() && p.Closed() < rev {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}
