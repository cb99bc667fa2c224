// Command brainbench drives Kubernetes-shaped load against any etcd v3
// endpoint, brain or etcd, so that the two can be compared on the same
// machine with the same client.
//
// Each benchmark issues the requests kube-apiserver's etcd3 storage layer
// issues for one kind of call:
//
//   - create: Txn If(ModRevision(key) == 0) Then(Put) Else(Get) on keys
//     nobody wrote before.
//   - update: GuaranteedUpdate: Get the key, then Txn If(ModRevision(key) ==
//     the revision read) Then(Put) Else(Get), retrying with the returned
//     value on a lost compare (counted as a conflict). The key space is
//     populated first, untimed.
//   - put: plain Put of random keys of the key space.
//   - list: a paginated list: the first page at the current revision, the
//     following pages at the first page's revision starting just after the
//     previous page's last key, until More is false. One operation is one
//     full list of a populated prefix.
//   - watch: many watches with prev_kv on one prefix, each on its own gRPC
//     stream, under a steady write rate; each value starts with its write
//     time, so the delivery lag of every event is known. Every watcher must
//     get every successful write exactly once, in revision order, with the
//     key's previous version as prev_kv; otherwise the run fails.
//
// Workers (--clients) share --conns gRPC connections round-robin and run
// until --total operations are issued or --duration passes. Latency is
// measured per operation (for update, the get and every txn attempt
// together) and kept in a log-linear histogram; the reported percentiles
// are within 1.6% of the recorded values and the maximum is exact. Failed
// operations are counted, not retried, and make the command exit non-zero;
// after --max-errors failures a benchmark stops issuing operations, so that
// a dead endpoint does not cost --total timeouts.
//
// create, update and put can measure a steady state: with --total 0,
// --duration D and --measure-last W, the load runs for D and only the
// operations that end in its last W count towards throughput, latency and
// errors (the ones before and after are reported as unmeasured), so a
// store that adapts to the load (splits, leader moves) is measured once
// it has. --window-file creates a file when that window begins, for a
// script to sample the servers' own counters over the same window.
//
// Each benchmark writes under its own group of keys below --key-prefix
// (for example /registry/configmaps/bench/list-00000042), so that the
// benchmarks of one run do not see each other's keys; create and watch add
// a per-run token so that repeated runs against one store do not collide.
//
// The all command runs create, update, put and list in sequence; compare
// prints the ratios of two --json result files, as bench/compare.sh does
// for brain against the reference etcd (cmd/etcdref).
package main
