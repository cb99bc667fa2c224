package etcdcompat

import (
	"math/bits"
	"sync"
)

// A watch frame collects a delivery's pre-encoded events in a buffer, and
// sendEvents copies the frame out of it into the response. A busy watch's
// frames run to hundreds of KiB (a Kubernetes cluster's events of a tenth
// of a second), and a buffer grown for each by append, doubling from
// empty, cost the node serving the watch 7% of its CPU in a 6-node
// scaling benchmark (bench/JOURNAL.md), most of it zeroing and faulting
// in freshly allocated memory. A buffer kept per stream would hold that
// memory for every idle stream too. So frame
// buffers come from pools by power-of-two size, shared by every stream of
// the process, and go back when the delivery ends: memory follows the
// deliveries under way, not the streams.

const (
	minFrameBufShift = 12 // 4 KiB
	// maxFrameBufShift is the largest pooled size, 2 MiB: a full frame
	// (maxFrameBytes) and the revision that did not fit. A larger buffer
	// (one revision's events over it) is allocated and dropped.
	maxFrameBufShift = 21
)

var frameBufPools [maxFrameBufShift - minFrameBufShift + 1]sync.Pool

// getFrameBuf returns an empty buffer with room for at least n bytes.
func getFrameBuf(n int) *[]byte {
	shift := minFrameBufShift
	if n > 1<<minFrameBufShift {
		shift = bits.Len(uint(n - 1))
	}
	if shift > maxFrameBufShift {
		b := make([]byte, 0, n)
		return &b
	}
	if p, ok := frameBufPools[shift-minFrameBufShift].Get().(*[]byte); ok {
		return p
	}
	b := make([]byte, 0, 1<<shift)
	return &b
}

// putFrameBuf gives p back to its pool (one of no pooled size is dropped).
// The caller keeps no reference to the buffer.
func putFrameBuf(p *[]byte) {
	c := cap(*p)
	shift := bits.Len(uint(c)) - 1
	if c != 1<<shift || shift < minFrameBufShift || shift > maxFrameBufShift {
		return
	}
	*p = (*p)[:0]
	frameBufPools[shift-minFrameBufShift].Put(p)
}
