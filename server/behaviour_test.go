package server_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func startDefault(t *testing.T) (*server.Server, *clientv3.Client) {
	t.Helper()
	s := testutil.StartBrain(t, server.Config{InitialSplitPoints: []string{"c", "m", "t"}})
	return s, testutil.Client(t, testutil.Endpoint(s))
}

func TestFreshStoreStartsAtRevisionOne(t *testing.T) {
	_, c := startDefault(t)
	g, err := c.Get(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if g.Header.Revision != 1 {
		t.Fatalf("fresh store at revision %d, want 1 as etcd", g.Header.Revision)
	}
	p, err := c.Put(context.Background(), "x", "1")
	if err != nil {
		t.Fatal(err)
	}
	if p.Header.Revision != 2 {
		t.Fatalf("first write got revision %d, want 2", p.Header.Revision)
	}
}

func TestCrossPartitionTxnRefused(t *testing.T) {
	_, c := startDefault(t)
	ctx := context.Background()
	_, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision("a"), "=", 0)).Then(clientv3.OpPut("x", "1")).Commit()
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "spans multiple partitions") {
		t.Fatalf("cross-partition txn: got %v, want InvalidArgument saying it spans partitions", err)
	}
	// Nothing was written.
	g, err := c.Get(ctx, "x")
	if err != nil || g.Count != 0 {
		t.Fatalf("get x after refused txn: %v %v", g, err)
	}
	// A range op crossing partitions inside a txn is refused too.
	_, err = c.Txn(ctx).Then(clientv3.OpPut("a", "1"), clientv3.OpGet("a", clientv3.WithRange("z"))).Commit()
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("txn with a range over partitions: got %v, want InvalidArgument", err)
	}
	// The same shapes within one partition work.
	if _, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision("a"), "=", 0)).Then(clientv3.OpPut("b", "1")).Commit(); err != nil {
		t.Fatal(err)
	}
}

