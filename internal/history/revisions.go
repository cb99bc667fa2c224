package history

import (
	"fmt"
	"sort"
)

// CheckRevisions checks the cross-key revision properties: unique write
// revisions, and revisions that respect real time (an operation that starts
// after a write is acknowledged sees at least its revision; a write that
// starts after it gets a higher one).
func CheckRevisions(ops []Op) []error {
	var errs []error
	seen := map[int64]Op{}
	var writes []Op
	for _, op := range ops {
		if !op.IsWrite() {
			continue
		}
		if prev, ok := seen[op.Out.Rev]; ok {
			errs = append(errs, fmt.Errorf("revision %d acknowledged twice: %v%s and %v%s", op.Out.Rev, prev.In, from(prev), op.In, from(op)))
		}
		seen[op.Out.Rev] = op
		writes = append(writes, op)
	}
	sort.Slice(writes, func(i, j int) bool { return writes[i].Return < writes[j].Return })
	acked := make([]Op, 0, len(ops))
	for _, op := range ops {
		if !op.Out.Unknown {
			acked = append(acked, op)
		}
	}
	sort.Slice(acked, func(i, j int) bool { return acked[i].Call < acked[j].Call })
	// Sweep by call time, tracking the highest write revision acknowledged
	// before each call.
	var maxRev int64
	var maxOp Op
	w := 0
	for _, op := range acked {
		for w < len(writes) && writes[w].Return < op.Call {
			if writes[w].Out.Rev > maxRev {
				maxRev, maxOp = writes[w].Out.Rev, writes[w]
			}
			w++
		}
		switch {
		case op.IsWrite() && op.Out.Rev <= maxRev:
			errs = append(errs, fmt.Errorf("write %v%s got revision %d, not above revision %d of %v%s acknowledged before it started", op.In, from(op), op.Out.Rev, maxRev, maxOp.In, from(maxOp)))
		case op.Out.Rev < maxRev:
			errs = append(errs, fmt.Errorf("%v%s saw header revision %d, below revision %d of %v%s acknowledged before it started", op.In, from(op), op.Out.Rev, maxRev, maxOp.In, from(maxOp)))
		}
		if len(errs) > 20 {
			break
		}
	}
	return errs
}

// from names the member that answered op, if known.
func from(op Op) string {
	if op.Out.Member == 0 {
		return ""
	}
	return fmt.Sprintf(" (answered by member %x)", op.Out.Member)
}
