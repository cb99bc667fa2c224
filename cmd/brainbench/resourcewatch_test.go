package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestResourceWatchOrderChecked: a resource watch reports an event whose
// revision is not above the last one's (out of order, or a duplicate),
// and goes on counting events.
func TestResourceWatchOrderChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		revs [][]int64 // the revisions of each response's events
		want string    // in the first error; "" for none
	}{
		{"in order", [][]int64{{5, 6}, {9}, {10, 12}}, ""},
		{"duplicate", [][]int64{{5, 6}, {6}}, "event for /registry/pods/6 at revision 6 after one at revision 6"},
		{"back within a response", [][]int64{{5, 7, 6, 8}}, "at revision 6 after one at revision 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wch := make(chan clientv3.WatchResponse, len(tc.revs))
			total := 0
			for _, revs := range tc.revs {
				var wr clientv3.WatchResponse
				for _, rev := range revs {
					wr.Events = append(wr.Events, &clientv3.Event{Type: mvccpb.PUT,
						Kv: &mvccpb.KeyValue{Key: fmt.Appendf(nil, "/registry/pods/%d", rev), ModRevision: rev}})
				}
				total += len(revs)
				wch <- wr
			}
			close(wch)
			// The benchmark's end closes a watch (a closed channel with the
			// context still live is a failure of its own).
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			rw := &resourceWatches{}
			rw.wg.Add(1)
			rw.read(ctx, "/registry/pods/", "n1", wch)
			if got := rw.events.Load(); got != int64(total) {
				t.Errorf("%d events counted, want %d", got, total)
			}
			switch {
			case tc.want == "" && rw.firstErr != nil:
				t.Fatalf("error %v for events in order", rw.firstErr)
			case tc.want != "" && (rw.firstErr == nil || !strings.Contains(rw.firstErr.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", rw.firstErr, tc.want)
			}
		})
	}
}
