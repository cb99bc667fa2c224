package server

import (
	"crypto/sha1"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/brainkv/brain/engine"
	"github.com/cockroachdb/pebble/v2"
)

// identity is what a node persists about itself and its cluster when its
// store is created.
type identity struct {
	Name        string   `json:"name"`
	MemberID    uint64   `json:"member_id"`
	ClusterID   uint64   `json:"cluster_id"`
	PeerURLs    []string `json:"peer_urls"`
	SplitPoints []string `json:"split_points"`
	// Members are the initial members, sorted by ID (this one included).
	Members []member `json:"members"`
	// Replicas is the replication factor the groups were created with.
	Replicas int `json:"replicas"`
	// Placement is the placement scheme (Config.Placement); empty in a
	// store created before schemes existed, which means ring.
	Placement string `json:"placement,omitempty"`
	// Bootstrapped: the groups the initial placement gave this node exist
	// (or it joined a running cluster and bootstraps none).
	Bootstrapped bool `json:"bootstrapped,omitempty"`
	// JoinedAt is the cluster's revision when this node joined it (0 for
	// an initial member): its watch feeds start after it.
	JoinedAt int64 `json:"joined_at,omitempty"`
	// Clustered: a one-member store started with --allow-join, which
	// serves peers and gossip from then on.
	Clustered bool `json:"clustered,omitempty"`
	// Removed: this member learned it was removed from the cluster; the
	// store never serves again (etcd: "the member has been permanently
	// removed from the cluster").
	Removed bool `json:"removed,omitempty"`
}

// placement returns the cluster's placement scheme.
func (id *identity) placement() string {
	if id.Placement == "" {
		return PlacementRing
	}
	return id.Placement
}

type member struct {
	ID       uint64   `json:"id"`
	Name     string   `json:"name"`
	PeerURLs []string `json:"peer_urls"`
}

// initialMembers computes the members of --initial-cluster, sorted by ID.
func initialMembers(initialCluster, token string) ([]member, error) {
	byName, err := parseInitialCluster(initialCluster)
	if err != nil {
		return nil, err
	}
	var ms []member
	for name, urls := range byName {
		ms = append(ms, member{ID: memberID(urls, token), Name: name, PeerURLs: urls})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
	return ms, nil
}

func identityKey() []byte { return engine.GroupKey(0, "identity") }

func loadIdentity(db *pebble.DB) (*identity, error) {
	v, closer, err := db.Get(identityKey())
	if err == pebble.ErrNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	id := &identity{}
	if err := json.Unmarshal(v, id); err != nil {
		return nil, fmt.Errorf("server: corrupt identity: %w", err)
	}
	return id, nil
}

func saveIdentity(b *pebble.Batch, id *identity) error {
	v, err := json.Marshal(id)
	if err != nil {
		return err
	}
	return b.Set(identityKey(), v, nil)
}

// memberID derives a member ID the way etcd does: the SHA-1 of the sorted
// peer URLs and the cluster token.
func memberID(peerURLs []string, token string) uint64 {
	urls := append([]string(nil), peerURLs...)
	sort.Strings(urls)
	sum := sha1.Sum([]byte(strings.Join(urls, "") + token))
	return binary.BigEndian.Uint64(sum[:8])
}

// clusterID derives the cluster ID from the member IDs, as etcd does.
func clusterID(members []uint64) uint64 {
	ids := append([]uint64(nil), members...)
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	b := make([]byte, 8*len(ids))
	for i, id := range ids {
		binary.BigEndian.PutUint64(b[8*i:], id)
	}
	sum := sha1.Sum(b)
	return binary.BigEndian.Uint64(sum[:8])
}
