// Package engine owns the node's single Pebble instance and the layout of
// its keyspace.
//
// Every replica on a node (raft groups of partitions, the TSO and the meta
// group) shares one Pebble. Sharing is what lets the raft log writes of many
// groups ride one WAL sync, and what lets a split hand a
// key range to a new group without copying data.
//
// Values of user data of 256 bytes or more (Kubernetes objects) are
// separated into blob files at a flush, and compactions carry a reference
// to them instead of rewriting them (separation.go); the raft logs and the
// groups' state stay in the sstables.
//
// Pebble's sstable writes are gathered into 256 KiB calls (bufferedfs.go):
// Pebble writes a flush or a compaction in ~4 KiB calls, one system call
// per block, on nodes whose CPU share system calls quickly use up.
//
// Opening the store fails, rather than hangs, when flushing the replayed
// write-ahead log fails (a full disk): Pebble retries that flush for ever
// (engine.go, openOrFail); the failed flush's files are removed.
//
// # Keyspace
//
// The first byte of every key is a namespace:
//
//	0x01 RaftPrefix   raft logs, hard state, truncation and conf state,
//	                  keyed by group ID (owned by package raftgroup)
//	0x02 GroupPrefix  per-group replicated state machine state (applied
//	                  index, closed revision, TSO window, meta tables)
//	0x10 MVCCPrefix   user data: EncodeKey(K) + BE64(0) is K's index key,
//	                  EncodeKey(K) + BE64(^rev) holds the version at rev
//	0x11 EventPrefix  each partition's event log: group ID + BE64(rev)
//	0x12 LeasePrefix  lease ID + EncodeKey(K): keys attached to a lease
//
// # Key encoding
//
// EncodeKey is order-preserving and prefix-free for arbitrary byte strings:
// 0x00 is escaped as 0x00 0xFF and the key ends with 0x00 0x01 (the
// CockroachDB bytes encoding). Because no encoded key is a prefix of another,
// any suffix can follow it without disturbing the order of user keys, so
// all internal keys of one user key are contiguous and ordered by suffix.
package engine
