// Package partition is the replicated state machine of one key range: the
// MVCC data of its keys in the node's Pebble, the write path of its leader,
// reads at a revision, its event feed, and compaction.
//
// # Writes
//
// Only the leader evaluates writes. A write (a put, a delete or a txn):
//
//  1. latches what it reads and writes (latch.go), so no other write to
//     those keys is between evaluation and apply;
//  2. evaluates as etcd would (eval.go). If nothing would change (a failed
//     compare, a delete of nothing) or a check refuses it, the answer is a
//     read: reads and failed compares consume no revision, and, since this
//     replica may be a leader deposed without knowing it (paused,
//     partitioned) whose state lacks its successor's writes, the answer is
//     evaluated again at the TSO's current revision once that is closed
//     here (a linearizable read); if that evaluation would write, the write
//     starts over;
//  3. registers as in flight with a lower bound, the TSO's current revision
//     (its revision will be above it), then asks the TSO for a revision;
//  4. re-evaluates at that revision and proposes the resulting mutations,
//     stamped with the leader's term and with the closed revision computed
//     at that moment, and leaves the in-flight set;
//  5. waits for apply, and releases its latches. It waits for the
//     command's fate even when its caller gave up: releasing the latches
//     while the command is in the log would let the next request on those
//     keys evaluate a state the command then changes (two creates of one
//     key would both succeed).
//
// # Closed revisions
//
// The closed revision C of a partition is the promise "no write with
// revision <= C will ever apply here". It travels through the raft log:
// every write command and every close command carries one, and apply
// rejects (deterministically, on every replica) a write whose revision is
// <= the closed revision already applied. The leader computes what it may
// promise as min(TSO current, lower bound of the oldest write in flight):
// writes in flight have revisions above their lower bounds, and writes that
// have not registered yet will get revisions above the TSO's current one.
// A new leader promises nothing new until it has applied its predecessor's
// log, and its own revisions come from the TSO after that, so it cannot
// break an earlier promise.
//
// Readers that need revision R closed call WaitClosed, which asks the leader
// for a close command if no write will carry one; at most one close command
// per partition is in flight, so idle partitions close promptly and cheaply.
//
// # Apply
//
// Apply (apply.go) is a pure function of the partition's state in the apply
// batch and the entry. It writes the index and version keys, the lease
// index and the event log record of each write in one batch, and after the
// batch commits publishes the revision's events (with prev_kv) and the new
// closed revision to the replica's feed subscriptions.
//
// # Feed subscriptions
//
// A Subscription (subscribe.go) delivers a replica's events from any
// revision not compacted: a catch-up from the event log in a Pebble
// snapshot, then live publishes, with no gap between them and at most a few
// duplicates, which consumers drop by revision. The watch hubs of every
// node consume them. A snapshot install or the replica's removal ends the
// subscriptions; subscribers resubscribe from the closed revision they
// hold.
//
// # Reads
//
// Reads at revision R wait until R is closed here and then read Pebble: the
// versions at or below a closed revision never change (compaction removes
// only versions no read may ask for). A read checks after reading that the
// span still covers what it was asked for, and answers ErrOutsideRange if
// a split shrank it meanwhile (spans only shrink), so the caller routes
// again.
//
// # Splits
//
// Split (split.go) cuts the span through the raft log: every replica
// applies it at the same index, and the new right-hand partition starts
// with the parent's closed revision, its keys' event records and raft
// bootstrap state, with no MVCC data moved. Writes outside the span are
// rejected at apply. A subscription carries the partition's split records
// (Subscription.Splits) and ends at a split, so a subscriber learns of the
// child before any closed revision above the split.
package partition
