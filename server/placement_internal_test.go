package server

import (
	"fmt"
	"slices"
	"testing"

	"github.com/brainkv/brain/kvapi"
)

// TestPlacementSchemes checks both schemes over 1 to 12 members: every
// group gets min(rf, n) distinct voters led by member ord mod n; every
// node leads and holds the same number of groups over a whole rotation;
// copysets gives each node rf-1 peers when n is a multiple of rf (at most
// the size of its copyset minus one otherwise), and is the ring below 2rf
// members.
func TestPlacementSchemes(t *testing.T) {
	const rf = 3
	for n := 1; n <= 12; n++ {
		for _, scheme := range []string{PlacementRing, PlacementCopysets} {
			t.Run(fmt.Sprintf("%s/%d", scheme, n), func(t *testing.T) {
				leads := make([]int, n)
				holds := make([]int, n)
				peers := make([]map[int]bool, n)
				for i := range peers {
					peers[i] = map[int]bool{}
				}
				for ord := 0; ord < 2*n*rf; ord++ {
					vs := placeVoters(ord, n, rf, scheme)
					if len(vs) != min(rf, n) || vs[0] != ord%n {
						t.Fatalf("ordinal %d: voters %v, want %d led by %d", ord, vs, min(rf, n), ord%n)
					}
					sorted := slices.Clone(vs)
					slices.Sort(sorted)
					if len(slices.Compact(sorted)) != len(vs) {
						t.Fatalf("ordinal %d: voters %v repeat a node", ord, vs)
					}
					if scheme == PlacementCopysets && n < 2*rf && !slices.Equal(vs, placeVoters(ord, n, rf, PlacementRing)) {
						t.Fatalf("ordinal %d: %d members, copysets %v differ from the ring %v", ord, n, vs, placeVoters(ord, n, rf, PlacementRing))
					}
					leads[vs[0]]++
					for _, v := range vs {
						holds[v]++
						for _, w := range vs {
							if v != w {
								peers[v][w] = true
							}
						}
					}
				}
				for i := 1; i < n; i++ {
					if leads[i] != leads[0] || holds[i] != holds[0] {
						t.Fatalf("node %d leads %d and holds %d groups, node 0 leads %d and holds %d", i, leads[i], holds[i], leads[0], holds[0])
					}
				}
				maxPeers := 2 * (rf - 1)
				if scheme == PlacementCopysets && n >= 2*rf {
					maxPeers = rf - 1 + n%rf
				}
				maxPeers = min(maxPeers, n-1)
				for i := range peers {
					if len(peers[i]) > maxPeers || (n%rf == 0 && scheme == PlacementCopysets && len(peers[i]) != rf-1) {
						t.Fatalf("node %d shares groups with %d nodes %v, want at most %d", i, len(peers[i]), peers[i], maxPeers)
					}
				}
			})
		}
	}
}

// TestCopysetPlacementOfSixNodes pins the layout the scaling benchmark
// runs on: two copysets of three, each group on one of them.
func TestCopysetPlacementOfSixNodes(t *testing.T) {
	members := []member{{ID: 10}, {ID: 20}, {ID: 30}, {ID: 40}, {ID: 50}, {ID: 60}}
	want := [][]uint64{
		{30, 10, 20}, {40, 50, 60}, {50, 60, 40}, {60, 40, 50}, {10, 20, 30}, {20, 30, 10},
	}
	for i, w := range want {
		id := uint64(kvapi.FirstPartition + i)
		if got := initialConf(id, members, 3, PlacementCopysets).Voters; !slices.Equal(got, w) {
			t.Errorf("partition %d: voters %v, want %v", id, got, w)
		}
	}
	// A store created before placement schemes keeps the ring: upgrading
	// moves no replica.
	old := &identity{Replicas: 3}
	s := &Server{id: old}
	if got := s.placementVoters(kvapi.FirstPartition, members); !slices.Equal(got, []uint64{30, 40, 50}) {
		t.Errorf("store without a scheme: voters %v, want the ring's [30 40 50]", got)
	}
}
