package etcdcompat

import (
	"fmt"
	"testing"

	"github.com/brainkv/brain/partition"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// podSource serves revisions 1..last, one 1 KiB create each, as the
// scaling benchmark's pods.
type podSource struct{ flakySource }

func (s *podSource) Events(from, to int64, _, _ []byte, _ int) ([]partition.RevEvents, int64, error) {
	var out []partition.RevEvents
	rev := from
	for ; rev <= min(to, s.last) && rev < from+s.chunk; rev++ {
		out = append(out, partition.RevEvents{Rev: rev, Events: []*mvccpb.Event{{Kv: &mvccpb.KeyValue{
			Key: []byte(fmt.Sprintf("/registry/pods/default/pod-%08d", rev)), Value: make([]byte, 1024),
			CreateRevision: rev, ModRevision: rev, Version: 1}}}})
	}
	return out, rev, nil
}

// BenchmarkDeliverFrames delivers frames of 300 revisions of 1 KiB
// values (a hot watch's frame of a few tenths of a second at the scaling
// benchmark's rates): the cost of collecting and sending them.
func BenchmarkDeliverFrames(b *testing.B) {
	const last = 300
	src := &podSource{flakySource{last: last, chunk: last}}
	sws, w, rs := catchupStream(b, &src.flakySource)
	sws.s.hub.src = src
	rs.discard = true
	b.ReportAllocs()
	for b.Loop() {
		w.next = 1
		if err := sws.deliver(w, last); err != nil {
			b.Fatal(err)
		}
	}
}
