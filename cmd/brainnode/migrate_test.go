package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
)

// TestMigrateFromEtcd copies an etcd 3.6 store into brain, from a live
// member and from a snapshot file: every key, value, create and mod
// revision, version and lease is preserved, etcd's history since its
// compaction is there, and a watcher that read etcd up to a revision
// resumes on brain after it and sees exactly the events etcd had, then
// brain's new writes.
func TestMigrateFromEtcd(t *testing.T) {
	ep := testutil.StartEtcd(t)
	ec := testutil.Client(t, ep)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := ec.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	keys := []string{"/registry/pods/default/p", "/registry/configmaps/kube-system/c", "/registry/events/default/e", "/registry/leases/kube-node-lease/n", "/a", "\x00bin\xff"}
	for round := 0; round < 4; round++ {
		for i, k := range keys {
			var opts []clientv3.OpOption
			if i%3 == 0 {
				opts = append(opts, clientv3.WithLease(l.ID))
			}
			must(ec.Put(ctx, fmt.Sprintf("%s%d", k, i), fmt.Sprintf("v%d-%d\x00\xfe", round, i), opts...))
		}
	}
	compact, err := ec.Put(ctx, "/registry/pods/default/p0", "at-compaction")
	must(compact, err)
	must(ec.Compact(ctx, compact.Header.Revision, clientv3.WithCompactPhysical()))
	// History after the compaction: updates, deletes, a transaction whose
	// writes share a revision (in key order: brain lists a revision's
	// events by key).
	must(ec.Delete(ctx, "/registry/events/", clientv3.WithPrefix()))
	must(ec.Txn(ctx).Then(clientv3.OpPut("/t/1", "a"), clientv3.OpPut("/t/2", "b"), clientv3.OpDelete("/a4")).Commit())
	for i := 0; i < 5; i++ {
		must(ec.Put(ctx, "/registry/configmaps/kube-system/c1", fmt.Sprintf("u%d", i)))
	}
	mid, err := ec.Put(ctx, "/mid", "x")
	must(mid, err)
	for i := 0; i < 5; i++ {
		must(ec.Put(ctx, fmt.Sprintf("/registry/pods/late/%d", i), "y"))
	}
	must(ec.Delete(ctx, "/mid"))
	want, err := ec.Get(ctx, "\x00", clientv3.WithFromKey())
	must(want, err)
	last := want.Header.Revision
	etcdEvents := events(t, ctx, ec, compact.Header.Revision+1, last)
	wantTTL, err := ec.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
	must(wantTTL, err)

	snapFile := filepath.Join(t.TempDir(), "etcd.snap")
	if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: []string{ep}}, snapFile); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"from-endpoint", "from-snapshot"} {
		t.Run(mode, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "brain")
			args := []string{"migrate", mode, "--data-dir", dir}
			if mode == "from-endpoint" {
				args = append(args, "--endpoints", "http://"+ep)
			} else {
				args = append(args, snapFile)
			}
			cmd := rootCmd()
			cmd.SetArgs(args)
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			b := testutil.StartBrain(t, server.Config{DataDir: dir})
			bc := testutil.Client(t, testutil.Endpoint(b))
			got, err := bc.Get(ctx, "\x00", clientv3.WithFromKey())
			must(got, err)
			if got.Header.Revision != last || len(got.Kvs) != len(want.Kvs) {
				t.Fatalf("brain has %d keys at revision %d; etcd had %d at %d", len(got.Kvs), got.Header.Revision, len(want.Kvs), last)
			}
			for i := range want.Kvs {
				if want.Kvs[i].String() != got.Kvs[i].String() {
					t.Fatalf("key %d: brain %v, etcd %v", i, got.Kvs[i], want.Kvs[i])
				}
			}
			// A compacted revision is compacted on brain too.
			if _, err := bc.Get(ctx, "/a", clientv3.WithRev(compact.Header.Revision-1)); err == nil || !strings.Contains(err.Error(), "compacted") {
				t.Fatalf("read below etcd's compaction: %v, want compacted", err)
			}
			ttl, err := bc.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
			must(ttl, err)
			if ttl.GrantedTTL != 3600 || fmt.Sprintf("%q", ttl.Keys) != fmt.Sprintf("%q", wantTTL.Keys) {
				t.Fatalf("lease after migration: granted %d, keys %q (etcd: 3600, %q)", ttl.GrantedTTL, ttl.Keys, wantTTL.Keys)
			}
			// The watcher read etcd up to mid; it resumes on brain after it.
			var before []string
			for _, e := range etcdEvents {
				if !strings.HasPrefix(e, fmt.Sprintf("@%d ", mid.Header.Revision+1)) {
					before = append(before, e)
					continue
				}
				break
			}
			p, err := bc.Put(ctx, "/after-switch", "z")
			must(p, err)
			if p.Header.Revision != last+1 {
				t.Fatalf("first write on brain at revision %d, want %d", p.Header.Revision, last+1)
			}
			resumed := events(t, ctx, bc, mid.Header.Revision+1, last+1)
			combined := append(before, resumed...)
			wantAll := append(append([]string(nil), etcdEvents...), fmt.Sprintf("@%d PUT /after-switch=z create=%d ver=1 prev=<nil>", last+1, last+1))
			if strings.Join(combined, "\n") != strings.Join(wantAll, "\n") {
				t.Fatalf("a watcher switching over at %d:\ngot\n%s\nwant\n%s", mid.Header.Revision, strings.Join(combined, "\n"), strings.Join(wantAll, "\n"))
			}
		})
	}
}

