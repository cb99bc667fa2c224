// Package raftgroup hosts many go.etcd.io/raft groups on one node.
//
// A Host owns every replica on the node. It drives each group's RawNode from
// a small fixed pool of workers rather than a goroutine per group: a group
// with work (a proposal, an inbound message, a tick) is put on the
// scheduler's queue, and a worker takes up to MaxGroupsPerRound queued groups
// at once and processes them together as one round:
//
//  1. Drain each group's inbox (ticks, messages, proposals) into its RawNode
//     and collect a Ready from every group that has one.
//  2. Write the entries and hard state of all those Readys into ONE Pebble
//     batch and commit it with a single sync (if any Ready requires one).
//     Concurrent rounds on other workers share Pebble's group commit too.
//  3. Hand outbound messages to the Transport, batched per destination.
//  4. Apply the committed entries of all groups into ONE indexed Pebble
//     batch, together with each group's applied index, and commit it
//     without a sync: the raft log already holds the entries durably, and
//     the WAL orders the apply batch after the log writes it depends on.
//  5. After the apply batch commits, run the state machines' post-commit
//     hooks (publishing events, waking readers) and wake proposers.
//  6. Advance each RawNode; reschedule groups that still have work.
//
// # State machines
//
// A group's StateMachine applies one committed command at a time. Apply
// must be deterministic (a pure function of the state visible in the apply
// batch and the entry), so every replica reaches the same state; a command
// that must not take effect is rejected by returning a result saying so,
// never by returning an error. A failure to write is not a rejection: it
// stops the node.
//
// # Proposals
//
// Group.Propose wraps a command in an entry header carrying a proposal ID
// unique to this process and waits until the entry is applied (or fails).
// Proposal forwarding is disabled: only the leader proposes, and the
// state machine can stamp a command with the leader's term and reject it at
// apply when the entry's term differs (see partition).
//
// # Storage
//
// Each group's log lives in Pebble under engine.RaftPrefix and is mirrored in
// a raft.MemoryStorage for the entries not yet truncated. A new group starts
// from a synthetic truncated state at index InitialIndex with its initial
// voters, so every replica of a group starts from the same log position.
package raftgroup
