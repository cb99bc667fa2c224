package server_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRawWatchStreamMatchesEtcd drives one raw Watch stream on brain and on
// etcd 3.6 with the same requests - client-chosen and duplicate watch IDs,
// negative start revisions, empty ranges, filters, prev_kv, cancels of
// known and unknown IDs, progress requests, a compacted start revision and
// a fragmented revision larger than --max-request-bytes - and requires the
// same responses.
func TestRawWatchStreamMatchesEtcd(t *testing.T) {
	b := testutil.StartBrain(t, server.Config{InitialSplitPoints: []string{"c", "m", "t"}})
	e := testutil.StartEtcd(t)
	sides := []clients{newClients(t, "brain", testutil.Endpoint(b)), newClients(t, "etcd", e)}
	ctx := context.Background()
	// The same history on both: a few revisions, a compaction, 25 keys of
	// 50 KiB, and one transaction overwriting them all: with prev_kv its
	// events are 2.5 MB, more than --max-request-bytes (1.5 MiB).
	for _, c := range sides {
		for i := 0; i < 5; i++ {
			if _, err := c.kv.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("a%d", i)), Value: []byte{byte(i)}}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.kv.Compact(ctx, &pb.CompactionRequest{Revision: 4}); err != nil {
			t.Fatal(err)
		}
		txn := &pb.TxnRequest{}
		for i := 0; i < 25; i++ {
			k := []byte(fmt.Sprintf("f%02d", i))
			if _, err := c.kv.Put(ctx, &pb.PutRequest{Key: k, Value: bytes.Repeat([]byte{'u'}, 50<<10)}); err != nil {
				t.Fatal(err)
			}
			txn.Success = append(txn.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k, Value: bytes.Repeat([]byte{'v'}, 50<<10)}}})
		}
		if _, err := c.kv.Txn(ctx, txn); err != nil {
			t.Fatal(err)
		}
	}
	create := func(r *pb.WatchCreateRequest) *pb.WatchRequest {
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: r}}
	}
	cancel := func(id int64) *pb.WatchRequest {
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: id}}}
	}
	steps := []watchStep{
		{create(&pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: []byte("b"), StartRevision: 4, PrevKv: true, WatchId: 7}), 2},
		{create(&pb.WatchCreateRequest{Key: []byte("a0"), WatchId: 7}), 1},                             // duplicate ID
		{create(&pb.WatchCreateRequest{Key: []byte("a"), StartRevision: -1}), 1},                       // negative start
		{create(&pb.WatchCreateRequest{Key: []byte("b"), RangeEnd: []byte("a")}), 1},                   // empty range
		{create(&pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: []byte("b"), StartRevision: 2}), 2}, // compacted
		{create(&pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: []byte("b"), StartRevision: 4, Filters: []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT}}), 1},
		{cancel(7), 1},
		{cancel(12345), 0}, // unknown: no answer
		{create(&pb.WatchCreateRequest{Key: []byte("f"), RangeEnd: []byte("g"), StartRevision: 32, Fragment: true, PrevKv: true}), 1 + 2},
	}
	sameWatchStreams(t, sides, steps)
}

// watchStep is a request on a raw watch stream and how many responses it
// produces.
type watchStep struct {
	req   *pb.WatchRequest
	resps int
}

// sameWatchStreams runs steps on one raw Watch stream of each side and
// requires the same responses.
func sameWatchStreams(t *testing.T, sides []clients, steps []watchStep) {
	t.Helper()
	var outs []string
	for _, c := range sides {
		sctx, stop := context.WithTimeout(context.Background(), 20*time.Second)
		stream, err := c.watch.Watch(sctx)
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		for i, s := range steps {
			if err := stream.Send(s.req); err != nil {
				t.Fatal(err)
			}
			for j := 0; j < s.resps; j++ {
				r, err := stream.Recv()
				if err != nil {
					t.Fatalf("%s step %d: %v", c.name, i, err)
				}
				fmt.Fprintf(&out, "step %d: %s\n", i, fmtWatchResp(r))
			}
		}
		stop()
		outs = append(outs, out.String())
	}
	if outs[0] != outs[1] {
		t.Fatalf("watch streams differ:\nbrain:\n%s\netcd:\n%s", outs[0], outs[1])
	}
	t.Logf("\n%s", outs[0])
}

