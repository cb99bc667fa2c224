// Package bugs injects known bugs into a brainnode built with the
// chaosbugs build tag, so the chaos checkers can show they catch them
// (a checker that never fails proves nothing). The bug is chosen at start
// with BRAIN_INJECT_BUG. Without the tag, On is a constant false and the
// injection points compile away.
//
// Bugs:
//   - skip-watch-event: the watch hub drops one revision's events from
//     every watch on the node (revision divisible by 50).
//   - stale-read: linearizable reads are served at the revision this node
//     last heard of, without confirming it with the TSO or waiting for the
//     partitions to close it.
//   - reuse-revision: a new TSO leader starts two windows below the
//     window it inherits, issuing revisions again.
//   - write-below-closed: partitions apply writes at or below their closed
//     revision instead of rejecting them, and a leader proposes writes with
//     a closed revision one above their own.
//   - lease-keeps-key: a lease's expiry leaves one of its keys.
package bugs
