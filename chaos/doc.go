// Package chaos runs Jepsen-style fault runs against a real brain cluster
// of brainnode processes on loopback ports and checks the recorded history.
//
// A run starts a cluster, drives workloads from clients of every node
// (single-key registers with get/put/compare-and-swap/delete, kube-shaped
// creates, updates, deletes and prefix lists over many keys in every
// partition, long-lived watches that resume on another node when their
// stream breaks and ask for progress, and one watch per node through that
// node alone, as kubeadm's kube-apiservers watch), injects faults for a duration
// (FaultNames: kill -9, SIGSTOP, restart of every node, faults aimed at
// the TSO leader and at the node leading the most groups, and disk faults
// through the node's Pebble filesystem: stalled writes, failed syncs, a
// full disk; NetFaultNames with network namespaces), heals the cluster,
// and checks:
//   - linearizability with porcupine, failed and timed-out operations
//     modelled as unknown (as etcd's robustness suite does);
//   - revisions unique and respecting real time across keys;
//   - the reference watch (every key from revision 1) holds every
//     acknowledged write and only attempted values;
//   - every watch against the reference: ordered, unique, atomic, prev_kv
//     correct, bookmarks after what they cover, no gap across resumptions;
//   - every serializable read (a reader per node, through that node) is
//     the state of its key at its revision, at most MaxStaleness stale
//     outside faults, and never below an earlier answer of its node
//     (sreads.go);
//   - no watch (all are opened with etcd's require-leader metadata, as
//     kube-apiserver opens them) ends with "no leader" unless its node was
//     cut off, or the cluster lost its quorum, for 3 election timeouts
//     before (etcd's rule; noleader.go);
//   - every list equals the reference state of its prefix at its header
//     revision;
//   - lease expiry deletes exactly the attached keys;
//   - no node exited on its own except under a disk fault that may stop
//     it (brain is fail-stop on storage errors).
//
// It also measures what each fault cost the clients (availability.go): how
// long until a write and a read called after it succeeded on every
// partition, how long a client went from its first failure to its next
// success, and the failed operations. Config.System runs the same schedule
// against etcd's own server (etcdref), to compare.
//
// Every run is reproducible in its choices from its seed (the timing of a
// real cluster is not) and writes a report directory: summary.txt (one
// line), violations.txt, availability.txt, timeline.txt (the faults on the history's clock),
// history.json, lists.json, watches.json, the nodes' logs, and
// porcupine.html when the history is not linearizable.
//
// cmd/brainchaos is the command line.
package chaos
