package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// PlacementFaultNames are faults that move leaderships through the
// operator API rather than break anything; a run draws them only when
// --faults names them:
//   - transfer: for the hold time, every 250 ms a random group's leader is
//     asked (POST /brain/v1/transfer-leader) to hand its leadership to a
//     random other voter: planned transfers under load, racing each other
//     and the balancer. A transfer that does not happen is no violation;
//     a write it fails or a revision it skips would be caught by the
//     checkers as for any fault.
//   - split: a random node is asked (POST /brain/v1/split) to split the
//     partition holding a random key of splitKeys at that key, under load;
//     then the fault holds (the load runs on the new partitions). Each key
//     splits once per cluster; a refused split is no violation.
//   - move: a random partition's leader is asked (POST
//     /brain/v1/move-replica) to move the replica of a random voter to a
//     node without one (learner, catch-up, promotion, removal), under
//     load; needs more nodes than replicas (--nodes 4). The rebalancer
//     moves it back later: two moves for one fault. A move that does not
//     finish is no violation.
var PlacementFaultNames = []string{"transfer", "split", "move"}

// move asks a random partition leader to move a random voter's replica to
// a node that has none; it returns what it asked and the answer.
func (c *Cluster) move(ctx context.Context, rng *rand.Rand) string {
	var parts []leadership
	for _, l := range c.leaderships(ctx) {
		if l.group >= 100 {
			parts = append(parts, l)
		}
	}
	if len(parts) == 0 {
		return "no partition leader found"
	}
	l := parts[rng.Intn(len(parts))]
	var to []string
	for _, id := range c.memberIDs(ctx) {
		if !slices.Contains(l.voters, id) {
			to = append(to, id)
		}
	}
	if len(to) == 0 || len(l.voters) == 0 {
		return fmt.Sprintf("group %d: every node holds a replica (use more nodes than replicas)", l.group)
	}
	from, dest := l.voters[rng.Intn(len(l.voters))], to[rng.Intn(len(to))]
	hc := http.Client{Timeout: 2 * time.Minute}
	u := fmt.Sprintf("http://%s/brain/v1/move-replica?group=%d&from=%s&to=%s", l.node.Endpoint(), l.group, from, dest)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return err.Error()
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Sprintf("group %d %s -> %s: %v", l.group, from, dest, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("group %d %s -> %s: %s %s", l.group, from, dest, resp.Status, strings.TrimSpace(string(b)))
}

// memberIDs returns the IDs (hex) of the running nodes that answer.
func (c *Cluster) memberIDs(ctx context.Context) []string {
	var out []string
	for _, st := range c.statuses(ctx) {
		out = append(out, st.ID)
	}
	return out
}

// nodeStatus is a running node and the part of its status the faults read.
type nodeStatus struct {
	node *Node
	nodeGroups
}

// statuses asks every running node for its status (nodes that do not
// answer are left out).
func (c *Cluster) statuses(ctx context.Context) []nodeStatus {
	hc := http.Client{Timeout: time.Second}
	var out []nodeStatus
	for _, n := range c.Nodes {
		if !n.Up() {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.Endpoint()+"/brain/v1/status", nil)
		if err != nil {
			continue
		}
		resp, err := hc.Do(req)
		if err != nil {
			continue
		}
		st := nodeStatus{node: n}
		err = json.NewDecoder(resp.Body).Decode(&st.nodeGroups)
		resp.Body.Close()
		if err == nil {
			out = append(out, st)
		}
	}
	return out
}

// splitKeys are where the split fault cuts partitions: namespace
// boundaries inside the kube resources' partitions, so that no workload
// transaction (single keys, and keys of one lease or register prefix)
// comes to span two partitions.
func splitKeys() []string {
	var keys []string
	for _, r := range kubeResources {
		for _, ns := range []string{"ns1", "ns2"} {
			keys = append(keys, fmt.Sprintf("/registry/%s/%s", r, ns))
		}
	}
	return keys
}

// split asks a random running node to split at a random key of
// splitKeys; it returns the key and the answer.
func (c *Cluster) split(ctx context.Context, rng *rand.Rand) (string, string) {
	keys := splitKeys()
	key := keys[rng.Intn(len(keys))]
	var up []*Node
	for _, n := range c.Nodes {
		if n.Up() {
			up = append(up, n)
		}
	}
	if len(up) == 0 {
		return key, "no node up"
	}
	n := up[rng.Intn(len(up))]
	hc := http.Client{Timeout: time.Minute}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://%s/brain/v1/split?key=%s", n.Endpoint(), url.QueryEscape(key)), nil)
	if err != nil {
		return key, err.Error()
	}
	resp, err := hc.Do(req)
	if err != nil {
		return key, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return key, fmt.Sprintf("%s via %s: %s", resp.Status, n.Name, strings.TrimSpace(string(b)))
}

// nodeGroups is the part of a node's /brain/v1/status the faults read.
type nodeGroups struct {
	ID     string `json:"id"`
	Groups []struct {
		Group  uint64   `json:"group"`
		Role   string   `json:"role"`
		Voters []string `json:"voters"`
	} `json:"groups"`
}

// leadership is a group a node leads, with the group's voters.
type leadership struct {
	node   *Node
	self   string
	group  uint64
	voters []string
}

// leaderships asks every running node which groups it leads.
func (c *Cluster) leaderships(ctx context.Context) []leadership {
	var out []leadership
	for _, st := range c.statuses(ctx) {
		for _, g := range st.Groups {
			if g.Role == "leader" {
				out = append(out, leadership{node: st.node, self: st.ID, group: g.Group, voters: g.Voters})
			}
		}
	}
	return out
}

// transferStorm asks random leaders to hand their groups to random other
// voters until hold has passed; it returns how many transfers were asked
// and how many happened.
func (c *Cluster) transferStorm(ctx context.Context, hold time.Duration, rng *rand.Rand) (asked, done int) {
	hc := http.Client{Timeout: 15 * time.Second}
	end := time.Now().Add(hold)
	for time.Now().Before(end) && ctx.Err() == nil {
		if ls := c.leaderships(ctx); len(ls) > 0 {
			l := ls[rng.Intn(len(ls))]
			var others []string
			for _, v := range l.voters {
				if v != l.self {
					others = append(others, v)
				}
			}
			if len(others) > 0 {
				to := others[rng.Intn(len(others))]
				u := fmt.Sprintf("http://%s/brain/v1/transfer-leader?group=%d&to=%s", l.node.Endpoint(), l.group, url.QueryEscape(to))
				if req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil); err == nil {
					asked++
					if resp, err := hc.Do(req); err == nil {
						if resp.StatusCode == http.StatusOK {
							done++
						}
						resp.Body.Close()
					}
				}
			}
		}
		sleep(ctx, 250*time.Millisecond)
	}
	return asked, done
}
