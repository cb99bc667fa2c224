// Package diskfault injects disk faults into a node's Pebble filesystem for
// chaos runs: stalled syncs (a slow or hung disk), failed syncs (EIO, the
// fsyncgate case) and a full disk (ENOSPC on writes). It wraps the
// filesystem with Pebble's errorfs, so the faults hit exactly the calls
// Pebble makes (WAL and sstable writes and syncs).
//
// A node gets an Injector only when started with BRAIN_DISK_FAULTS=1 (see
// cmd/brainnode); the chaos harness then switches modes through
// POST /debug/diskfault?mode=off|stall|fail|full[&delay=2s]. Without the
// variable nothing is wrapped and the endpoint does not exist.
//
// brain is fail-stop on storage errors, like etcd: a failed write or sync
// of the raft log stops the process (the page cache's state after a failed
// fsync is unknown), and the node recovers from what reached the disk when
// it restarts.
package diskfault
