// Package meta is the cluster's metadata state machine, its own raft group:
// leases, the compaction revision and alarms.
//
// # Leases
//
// A lease's ID and TTL are replicated; its expiry is not. As in etcd, the
// leader keeps every lease's expiry in memory, renews it on keepalive, and
// on becoming leader gives every lease a fresh TTL. Revocation (by request or
// expiry) is a three-step protocol driven by the caller:
//
//  1. StartRevoke marks the lease revoking through the log. From then on
//     LeaseUsable is false: no put can attach the lease any more.
//  2. The caller deletes the keys attached to the lease in every partition
//     (partition.DeleteByLease waits for puts that attached it earlier).
//  3. FinishRevoke removes the lease.
//
// A lease left revoking by a crash is finished by the next leader
// (Revoking lists them).
//
// # Compaction
//
// The compaction revision is recorded here first; reads below it are
// refused cluster-wide from then on, and partitions collect garbage after.
//
// # Partition map
//
// The split records (splits.go), appended by the split partitions'
// leaders, and the allocator of new partition IDs. Nodes replay the records
// over the initial partitions to route.
package meta
