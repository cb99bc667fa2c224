package etcdcompat

import (
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// podCreate is revision rev's event in the scaling benchmark's shape: a
// create of a pod with a 1 KiB value.
func podCreate(rev int64) *mvccpb.Event {
	return &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: []byte(fmt.Sprintf("/registry/pods/default/pod-%08d", rev)),
		Value: make([]byte, 1024), CreateRevision: rev, ModRevision: rev, Version: 1}}
}

// BenchmarkDeliverFrames delivers frames of 300 revisions of 1 KiB
// values (a hot watch's frame of a few tenths of a second at the scaling
// benchmark's rates): the cost of collecting and sending them.
func BenchmarkDeliverFrames(b *testing.B) {
	const last = 300
	sws, w, rs := catchupStream(b, &flakySource{last: last, chunk: last, event: podCreate})
	rs.discard = true
	b.ReportAllocs()
	for b.Loop() {
		w.next = 1
		if err := sws.deliver(w, last); err != nil {
			b.Fatal(err)
		}
	}
}