func TestDeleteRangeAcrossPartitions(t *testing.T) {
	_, c := startDefault(t)
	ctx := context.Background()
	keys := []string{"a", "b", "d", "n", "u", "z"}
	for _, k := range keys {
		if _, err := c.Put(ctx, k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := c.Get(ctx, "x")
	wch := c.Watch(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(before.Header.Revision+1), clientv3.WithPrevKV())
	d, err := c.Delete(ctx, "b", clientv3.WithRange("v"), clientv3.WithPrevKV())
	if err != nil {
		t.Fatal(err)
	}
	if d.Deleted != 4 || len(d.PrevKvs) != 4 {
		t.Fatalf("deleted %d (prev %d), want 4", d.Deleted, len(d.PrevKvs))
	}
	var got []string
	for i := 0; i < len(d.PrevKvs); i++ {
		if string(d.PrevKvs[i].Key) != keys[i+1] {
			t.Fatalf("prev kvs out of key order: %v", d.PrevKvs)
		}
	}
	// Each partition's part is its own revision; events arrive in order.
	for len(got) < 4 {
		wr := <-wch
		for _, ev := range wr.Events {
			if ev.Type != clientv3.EventTypeDelete || ev.PrevKv == nil {
				t.Fatalf("unexpected event %v", ev)
			}
			got = append(got, fmt.Sprintf("%s@%d", ev.Kv.Key, ev.Kv.ModRevision))
		}
	}
	if d.Header.Revision != before.Header.Revision+4 {
		t.Fatalf("header revision %d after deleting in 4 partitions from %d", d.Header.Revision, before.Header.Revision)
	}
	t.Logf("events: %v", got)
	left, _ := c.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	if left.Count != 2 {
		t.Fatalf("%d keys left, want 2 (a, z)", left.Count)
	}
}

func TestLeaseRevokeAndExpiryAcrossPartitions(t *testing.T) {
	_, c := startDefault(t)
	ctx := context.Background()
	l, err := c.Grant(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "d", "n", "u"}
	for _, k := range keys {
		if _, err := c.Put(ctx, k, "v", clientv3.WithLease(l.ID)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Put(ctx, "b", "unleased"); err != nil {
		t.Fatal(err)
	}
	ttl, err := c.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	var attached []string
	for _, k := range ttl.Keys {
		attached = append(attached, string(k))
	}
	sort.Strings(attached)
	if strings.Join(attached, ",") != strings.Join(keys, ",") || ttl.GrantedTTL != 100 || ttl.TTL < 98 {
		t.Fatalf("TimeToLive: %+v", ttl)
	}
	if _, err := c.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	g, _ := c.Get(ctx, "\x00", clientv3.WithFromKey())
	if g.Count != 1 || string(g.Kvs[0].Key) != "b" {
		t.Fatalf("after revoke: %v", g.Kvs)
	}
	if _, err := c.Revoke(ctx, l.ID); err != rpctypes.ErrLeaseNotFound {
		t.Fatalf("second revoke: %v, want lease not found", err)
	}
	if _, err := c.Put(ctx, "x", "v", clientv3.WithLease(l.ID)); err != rpctypes.ErrLeaseNotFound {
		t.Fatalf("put with revoked lease: %v", err)
	}

	// Expiry: a 2s lease deletes its keys with delete events.
	short, err := c.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if short.TTL != 2 {
		t.Fatalf("TTL 1 granted as %d, want etcd's minimum 2", short.TTL)
	}
	p1, _ := c.Put(ctx, "e", "v", clientv3.WithLease(short.ID))
	if _, err := c.Put(ctx, "v", "v", clientv3.WithLease(short.ID)); err != nil {
		t.Fatal(err)
	}
	wch := c.Watch(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(p1.Header.Revision+2))
	deleted := map[string]bool{}
	timeout := time.After(10 * time.Second)
	for len(deleted) < 2 {
		select {
		case wr := <-wch:
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					deleted[string(ev.Kv.Key)] = true
				}
			}
		case <-timeout:
			t.Fatalf("lease expiry: saw deletes of %v, want e and v", deleted)
		}
	}
	ttl, _ = c.TimeToLive(ctx, short.ID)
	if ttl.TTL != -1 {
		t.Fatalf("expired lease TTL %d, want -1", ttl.TTL)
	}
	// KeepAlive keeps a lease alive past its TTL.
	kept, _ := c.Grant(ctx, 2)
	if _, err := c.Put(ctx, "f", "v", clientv3.WithLease(kept.ID)); err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(ctx)
	if _, err := c.KeepAlive(kctx, kept.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	if g, _ := c.Get(ctx, "f"); g.Count != 1 {
		t.Fatal("kept-alive lease expired")
	}
	cancel()
}

func TestSnapshotSaveAndRestore(t *testing.T) {
	s, c := startDefault(t)
	ctx := context.Background()
	l, _ := c.Grant(ctx, 1000)
	for i := 0; i < 200; i++ {
		opts := []clientv3.OpOption{}
		if i%10 == 0 {
			opts = append(opts, clientv3.WithLease(l.ID))
		}
		if _, err := c.Put(ctx, fmt.Sprintf("%c/%03d", 'a'+i%26, i), fmt.Sprintf("v%d", i), opts...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Delete(ctx, "b/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	// A backup after a split keeps the split (the restored store starts
	// with it as a split point).
	if _, _, err := s.Split(ctx, []byte("d/")); err != nil {
		t.Fatal(err)
	}
	mid, _ := c.Put(ctx, "m/x", "1")
	if _, err := c.Compact(ctx, mid.Header.Revision-50, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	before, _ := c.Get(ctx, "\x00", clientv3.WithFromKey())
	file := filepath.Join(t.TempDir(), "backup.db")
	// etcd's own client code saves the stream (it checks the trailing
	// SHA-256 and the 512-byte alignment).
	if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: []string{testutil.Endpoint(s)}}, file); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "restored")
	h, err := server.Restore(server.RestoreConfig{SnapshotPath: file, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if h.Revision != before.Header.Revision {
		t.Fatalf("backup at revision %d, want %d", h.Revision, before.Header.Revision)
	}
	r := testutil.StartBrain(t, server.Config{DataDir: dir})
	rc := testutil.Client(t, testutil.Endpoint(r))
	if got, want := len(r.Store().Routes()), len(s.Store().Routes()); got != want {
		t.Fatalf("restored store has %d partitions, the backed up one %d", got, want)
	}
	after, err := rc.Get(ctx, "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision || len(after.Kvs) != len(before.Kvs) {
		t.Fatalf("restored: %d keys at %d, want %d at %d", len(after.Kvs), after.Header.Revision, len(before.Kvs), before.Header.Revision)
	}
	for i := range before.Kvs {
		if before.Kvs[i].String() != after.Kvs[i].String() {
			t.Fatalf("key %d: restored %v, want %v", i, after.Kvs[i], before.Kvs[i])
		}
	}
	// History after the compaction revision is there: a watch from the
	// compaction revision sees the same events on both.
	from := mid.Header.Revision - 50
	hist := func(c *clientv3.Client) string {
		var b strings.Builder
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for wr := range c.Watch(wctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(from)) {
			for _, ev := range wr.Events {
				fmt.Fprintf(&b, "%s %s %d\n", ev.Type, ev.Kv.Key, ev.Kv.ModRevision)
				if ev.Kv.ModRevision == before.Header.Revision {
					return b.String()
				}
			}
		}
		return b.String()
	}
	if a, b := hist(c), hist(rc); a != b || a == "" {
		t.Fatalf("history from %d differs:\noriginal:\n%s\nrestored:\n%s", from, a, b)
	}
	// Leases survive; revisions continue.
	if ttl, _ := rc.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys()); ttl.GrantedTTL != 1000 || len(ttl.Keys) != 20 {
		t.Fatalf("restored lease: %+v", ttl)
	}
	if p, _ := rc.Put(ctx, "new", "v"); p.Header.Revision != before.Header.Revision+1 {
		t.Fatalf("first write after restore at %d, want %d", p.Header.Revision, before.Header.Revision+1)
	}
	// A corrupt backup is refused.
	data, _ := os.ReadFile(file)
	data[len(data)/2] ^= 0xFF
	bad := filepath.Join(t.TempDir(), "bad.db")
	_ = os.WriteFile(bad, data, 0o600)
	if _, err := server.Restore(server.RestoreConfig{SnapshotPath: bad, DataDir: filepath.Join(t.TempDir(), "x")}); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("corrupt backup: %v", err)
	}
}

// TestClosedClientStreams opens and abandons many watch and keepalive
// streams and requests, and checks the server neither leaks goroutines nor
// stops serving.
func TestClosedClientStreams(t *testing.T) {
	s, _ := startDefault(t)
	ep := testutil.Endpoint(s)
	c := testutil.Client(t, ep)
	if _, err := c.Put(context.Background(), "warm", "up"); err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	for i := 0; i < 20; i++ {
		c := testutil.Client(t, ep)
		ctx, cancel := context.WithCancel(context.Background())
		c.Watch(ctx, "a", clientv3.WithPrefix(), clientv3.WithRev(1))
		l, err := c.Grant(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.KeepAlive(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
		// A request cancelled in flight.
		rctx, rcancel := context.WithCancel(ctx)
		rcancel()
		_, _ = c.Put(rctx, "a", "v")
		cancel()
		c.Close()
	}
	if _, err := c.Put(context.Background(), "still", "serving"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the streams:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestQuotaRaisesNoSpaceAlarm(t *testing.T) {
	s := testutil.StartBrain(t, server.Config{QuotaBackendBytes: 256 << 10})
	c := testutil.Client(t, testutil.Endpoint(s))
	ctx := context.Background()
	val := strings.Repeat("x", 64<<10)
	var err error
	for i := 0; i < 200 && err == nil; i++ {
		_, err = c.Put(ctx, fmt.Sprintf("k%d", i), val)
		time.Sleep(20 * time.Millisecond) // the size is sampled every second
	}
	if err != rpctypes.ErrNoSpace {
		t.Fatalf("writes past the quota: %v, want %v", err, rpctypes.ErrNoSpace)
	}
	al, err := c.AlarmList(ctx)
	if err != nil || len(al.Alarms) != 1 || al.Alarms[0].Alarm != pb.AlarmType_NOSPACE {
		t.Fatalf("alarms: %v %v", al, err)
	}
	// Reads and deletes still work; writes stay refused while the alarm is on.
	if _, err := c.Get(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Delete(ctx, "k", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "small", "v"); err != rpctypes.ErrNoSpace {
		t.Fatalf("put under the NOSPACE alarm: %v", err)
	}
	if _, err := c.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: al.Alarms[0].MemberID, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(ctx, testutil.Endpoint(s))
	if err != nil || len(st.Errors) != 0 || st.Version < "3.5.13" {
		t.Fatalf("status after disarm: %+v %v", st, err)
	}
}

// TestRequestProgressBookmark checks that a progress answer at R comes
// after every event at or below R, for a watch over all partitions, while
// only one partition is written.
func TestRequestProgressBookmark(t *testing.T) {
	_, c := startDefault(t)
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	defer cancel()
	wch := c.Watch(ctx, "\x00", clientv3.WithFromKey())
	<-time.After(50 * time.Millisecond)
	var last int64
	for i := 0; i < 50; i++ {
		p, err := c.Put(context.Background(), "d", fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		last = p.Header.Revision
	}
	if err := c.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	seen := int64(0)
	for wr := range wch {
		for _, ev := range wr.Events {
			seen = ev.Kv.ModRevision
		}
		if wr.IsProgressNotify() {
			if wr.Header.Revision < last || seen < last {
				t.Fatalf("progress at %d with events up to %d, after writes up to %d", wr.Header.Revision, seen, last)
			}
			return
		}
	}
}

// TestLoadShedding: past --max-inflight-writes a write is refused at once
// with etcd's "too many requests" (nothing applied: every acknowledged
// write is there, no refused one is), while Status and reads keep being
// answered; once the burst is over, writes succeed again.
func TestLoadShedding(t *testing.T) {
	s := testutil.StartBrain(t, server.Config{InitialSplitPoints: []string{"m"}, MaxInflightWrites: 2})
	c := testutil.Client(t, testutil.Endpoint(s))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const writers = 200
	errs := make(chan error, writers)
	for i := 0; i < writers; i++ {
		go func(i int) {
			_, err := c.Put(ctx, fmt.Sprintf("k%03d", i), "v")
			errs <- err
		}(i)
	}
	if _, err := c.Status(ctx, testutil.Endpoint(s)); err != nil {
		t.Fatalf("Status during the burst: %v", err)
	}
	ok, shed := map[string]bool{}, 0
	for i := 0; i < writers; i++ {
		switch err := <-errs; {
		case err == nil:
		case errors.Is(err, rpctypes.ErrTooManyRequests):
			shed++
		default:
			t.Fatalf("a write failed with %v, want success or %v", err, rpctypes.ErrTooManyRequests)
		}
	}
	g, err := c.Get(ctx, "k", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range g.Kvs {
		ok[string(kv.Key)] = true
	}
	if shed == 0 || len(ok) != writers-shed {
		t.Fatalf("%d writes shed, %d stored of %d: want some shed and every other one stored", shed, len(ok), writers)
	}
	if _, err := c.Put(ctx, "after", "v"); err != nil {
		t.Fatalf("a write after the burst: %v", err)
	}
	t.Logf("%d of %d concurrent writes shed with a limit of 2", shed, writers)
}
