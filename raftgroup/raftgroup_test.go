package raftgroup

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/brainkv/brain/engine"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// counterSM keeps, per group, a count of applied commands and the sum of
// their values in Pebble, so restarts show whether anything applied twice.
// Like a real state machine it keeps what apply reads in memory, loaded at
// start.
type counterSM struct {
	group  uint64
	n, sum uint64
}

func newCounterSM(t *testing.T, db *pebble.DB, group uint64) *counterSM {
	c := &counterSM{group: group}
	c.n, c.sum = readCounter(t, db, group)
	return c
}

func (c *counterSM) key() []byte { return engine.GroupKey(c.group, "count") }

func (c *counterSM) Apply(ac *ApplyContext, e *raftpb.Entry, cmd []byte) any {
	c.n++
	c.sum += binary.BigEndian.Uint64(cmd)
	_ = ac.Batch.Set(c.key(), engine.PutUint64(engine.PutUint64(nil, c.n), c.sum), nil)
	return c.n
}

func readCounter(t *testing.T, db *pebble.DB, group uint64) (n, sum uint64) {
	t.Helper()
	v, closer, err := db.Get(engine.GroupKey(group, "count"))
	if err == pebble.ErrNotFound {
		return 0, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	return binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
}

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func testConfig(id uint64) Config {
	return Config{NodeID: id, TickInterval: 10 * time.Millisecond, LogKeepEntries: 16, TruncateEvery: 32, Logger: testLogger()}
}

func openMem(t *testing.T, fs vfs.FS) *pebble.DB {
	t.Helper()
	db, err := engine.Open(engine.Config{Dir: "db", FS: fs, CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func waitLeader(t *testing.T, gs ...*Group) *Group {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, g := range gs {
			if st := g.Status(); st.IsLeader && st.LeaderReady {
				return g
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no leader")
	return nil
}

func cmd(v uint64) []byte { return engine.PutUint64(NewCommand(8), v) }

func TestSingleNodeRestartAppliesExactlyOnce(t *testing.T) {
	fs := vfs.NewMem()
	const groups = 3
	var want [groups + 1]uint64
	for round := 0; round < 3; round++ {
		db := openMem(t, fs)
		h, err := NewHost(testConfig(1), db, nil)
		if err != nil {
			t.Fatal(err)
		}
		var gs []*Group
		for id := uint64(1); id <= groups; id++ {
			g, err := h.CreateGroup(id, []uint64{1}, newCounterSM(t, db, id))
			if err != nil {
				t.Fatal(err)
			}
			gs = append(gs, g)
		}
		h.Start()
		for _, g := range gs {
			waitLeader(t, g)
		}
		// The count after recovery equals what was acknowledged before.
		for id := uint64(1); id <= groups; id++ {
			if n, _ := readCounter(t, db, id); n != want[id] {
				t.Fatalf("round %d group %d: recovered count %d, want %d", round, id, n, want[id])
			}
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				g := gs[i%groups]
				for j := 0; j < 50; j++ {
					if _, err := g.Propose(context.Background(), cmd(1)); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					want[g.ID()]++
					mu.Unlock()
				}
			}(i)
		}
		wg.Wait()
		h.Stop()
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestThreeNodesLeaderLoss(t *testing.T) {
	tr := NewMemTransport()
	hosts := map[uint64]*Host{}
	groups := map[uint64]*Group{}
	dbs := map[uint64]*pebble.DB{}
	for id := uint64(1); id <= 3; id++ {
		db := openMem(t, vfs.NewMem())
		h, err := NewHost(testConfig(id), db, tr.From(id))
		if err != nil {
			t.Fatal(err)
		}
		tr.Register(id, h)
		g, err := h.CreateGroup(7, []uint64{1, 2, 3}, newCounterSM(t, db, 7))
		if err != nil {
			t.Fatal(err)
		}
		hosts[id], groups[id], dbs[id] = h, g, db
		h.Start()
	}
	defer func() {
		for _, h := range hosts {
			h.Stop()
		}
	}()
	groups[1].Campaign()
	leader := waitLeader(t, groups[1], groups[2], groups[3])
	acked := uint64(0)
	for i := 0; i < 100; i++ {
		if _, err := leader.Propose(context.Background(), cmd(1)); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	// Proposals on a follower are refused, not forwarded.
	for id, g := range groups {
		if g != leader {
			if _, err := g.Propose(context.Background(), cmd(1)); err != ErrNotLeader {
				t.Fatalf("follower %d: Propose err = %v, want ErrNotLeader", id, err)
			}
			break
		}
	}
	// Cut the leader off; the others elect a new leader and keep going.
	old := leader.host.cfg.NodeID
	tr.SetFilter(func(from, to uint64, _ GroupMessage) bool { return from != old && to != old })
	var rest []*Group
	for id, g := range groups {
		if id != old {
			rest = append(rest, g)
		}
	}
	leader = waitLeader(t, rest...)
	for i := 0; i < 100; i++ {
		if _, err := leader.Propose(context.Background(), cmd(1)); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	// Heal; the old leader catches up from the log.
	tr.SetFilter(nil)
	deadline := time.Now().Add(10 * time.Second)
	for id := range groups {
		for {
			n, _ := readCounter(t, dbs[id], 7)
			if n == acked {
				break
			}
			if n > acked {
				t.Fatalf("node %d applied %d commands, only %d were proposed successfully", id, n, acked)
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d applied %d of %d", id, n, acked)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
