// Command etcdref runs an etcd 3.7 member (alone, or one of a cluster
// given with --initial-cluster) built from
// go.etcd.io/etcd/server/v3/embed, the code the real etcd binary runs, so
// that brain can be benchmarked against the reference on the same machine
// without downloading etcd. Every setting not exposed as a flag keeps
// etcd's default (fsync on, default snapshot count, no auto-compaction);
// it logs at warn level to stderr and runs until SIGINT or SIGTERM.
//
// It is a module of its own, pinned to the newest etcd (3.7.3), the
// reference brain's benchmarks compare with; the main module's tests
// compare responses with etcd 3.6's embed (internal/testutil). Build it
// from its directory: cd cmd/etcdref && go build .
package main
