// Package kvapi routes etcd requests to the partitions that own their keys
// and combines their answers.
//
// A Store holds the node's partition map (key ranges in order), the TSO and
// the meta group. It implements the parts of etcd's semantics that span
// partitions:
//
//   - Range reads at one revision R on every partition the range overlaps
//     (after each has closed R), concatenates in key order, counts across
//     all of them, and post-processes exactly as etcd does (filters, sort,
//     limit, More). Linearizable reads use R = the TSO's current revision;
//     serializable reads use the lowest closed revision of the node's
//     replicas, raised to every revision the node answered with and to the
//     TSO's revision as of MaxStaleness ago (staleFloor), so they are
//     bounded-stale and never go back on one node.
//   - A txn that writes must stay within one partition; one whose keys span
//     several is refused with InvalidArgument. Read-only txns run on the
//     read path at one revision, over any partitions (readTxnAcross).
//   - DeleteRange over several partitions deletes each partition's part as
//     its own atomic write at its own revision (etcd would use one).
//   - Lease revocation deletes each partition's attached keys, one revision
//     per partition with keys.
//   - Watch catch-up merges the partitions' event logs by revision.
//
// Header revisions follow invariant 3 of docs/design.md: the TSO's current
// revision, never below any acknowledged write, also for reads at older
// revisions and for failed compares.
//
// Requests are routed by a routing table (the partition map, replaced by
// SetRoutes when partitions split); a partition that no longer covers
// what a request asks (ErrOutsideRange) makes the request run again with a
// newer table (Store.routed): the span plays the part of TiKV's region
// epoch. Store.Split splits a partition through its leader (split.go).
package kvapi
