package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"time"

	"github.com/brainkv/brain/internal/history"
)

// FaultNames are the faults a run draws from:
//   - kill: kill -9 a random node, restart it after the hold time;
//   - pause: SIGSTOP a random node, SIGCONT after the hold time;
//   - kill-tso-leader: kill -9 the node leading the TSO, then restart it;
//   - kill-meta-leader: the same for the node leading the meta group;
//   - pause-busiest: SIGSTOP the node leading the most groups;
//   - restart-all: kill -9 every node, then start them all again.
//   - disk-stall: every disk write of a random node waits 500 ms (a hung
//     or very slow disk);
//   - disk-fail: a random node's syncs fail with EIO; the node stops
//     itself (fail-stop) and is restarted after the hold time;
//   - disk-full: a random node's writes fail with ENOSPC; the same.
//
// The disk faults are injected through the node's Pebble filesystem (see
// internal/diskfault); a run that draws one starts its nodes with
// BRAIN_DISK_FAULTS=1.
var FaultNames = []string{"kill", "pause", "kill-tso-leader", "kill-meta-leader", "pause-busiest", "restart-all", "disk-stall", "disk-fail", "disk-full"}

// EtcdFaultNames are the faults a run against etcd draws from
// (Config.System): kill-tso-leader kills etcd's leader, and pause-busiest
// pauses it.
var EtcdFaultNames = []string{"kill", "pause", "kill-tso-leader", "pause-busiest", "restart-all"}

// DiskFaultNames are the faults that need BRAIN_DISK_FAULTS=1.
var DiskFaultNames = []string{"disk-stall", "disk-fail", "disk-full"}

// NetFaultNames are the network faults of a namespaced cluster (--netns):
//   - isolate: cut a random node off from the others, both ways (the
//     minority side of a partition; its clients still reach it);
//   - isolate-tso-leader: the same for the node leading the TSO;
//   - one-way: a random node's messages to the others are dropped, while
//     it still receives theirs;
//   - bridge: the other nodes are split into two sides that cannot reach
//     each other, and a random node alone reaches both (a non-transitive
//     partition: raft must not let two leaders make progress);
//   - slow: every node's traffic is throttled to 2 Mbit/s (queued up to
//     300 ms) with 2% loss.
var NetFaultNames = []string{"isolate", "isolate-tso-leader", "one-way", "bridge", "slow"}

// Timeline is the record of what the nemesis did, on the history's clock.
type Timeline struct {
	rec   *history.Recorder
	mu    sync.Mutex
	ev    []string
	spans []*Span // protected by mu
}

// Span is one fault on the history's clock, from when it was applied to
// when it was healed (End 0: not healed in the run).
type Span struct {
	Fault string
	Node  string // the node it targeted ("": the cluster)
	Start int64
	End   int64
}

// begin records that fault started on node ("": the whole cluster).
func (t *Timeline) begin(fault, node string) *Span {
	sp := &Span{Fault: fault, Node: node, Start: t.rec.Now()}
	t.mu.Lock()
	t.spans = append(t.spans, sp)
	t.mu.Unlock()
	return sp
}

// end records that sp was healed.
func (t *Timeline) end(sp *Span) {
	now := t.rec.Now()
	t.mu.Lock()
	sp.End = now
	t.mu.Unlock()
}

// Spans returns the faults so far, in the order they started.
func (t *Timeline) Spans() []Span {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Span, len(t.spans))
	for i, sp := range t.spans {
		out[i] = *sp
	}
	return out
}

func (t *Timeline) add(action, node string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ev = append(t.ev, fmt.Sprintf("%10.3fs %-16s %s", time.Duration(t.rec.Now()).Seconds(), action, node))
}

func (t *Timeline) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.ev, "\n") + "\n"
}

