package engine

import (
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Value separation. Kubernetes objects are values of hundreds of bytes to
// tens of KiB under keys of under a hundred, and an LSM's compactions
// rewrite every byte of a level they merge: with values in the sstables,
// nearly all that work moves values that did not change. Pebble can write
// a flushed value of at least a minimum size to a blob file and keep only
// a reference in the sstable (the mechanism CockroachDB uses for its
// values); compactions then merge keys and references and carry the blob
// files along, and rewrite a blob file only when its references have
// scattered over too many files (blobReferenceDepth) or when enough of it
// is garbage (blobGarbageRatio, for files older than blobRewriteAge).
// Reads of a separated value take one more block lookup.
//
// Only user data is separated (MVCCPrefix and the namespaces after it).
// The raft logs and the groups' state below MVCCPrefix stay in place: a
// log entry is deleted by truncation soon after it is written, and moving
// it to a blob file would leave garbage behind that only a rewrite could
// reclaim.

// DefaultValueSeparationMinBytes is the smallest value separated by
// default: a Kubernetes object of any size worth mentioning (a Lease is
// about 300 bytes in protobuf, a Pod several KiB).
const DefaultValueSeparationMinBytes = 256

const (
	blobReferenceDepth = 10
	blobRewriteAge     = 15 * time.Minute
	blobGarbageRatio   = 0.2
)

// separateValues configures opts to separate values of at least minBytes
// (none if minBytes < 0) in the user data namespaces.
func separateValues(opts *pebble.Options, minBytes int) {
	if minBytes < 0 {
		return
	}
	policy := pebble.ValueSeparationPolicy{
		Enabled:               true,
		MinimumSize:           minBytes,
		MaxBlobReferenceDepth: blobReferenceDepth,
		RewriteMinimumAge:     blobRewriteAge,
		TargetGarbageRatio:    blobGarbageRatio,
	}
	opts.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy { return policy }
	opts.Experimental.SpanPolicyFunc = spanPolicy
}

// inPlaceEnd ends the namespaces whose values are never separated.
var inPlaceEnd = []byte{MVCCPrefix}

// spanPolicy keeps every value below MVCCPrefix in its sstable; from
// MVCCPrefix on, Pebble's value separation policy applies.
func spanPolicy(start []byte) (pebble.SpanPolicy, []byte, error) {
	if len(start) == 0 || start[0] < MVCCPrefix {
		return pebble.SpanPolicy{ValueStoragePolicy: pebble.ValueStorageLowReadLatency}, inPlaceEnd, nil
	}
	return pebble.SpanPolicy{}, nil, nil
}
