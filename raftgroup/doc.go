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
//  2. Apply the committed entries of all those Readys (durable since an
//     earlier round) into ONE Pebble batch, with each group's applied index.
//  3. Add the new entries and hard state of all the Readys to the same
//     batch and commit it once, with a single sync if any Ready requires
//     one. Concurrent rounds on other workers share Pebble's group commit.
//     State changes and the hard state covering them commit atomically.
//  4. Run the state machines' post-commit hooks (publishing events, waking
//     readers), then wake proposers.
//  5. Hand outbound messages to the Transport, batched per destination
//     (after the sync, as raft requires for votes and append responses).
//     The gRPC transport's sender for a destination yields once when it
//     is woken, so the rounds of every worker ready to finish one leave
//     in one Send (grpc.go).
//  6. Advance each RawNode; reschedule groups that still have work.
//
// The raft clock is one ticker for every group. Its goroutine yields
// before it ticks, so a tick reaches the groups after the goroutines
// already runnable, among them the readers of peers' batches that
// arrived before it: on a node with more work than CPU, a timer's
// goroutine would otherwise run at once while the network's input waits,
// and leaders would find "no quorum active" with their followers'
// answers unread. The clock slows as the node does.
//
// # Elections
//
// Raft runs with PreVote and CheckQuorum, so a replica that campaigns
// while its peers hear a leader changes nothing. Two shortcuts use that.
// When a peer's connection breaks (its process died), every group that
// follows it forgets it (raft's ForgetLeader) and moves close to its
// election timeout (Host.PeerLost, Group.LeaderLost): the followers of a
// killed leader elect a new one within a few ticks plus raft's
// randomisation instead of a whole election timeout. A restarted node does
// the same for its leaderless groups once a peer is reachable
// (Group.AdvanceElection; etcd's initial election tick advance).
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
// A leader that loses leadership fails its waiting proposers with
// ErrLeaderChanged (the command may or may not apply), except those of
// Group.ProposeAsyncFate: they keep waiting, as a follower, for the entries
// that settle it. The command applies (a later leader committed it), or an
// entry of a later term applies first and it never will (ErrNotLeader, so
// the caller may retry it elsewhere). Only if neither happens within two
// election timeouts, or a snapshot skips past it, is the answer
// ErrLeaderChanged.
//
// # Storage
//
// Each group's log lives in Pebble under engine.RaftPrefix and is mirrored in
// a raft.MemoryStorage for the entries not yet truncated. A new group starts
// from a synthetic truncated state at index InitialIndex with its initial
// voters, so every replica of a group starts from the same log position.
package raftgroup
