// Package history records what clients asked of an etcd-compatible store
// and what they saw, and checks it:
//
//   - Linearizability (porcupine) of single-key registers with get, put,
//     compare-and-swap on mod_revision (as kube-apiserver updates) and
//     delete. An operation whose outcome is unknown (timeout, connection
//     error) may or may not have taken effect, and its revision is unknown
//     (etcd's robustness suite models failures the same way).
//   - Revisions across keys: every acknowledged write has a unique revision;
//     an operation that starts after a write was acknowledged sees a header
//     revision at least as high, and a write that starts after it gets a
//     higher revision.
//   - Watches: each watch's events are ordered, unique, atomic per revision
//     and equal, event for event (including prev_kv), to the store's history
//     restricted to the watch's range and start; every acknowledged write in
//     its range is delivered; a progress notification at R comes after every
//     event at or below R.
//
// The store's history itself is the stream of a reference watch over the
// whole keyspace; it must contain every acknowledged write, with the value
// written, and nothing that was never attempted.
package history
