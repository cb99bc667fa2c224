// Package migrate moves an etcd store to brain.
//
// etcd keeps its MVCC history in a bbolt file: the "key" bucket maps a
// revision (8-byte main revision, '_', 8-byte sub revision, and a 't' mark
// on deletions) to the mvccpb.KeyValue written at it, the "lease" bucket
// holds the leases, and the "meta" bucket the compaction revision. A
// snapshot file (etcdctl snapshot save, or the Maintenance.Snapshot stream
// of a live member) is that file with a SHA-256 checksum appended.
//
// FromEtcdSnapshot converts such a file into a brain backup (package
// snapshot) holding every version etcd kept: the same revisions, create
// revisions, versions, values and lease IDs, and the same compaction
// revision. Restored (brainnode snapshot restore, or brainnode migrate,
// which does both), the store continues revisions after etcd's last one,
// so a watcher that was reading etcd at revision R resumes on brain from
// R+1 and misses nothing, and every resourceVersion a Kubernetes client
// holds stays valid.
//
// etcd's sub revisions (the writes of one transaction share a main
// revision) map onto brain's: a transaction's writes share one revision.
// Writes made to etcd after the snapshot are not carried over; stop the
// writers (kube-apiserver) before the copy.
package migrate
