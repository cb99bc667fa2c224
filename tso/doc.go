// Package tso is the revision oracle: the one source of the global revision
// every write carries.
//
// The oracle is its own raft group. Its replicated state is one number, the
// window end W: no revision above W has ever been issued. The leader hands
// out revisions from memory, strictly increasing, and extends W through the
// raft log (a batch of WindowSize at a time, before it runs out) so that
// issuing a revision costs no disk write; concurrent callers share each
// extension. A leader that takes over (or a node that restarts) resumes at
// W+1, which is above anything its predecessor can have issued. A crash
// therefore leaves a gap of at most one window; a graceful Close first
// shrinks W to the last issued revision so that a clean restart continues
// densely.
//
// A fresh store's window end is 1: revision 1 is the empty initial state,
// as in etcd, and the first write gets revision 2.
//
// # Invariants
//
//   - Revisions issued by one leader are strictly increasing.
//   - Every revision ever issued is <= the applied W, and a new leader starts
//     above the W it applied before serving, so no revision is issued twice.
//   - Only writes that ask consume revisions: reads, failed compares and
//     internal bookkeeping never call Next.
//
// Real-time order across a leader change additionally needs the deposed
// leader to stop issuing before the new one starts; with one replica this is
// trivially true, and the cluster issue adds a leader lease.
package tso