func fmtWatchResp(r *pb.WatchResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "id=%d created=%v canceled=%v compact=%d fragment=%v reason=%q header=%d events=%d",
		r.WatchId, r.Created, r.Canceled, r.CompactRevision, r.Fragment, r.CancelReason, r.Header.GetRevision(), len(r.Events))
	for _, ev := range r.Events {
		if len(ev.Kv.Value) > 16 {
			fmt.Fprintf(&b, " [%s %s@%d len=%d]", ev.Type, ev.Kv.Key, ev.Kv.ModRevision, len(ev.Kv.Value))
		} else {
			fmt.Fprintf(&b, " [%s %s@%d prev=%v]", ev.Type, ev.Kv.Key, ev.Kv.ModRevision, ev.PrevKv != nil)
		}
	}
	return b.String()
}

// TestStoppingNodeBookmarksWatches checks what a watch hears when its node
// stops cleanly: a progress notification at the revision it was sent
// everything up to, then the end of the stream with etcd's "server
// stopped" (Unavailable: etcd's client resumes elsewhere). The client
// resumes a watch from the revision after the last response's: without
// the notification, a watch of a quiet range resumed from its last event,
// long compacted, and kube-apiserver re-listed the resource.
func TestStoppingNodeBookmarksWatches(t *testing.T) {
	b := testutil.StartBrain(t, server.Config{})
	c := testutil.Client(t, testutil.Endpoint(b))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "/quiet/a", "1"); err != nil {
		t.Fatal(err)
	}
	// Two watches on one stream: a quiet range that asked for progress
	// notifications (as kube-apiserver's do), and one that did not.
	quiet := c.Watch(ctx, "/quiet/", clientv3.WithPrefix(), clientv3.WithProgressNotify(), clientv3.WithCreatedNotify())
	plain := c.Watch(ctx, "/quiet/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	for _, ch := range []clientv3.WatchChan{quiet, plain} {
		if wr := <-ch; !wr.Created {
			t.Fatalf("watch not created: %v", wr.Err())
		}
	}
	var first int64
	for i := 0; i < 20; i++ {
		r, err := c.Put(ctx, fmt.Sprintf("/busy/%d", i), "v")
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = r.Header.Revision
		}
	}
	b.Stop()
	got := false
	for wr := range quiet {
		if wr.Err() != nil {
			break
		}
		if wr.IsProgressNotify() {
			// At the node's frontier: past the writes elsewhere (the
			// last ones may still be closing), far past the watch's
			// own last event.
			if wr.Header.Revision < first {
				t.Fatalf("the stopping node's progress notification is at %d, below the writes after the watch's last event (%d)", wr.Header.Revision, first)
			}
			got = true
			break
		}
		if len(wr.Events) > 0 {
			t.Fatalf("the quiet watch got events: %v", wr.Events)
		}
	}
	if !got {
		t.Fatal("the stopping node sent the watch no progress notification")
	}
	// The watch without progress notifications gets none (as from etcd).
	select {
	case wr := <-plain:
		if wr.IsProgressNotify() {
			t.Fatalf("a watch that did not ask got a progress notification at %d", wr.Header.Revision)
		}
	case <-time.After(100 * time.Millisecond):
	}
}

// TestProgressOnFreshWatchMatchesEtcd asks for progress on a stream whose
// only watch was created from "now", with nothing written since: etcd
// answers at once (kube-apiserver's consistent reads from its watch cache
// wait on exactly this), and ignores the request only while a watch waits
// for a future start revision it was asked for. brain ignored it for the
// fresh watch too, whose first revision to deliver is one past the
// current one.
func TestProgressOnFreshWatchMatchesEtcd(t *testing.T) {
	b := testutil.StartBrain(t, server.Config{InitialSplitPoints: []string{"m"}})
	e := testutil.StartEtcd(t)
	sides := []clients{newClients(t, "brain", testutil.Endpoint(b)), newClients(t, "etcd", e)}
	ctx := context.Background()
	for _, c := range sides {
		for i := 0; i < 3; i++ {
			if _, err := c.kv.Put(ctx, &pb.PutRequest{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	progress := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}
	create := func(r *pb.WatchCreateRequest) *pb.WatchRequest {
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: r}}
	}
	steps := []watchStep{
		{create(&pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: []byte("z")}), 1}, // from now
		{progress, 1}, // answered at once
		{create(&pb.WatchCreateRequest{Key: []byte("q"), StartRevision: 100}), 1},
		{progress, 0}, // a watch waits for revision 100: ignored
		{&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: 1}}}, 1},
		{progress, 1},
	}
	sameWatchStreams(t, sides, steps)
}
