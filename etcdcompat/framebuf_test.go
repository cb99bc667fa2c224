package etcdcompat

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

func TestFrameBufSizes(t *testing.T) {
	for _, c := range []struct{ n, cap int }{
		{0, 4 << 10}, {1, 4 << 10}, {4 << 10, 4 << 10}, {4<<10 + 1, 8 << 10},
		{300 << 10, 512 << 10}, {2 << 20, 2 << 20}, {2<<20 + 1, 2<<20 + 1},
	} {
		p := getFrameBuf(c.n)
		if len(*p) != 0 || cap(*p) != c.cap {
			t.Errorf("getFrameBuf(%d): len %d cap %d, want 0 and %d", c.n, len(*p), cap(*p), c.cap)
		}
		*p = append(*p, "dirty"...)
		putFrameBuf(p)
		if q := getFrameBuf(c.n); len(*q) != 0 || cap(*q) < c.n {
			t.Errorf("getFrameBuf(%d) after a put: len %d cap %d", c.n, len(*q), cap(*q))
		}
	}
}

// bigValue is revision rev's value in TestFramesShareBuffersSafely:
// large, of varying size (up to 64 KiB), filled with the revision.
func bigValue(rev int64) []byte {
	return bytes.Repeat([]byte{byte(rev)}, int(rev*7919%(64<<10))+1)
}

func bigPut(rev int64) *mvccpb.Event {
	return &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: []byte(fmt.Sprintf("k%d", rev)), Value: bigValue(rev), ModRevision: rev}}
}

// TestFramesShareBuffersSafely: streams delivering at once, their frames
// growing through the pooled sizes and past maxFrameBytes, each send every
// event once, in order, intact, with no frame of several revisions over
// maxFrameBytes, and deliver the same again with the buffers reused.
func TestFramesShareBuffersSafely(t *testing.T) {
	const last, streams = 120, 8
	var wg sync.WaitGroup
	recs := make([]*recordingStream, streams)
	for i := range recs {
		sws, w, rs := catchupStream(t, &flakySource{last: last, chunk: 10, event: bigPut})
		recs[i] = rs
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 2; round++ {
				w.next = 1
				if err := sws.deliver(w, last); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	for i, rs := range recs {
		var got []int64
		for _, r := range rs.resps {
			size := 0
			for _, e := range r.Events {
				rev := e.Kv.ModRevision
				got = append(got, rev)
				size += len(e.Kv.Value)
				if string(e.Kv.Key) != fmt.Sprintf("k%d", rev) || !bytes.Equal(e.Kv.Value, bigValue(rev)) {
					t.Fatalf("stream %d: revision %d arrived as key %q with a %d-byte value, not its own", i, rev, e.Kv.Key, len(e.Kv.Value))
				}
			}
			if len(r.Events) > 1 && size > maxFrameBytes {
				t.Errorf("stream %d: a response of %d revisions carries %d bytes of values, over %d", i, len(r.Events), size, maxFrameBytes)
			}
		}
		if len(got) != 2*last {
			t.Fatalf("stream %d sent %d events, want %d", i, len(got), 2*last)
		}
		for j, rev := range got {
			if rev != int64(j%last+1) {
				t.Fatalf("stream %d sent revisions %v, want 1..%d twice", i, got, last)
			}
		}
	}
}
