package server

import (
	"fmt"
	"testing"
)

// TestIDResidue: an ID with the residue idResidue gives has its ordinal,
// and so its preferred leader and voters, on the position asked for,
// whatever ID the allocation starts from.
func TestIDResidue(t *testing.T) {
	for n := 1; n <= 9; n++ {
		members := make([]member, n)
		for i := range members {
			members[i] = member{ID: uint64(10 + i)}
		}
		for pos := range n {
			mod, rem := idResidue(pos, n)
			if mod != uint64(n) || rem >= mod {
				t.Fatalf("idResidue(%d, %d) = %d, %d", pos, n, mod, rem)
			}
			for base := uint64(1 << 16); base < 1<<16+uint64(n); base++ {
				id := base
				for id%mod != rem {
					id++
				}
				if got := groupOrdinal(id) % n; got != pos {
					t.Fatalf("n=%d pos=%d: ID %d has ordinal position %d", n, pos, id, got)
				}
				if got := preferredLeader(id, members); got != members[pos].ID {
					t.Fatalf("n=%d pos=%d: ID %d preferred leader %d, want %d", n, pos, id, got, members[pos].ID)
				}
			}
		}
	}
}

// TestPlaceChild checks the choices of placeChild one by one.
func TestPlaceChild(t *testing.T) {
	six := []uint64{1, 2, 3, 4, 5, 6}
	for _, c := range []struct {
		name    string
		members []uint64
		loads   map[uint64]float64
		self    uint64
		parent  []uint64
		rate    float64
		want    int
		ok      bool
	}{
		{"one member", []uint64{1}, map[uint64]float64{1: 100}, 1, []uint64{1}, 50, 0, false},
		{"no load known", six, map[uint64]float64{}, 1, []uint64{1, 2, 3}, 50, 0, false},
		// The hot partition's copyset carries everything: the child
		// goes to the other one, led by its least loaded node.
		{"other copyset", six, map[uint64]float64{5: 300}, 5, []uint64{4, 5, 6}, 150, 0, true},
		{"other copyset, its idle node", six, map[uint64]float64{5: 300, 1: 50, 2: 10, 3: 40}, 5, []uint64{4, 5, 6}, 150, 1, true},
		// The parent's copyset is the less loaded one even with the
		// child's share: the child stays there (no replica moves),
		// with its least loaded node as preferred leader.
		{"stays", six, map[uint64]float64{1: 100, 2: 100, 3: 100, 4: 200, 5: 200, 6: 100}, 1, []uint64{1, 2, 3}, 50, 0, true},
		{"stays, another leader", six, map[uint64]float64{1: 100, 2: 10, 3: 100, 4: 200, 5: 200, 6: 100}, 3, []uint64{1, 2, 3}, 50, 1, true},
		// Equal copysets: the parent's voters win, led by an idle node.
		{"tie", six, map[uint64]float64{1: 100, 4: 50}, 1, []uint64{1, 2, 3}, 50, 1, true},
		{"tie, other side", six, map[uint64]float64{1: 50, 4: 100}, 4, []uint64{4, 5, 6}, 50, 4, true},
		// Three nodes: one voter set; the least loaded node leads.
		{"three", []uint64{1, 2, 3}, map[uint64]float64{1: 300, 2: 100, 3: 200}, 1, []uint64{1, 2, 3}, 150, 1, true},
	} {
		pos, ok := placeChild(c.members, c.loads, c.self, c.parent, c.rate, 3, PlacementCopysets)
		if ok != c.ok || (ok && pos != c.want) {
			t.Errorf("%s: placeChild = %d, %v; want %d, %v", c.name, pos, ok, c.want, c.ok)
		}
	}
}

// TestPlaceChildSpreadsAHotRange splits one hot range level by level, as
// load splits do (every partition in halves, the child placed by
// placeChild, leaders on their preferred nodes), and checks the halves
// spread: the replicas' load (what each node applies) and the leaders'
// load (what each node evaluates and replicates) are as even as the
// number of partitions allows.
func TestPlaceChildSpreadsAHotRange(t *testing.T) {
	const rf, total = 3, 1024.0
	for _, c := range []struct {
		scheme string
		n      int
	}{{PlacementCopysets, 3}, {PlacementCopysets, 6}, {PlacementCopysets, 9}, {PlacementRing, 6}, {PlacementRing, 4}} {
		for start := range c.n {
			for levels := 1; levels <= 4; levels++ {
				name := fmt.Sprintf("%s/%d/start%d/levels%d", c.scheme, c.n, start, levels)
				members := make([]uint64, c.n)
				for i := range members {
					members[i] = uint64(i + 1)
				}
				type part struct {
					rate float64
					pos  int
				}
				parts := []part{{total, start}}
				voters := func(pos int) []uint64 {
					var out []uint64
					for _, v := range placeVoters(pos, c.n, rf, c.scheme) {
						out = append(out, members[v])
					}
					return out
				}
				leaderLoads := func() map[uint64]float64 {
					l := map[uint64]float64{}
					for _, p := range parts {
						l[members[p.pos]] += p.rate
					}
					return l
				}
				for range levels {
					for i := range len(parts) {
						p := parts[i]
						pos, ok := placeChild(members, leaderLoads(), members[p.pos], voters(p.pos), p.rate/2, rf, c.scheme)
						if !ok {
							t.Fatalf("%s: no placement under load", name)
						}
						parts[i].rate /= 2
						parts = append(parts, part{p.rate / 2, pos})
					}
				}
				share := total / float64(len(parts))
				replica := map[uint64]float64{}
				for _, p := range parts {
					for _, v := range voters(p.pos) {
						replica[v] += p.rate
					}
				}
				// With rf voters per partition, a node's fair replica load
				// is rf/n of the replicas' total (all of it below rf
				// nodes), give or take one partition.
				fair := total * float64(min(rf, c.n)) / float64(c.n)
				for _, id := range members {
					if replica[id] > fair+share+1e-9 {
						t.Errorf("%s: node %d applies %.0f writes/s, fair is %.0f (partitions of %.0f)", name, id, replica[id], fair, share)
					}
				}
				// Leaders: at most one partition more than the even share.
				maxLead := share * float64((len(parts)+c.n-1)/c.n)
				for id, l := range leaderLoads() {
					if l > maxLead+1e-9 {
						t.Errorf("%s: node %d leads %.0f writes/s, want at most %.0f", name, id, l, maxLead)
					}
				}
			}
		}
	}
}
