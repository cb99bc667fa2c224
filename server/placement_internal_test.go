package server

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"

	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/meta"
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

// splitWithRanks allocates a new partition's ID as kvapi's allocChild
// does (IDs in sequence from *next until one has the best rank, at most
// 16) and returns it.
func splitWithRanks(next *uint64, rank func(uint64) int, best int) uint64 {
	var chosen uint64
	chosenRank := 0
	for i := 0; i < 16; i++ {
		id := *next
		*next++
		if r := rank(id); chosen == 0 || r < chosenRank {
			chosen, chosenRank = id, r
		}
		if chosenRank <= best {
			break
		}
	}
	return chosen
}

// TestChildRanksSpreadSplits splits a hot range over and over (random
// parents among its partitions) and requires the halves spread evenly after every split: the partitions of
// the hot range preferring each node differ by at most one, and with
// copysets the copysets' shares of them by at most one. With IDs in
// sequence the copysets' shares drift apart (7 to 5 after 11 splits in
// the benchmark).
func TestChildRanksSpreadSplits(t *testing.T) {
	const rf = 3
	for _, n := range []int{3, 4, 5, 6, 7, 9} {
		for _, scheme := range []string{PlacementCopysets, PlacementRing} {
			t.Run(fmt.Sprintf("%s/%d", scheme, n), func(t *testing.T) {
				members := make([]member, n)
				for i := range members {
					members[i] = member{ID: uint64(10 + i)}
				}
				rng := rand.New(rand.NewSource(int64(n)))
				hot := []uint64{kvapi.FirstPartition + 7}
				next := uint64(meta.FirstAllocatedPartition)
				for split := 1; split <= 4*n; split++ {
					parent := hot[rng.Intn(len(hot))]
					rank, best := childRanks(members, rf, scheme, hot, parent, 0, nil, nil)
					child := splitWithRanks(&next, rank, best)
					if rank(child) != best {
						t.Fatalf("split %d: child %d has rank %d, best %d", split, child, rank(child), best)
					}
					hot = append(hot, child)
					leads := make([]int, n)
					sets := map[int]int{}
					for _, id := range hot {
						lead := groupOrdinal(id) % n
						leads[lead]++
						sets[placeVoters(groupOrdinal(id), n, rf, scheme)[0]/rf]++
					}
					if slices.Max(leads)-slices.Min(leads) > 1 {
						t.Fatalf("split %d: hot partitions preferring each node %v", split, leads)
					}
					if scheme == PlacementCopysets && n >= 2*rf {
						var shares []int
						for c := 0; c < n/rf; c++ {
							shares = append(shares, sets[c])
						}
						if slices.Max(shares)-slices.Min(shares) > 1 {
							t.Fatalf("split %d: hot partitions per copyset %v (preferring each node %v)", split, shares, leads)
						}
					}
				}
			})
		}
	}
}

// TestChildRanksPreferAndLiveness checks the criteria above the counts: a
// split for balance's node wins over every count, and a down node loses to
// every live one.
func TestChildRanksPreferAndLiveness(t *testing.T) {
	members := []member{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}, {ID: 5}, {ID: 6}}
	parts := []uint64{100, 101, 102, 103, 104, 105, 65536, 65537}
	for _, prefer := range []uint64{1, 4, 6} {
		rank, best := childRanks(members, 3, PlacementCopysets, parts, 100, prefer, nil, nil)
		for id := uint64(70000); id < 70006; id++ {
			lead := members[groupOrdinal(id)%6].ID
			if (rank(id) == best) != (lead == prefer) {
				t.Fatalf("prefer %d: ID %d (preferring %d) has rank %d, best %d", prefer, id, lead, rank(id), best)
			}
		}
	}
	down := func(id uint64) bool { return id != 2 && id != 5 }
	rank, best := childRanks(members, 3, PlacementCopysets, parts, 100, 0, nil, down)
	worstLive := 0
	for id := uint64(70000); id < 70006; id++ {
		if lead := members[groupOrdinal(id)%6].ID; down(lead) {
			worstLive = max(worstLive, rank(id))
		}
	}
	for id := uint64(70000); id < 70006; id++ {
		if lead := members[groupOrdinal(id)%6].ID; !down(lead) && rank(id) <= worstLive {
			t.Fatalf("ID %d preferring down node %d ranks %d, a live one %d (best %d)", id, lead, rank(id), worstLive, best)
		}
	}
}

// TestChildRanksKeepParentVoters: a split that keeps its parent's voters
// (a large partition's split by load: localSplitKeys) ranks best only IDs
// placed on those voters, and among them the one preferring the voter
// fewest split partitions prefer; a down node still loses to every live
// one, and without keep the best IDs are those of the counts alone.
func TestChildRanksKeepParentVoters(t *testing.T) {
	members := []member{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}, {ID: 5}, {ID: 6}}
	// Partition 100 (ordinal 2: node 3) is placed on the first copyset,
	// nodes 1-3, and partition 65540 (ordinal 65442: node 1) too; node 2
	// and the second copyset's nodes prefer no split partition.
	parts := []uint64{100, 65540}
	placed := func(id uint64) []uint64 {
		var ids []uint64
		for _, v := range placeVoters(groupOrdinal(id), 6, 3, PlacementCopysets) {
			ids = append(ids, members[v].ID)
		}
		return ids
	}
	if got := placed(100); !slices.Equal(got, []uint64{3, 1, 2}) {
		t.Fatalf("partition 100 placed on %v, want [3 1 2]", got)
	}
	keep := []uint64{1, 2, 3}
	bestIDs := func(keep []uint64, alive func(uint64) bool) []uint64 {
		rank, best := childRanks(members, 3, PlacementCopysets, parts, 100, 0, keep, alive)
		var ids []uint64
		for id := uint64(70000); id < 70006; id++ {
			if rank(id) == best {
				if keep != nil && alive == nil && !isSubset(placed(id), keep) {
					t.Errorf("best ID %d is placed on %v, outside %v", id, placed(id), keep)
				}
				ids = append(ids, members[groupOrdinal(id)%6].ID)
			}
		}
		return ids
	}
	// Without keep, the counts send the half to the second copyset.
	for _, lead := range bestIDs(nil, nil) {
		if lead < 4 {
			t.Fatalf("without keep the best IDs prefer %v, want nodes of the second copyset", bestIDs(nil, nil))
		}
	}
	// With keep, the half stays on nodes 1-3, preferring the one no split
	// partition prefers yet: node 2.
	got := bestIDs(keep, nil)
	if len(got) == 0 {
		t.Fatal("no best ID with keep")
	}
	for _, lead := range got {
		if lead != 2 {
			t.Fatalf("with keep %v the best IDs prefer %v, want node 2", keep, got)
		}
	}
	// Liveness still comes first: with nodes 1-3 down, the half goes to a
	// live node of the other copyset.
	alive := func(id uint64) bool { return id > 3 }
	for _, lead := range bestIDs(keep, alive) {
		if lead <= 3 {
			t.Fatalf("with nodes 1-3 down the best IDs prefer %v", bestIDs(keep, alive))
		}
	}
}

func isSubset(a, b []uint64) bool {
	return !slices.ContainsFunc(a, func(x uint64) bool { return !slices.Contains(b, x) })
}