// events watches everything from revision from to to (inclusive) with
// prev_kv and renders each event.
func events(t *testing.T, ctx context.Context, c *clientv3.Client, from, to int64) []string {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var out []string
	for wr := range c.Watch(wctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(from), clientv3.WithPrevKV()) {
		if err := wr.Err(); err != nil {
			t.Fatalf("watch from %d: %v", from, err)
		}
		for _, ev := range wr.Events {
			prev := "<nil>"
			if ev.PrevKv != nil {
				prev = fmt.Sprintf("%q@%d", ev.PrevKv.Value, ev.PrevKv.ModRevision)
			}
			kv := ev.Kv
			out = append(out, fmt.Sprintf("@%d %s %s=%s create=%d ver=%d prev=%s", kv.ModRevision, ev.Type, kv.Key, kv.Value, kv.CreateRevision, kv.Version, prev))
			if kv.ModRevision == to {
				return out
			}
		}
	}
	t.Fatalf("watch from %d ended before revision %d (%d events)", from, to, len(out))
	return nil
}

// TestMigrateFailuresLeaveNothing: an etcd that does not answer fails
// from-endpoint within its --dial-timeout with a message naming the
// endpoint; a file that is not a snapshot fails from-snapshot and snapshot
// restore; none leaves a data directory (nor the temporary one beside it)
// behind.
func TestMigrateFailuresLeaveNothing(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "brain")
	dead := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))
	start := time.Now()
	_, err := runCmd(t, "migrate", "from-endpoint", "--endpoints", dead, "--dial-timeout", "1s", "--data-dir", dir)
	if err == nil || !strings.Contains(err.Error(), "no etcd member answered") || !strings.Contains(err.Error(), dead) {
		t.Fatalf("migrate from a dead endpoint: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("migrate from a dead endpoint took %v with --dial-timeout 1s", took)
	}
	bad := filepath.Join(t.TempDir(), "not-a-snapshot")
	if err := os.WriteFile(bad, []byte("not a bbolt file"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := runCmd(t, "migrate", "from-snapshot", bad, "--data-dir", dir); err == nil {
		t.Fatal("migrate from a file that is not a snapshot succeeded")
	}
	// A restore fails after it created its store (the backup is read
	// while the store is written).
	if _, err := runCmd(t, "snapshot", "restore", bad, "--data-dir", dir); err == nil {
		t.Fatal("restore of a file that is not a backup succeeded")
	}
	names, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 0 {
		t.Fatalf("failed migrations left %v in %s", names, parent)
	}
}
