// Package etcdcompat serves etcd's v3 gRPC API (KV, Watch, Lease,
// Maintenance, Cluster, Auth status and gRPC health) over a kvapi.Store.
//
// Requests are checked exactly as etcd's v3rpc layer checks them (empty
// keys, sort options, txn op counts, duplicate keys in a txn, request size)
// and internal errors are mapped, through one table (errors.go), to the
// gRPC codes and messages of etcd's rpctypes, because etcd clients and
// kube-apiserver match on them.
//
// # Watches
//
// The Hub (hub.go) merges the partitions' event feeds into one stream in
// revision order, releasing events once every partition has closed past
// them, so a watch over several partitions is ordered, atomic per revision,
// and without gaps. Each Watch stream (watch.go) has one send loop that owns
// its watchers, each a cursor into the hub's ring (or, when behind it, into
// the event logs). Event bytes are encoded once per revision and watch
// shape (hub.go, encodeEvents) and spliced into each watcher's response
// (watch.go, sendEvents; frame buffers in framebuf.go), so identical
// watches share the encoding work.
//
// # Leaders
//
// A request or stream with etcd's require-leader metadata (every
// kube-apiserver watch) is refused, and an open one cancelled, with
// "etcdserver: no leader" only once the node has had no leader for 3
// election timeouts (leader.go), as etcd's monitorLeader does: etcd's
// client gives such a watch up for good and kube-apiserver re-lists, so an
// election, a planned transfer or another node's restart must never end
// it. Close ends every open stream with "etcdserver: server stopped",
// which clients answer by resuming elsewhere.
//
// Progress: RequestProgress is answered (watch ID -1, as etcd) once every
// watcher of the stream has been sent everything up to the revision current
// when the request arrived; the answer's revision is a bookmark: every event
// at or below it was delivered.
package etcdcompat
