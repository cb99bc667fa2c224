package main

import (
	"math"
	"math/bits"
	"time"
)

// subBits is the number of mantissa bits a histogram bucket keeps: each
// power of two is split into 2^subBits buckets, so a recorded value is
// known to within 1/2^subBits (under 1.6%) of its true value.
const subBits = 6

const (
	subCount   = 1 << subBits
	numBuckets = (64 - subBits + 1) * subCount
)

// Histogram records durations in log-linear buckets, in the style of an
// HDR histogram: constant memory, constant-time recording, mergeable, and
// percentiles accurate to within 1/2^subBits. Values below 2^subBits ns
// are exact. The zero value is ready to use; it is not safe for
// concurrent use.
type Histogram struct {
	counts [numBuckets]uint64
	n      uint64
	sum    float64
	min    int64
	max    int64
}

// bucketOf returns the bucket index of v (v >= 0).
func bucketOf(v int64) int {
	u := uint64(v)
	if u < subCount {
		return int(u)
	}
	shift := bits.Len64(u) - subBits - 1
	mantissa := u >> uint(shift) // in [subCount, 2*subCount)
	return (shift+1)*subCount + int(mantissa-subCount)
}

// bucketHigh returns the largest value that falls into bucket i.
func bucketHigh(i int) int64 {
	if i < subCount {
		return int64(i)
	}
	shift := i/subCount - 1
	mantissa := uint64(i%subCount + subCount)
	high := (mantissa+1)<<uint(shift) - 1
	if high > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(high)
}

// Record adds one sample. Negative durations (clock skew) count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := max(int64(d), 0)
	h.counts[bucketOf(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

// Merge adds all samples of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// Count returns the number of samples.
func (h *Histogram) Count() uint64 { return h.n }

// Max returns the largest sample, exactly.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean returns the average sample.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Percentile returns the smallest recorded value v such that at least a
// fraction q (0..1) of the samples are <= v, rounded up to its bucket's
// upper bound and clamped to the exact minimum and maximum.
func (h *Histogram) Percentile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	target := uint64(math.Ceil(q * float64(h.n)))
	target = min(max(target, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= target {
			v := min(max(bucketHigh(i), h.min), h.max)
			return time.Duration(v)
		}
	}
	return time.Duration(h.max)
}