// inject applies fault f, holds it, and heals it.
func inject(ctx context.Context, c *Cluster, f string, hold time.Duration, rng *rand.Rand, tl *Timeline, progress func(string, ...any)) error {
	var up []*Node
	for _, n := range c.Nodes {
		if n.Up() {
			up = append(up, n)
		}
	}
	if len(up) == 0 {
		return fmt.Errorf("no node is up")
	}
	random := up[rng.Intn(len(up))]
	var target *Node
	switch f {
	case "kill", "pause", "isolate", "one-way", "disk-stall", "disk-fail", "disk-full":
		target = random
	case "none":
		// No fault: the workloads run undisturbed (a baseline, drawn only
		// when named).
		sleep(ctx, hold)
		return nil
	case "bridge":
		progress("bridge through %s for %v", random.Name, hold.Round(time.Millisecond))
		tl.add("bridge", random.Name)
		sp := tl.begin("bridge", "")
		err := c.Bridge(random)
		sleep(ctx, hold)
		tl.add("heal-network", "all")
		for _, n := range c.Nodes {
			c.HealNetwork(n)
		}
		tl.end(sp)
		return err
	case "slow":
		progress("slow network for %v", hold.Round(time.Millisecond))
		tl.add("slow", "all")
		sp := tl.begin("slow", "")
		defer tl.end(sp)
		var err error
		for _, n := range c.Nodes {
			err = errors.Join(err, c.Slow(n))
		}
		sleep(ctx, hold)
		tl.add("heal-network", "all")
		for _, n := range c.Nodes {
			c.HealNetwork(n)
		}
		return err
	case "kill-tso-leader", "isolate-tso-leader":
		if target = c.Leader("1"); target == nil {
			target = random // no leader known (mid-election): any node
		}
	case "kill-meta-leader":
		if target = c.Leader("2"); target == nil {
			target = random
		}
	case "pause-busiest":
		if target = c.Busiest(); target == nil {
			target = random
		}
	case "transfer":
		progress("transfer leaderships for %v", hold.Round(time.Millisecond))
		tl.add("transfer-storm", "")
		sp := tl.begin("transfer", "")
		defer tl.end(sp)
		asked, done := c.transferStorm(ctx, hold, rng)
		tl.add("transfer-storm-end", fmt.Sprintf("%d asked, %d done", asked, done))
		return nil
	case "move":
		sp := tl.begin("move", "")
		defer tl.end(sp)
		answer := c.move(ctx, rng)
		progress("move: %s", answer)
		tl.add("move", answer)
		sleep(ctx, hold)
		return nil
	case "split":
		sp := tl.begin("split", "")
		defer tl.end(sp)
		key, answer := c.split(ctx, rng)
		progress("split at %s: %s", key, answer)
		tl.add("split", key+": "+answer)
		sleep(ctx, hold)
		return nil
	case "restart-all":
		progress("restart-all")
		tl.add("kill-all", "")
		sp := tl.begin("restart-all", "")
		defer tl.end(sp)
		for _, n := range c.Nodes {
			c.Kill(n)
		}
		sleep(ctx, 500*time.Millisecond)
		tl.add("start-all", "")
		for _, n := range c.Nodes {
			if err := c.Start(n); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("unknown fault %q", f)
	}
	progress("%s %s for %v", f, target.Name, hold.Round(time.Millisecond))
	sp := tl.begin(f, target.Name)
	defer tl.end(sp)
	switch f {
	case "kill", "kill-tso-leader", "kill-meta-leader":
		tl.add(f, target.Name)
		c.Kill(target)
		sleep(ctx, hold)
		tl.add("restart", target.Name)
		return c.Start(target)
	case "disk-stall":
		tl.add(f, target.Name)
		err := c.DiskFault(ctx, target, "stall", 500*time.Millisecond)
		sleep(ctx, hold)
		tl.add("heal-disk", target.Name)
		return errors.Join(err, c.DiskFault(ctx, target, "off", 0))
	case "disk-fail", "disk-full":
		tl.add(f, target.Name)
		if err := c.DiskFault(ctx, target, strings.TrimPrefix(f, "disk-"), 0); err != nil {
			return err
		}
		sleep(ctx, hold)
		if target.Up() {
			// No write reached the faulty disk in a way that stops the
			// node (or it rode the fault out): it must now recover.
			tl.add("heal-disk", target.Name+" (still running)")
			return c.DiskFault(ctx, target, "off", 0)
		}
		tl.add("restart", target.Name+" (it stopped itself)")
		c.Kill(target) // reaps it
		return c.Start(target)
	case "isolate", "isolate-tso-leader", "one-way":
		tl.add(f, target.Name)
		err := c.Isolate(target, f == "one-way")
		sleep(ctx, hold)
		tl.add("heal-network", target.Name)
		c.HealNetwork(target)
		return err
	default:
		tl.add(f, target.Name)
		c.Pause(target)
		sleep(ctx, hold)
		tl.add("resume", target.Name)
		c.Resume(target)
		return nil
	}
}
