// Package cluster is a node's view of the cluster's nodes: who they are,
// where to reach them, whether they are alive, and which raft groups each
// leads. hashicorp/memberlist gossips it; every node publishes its own
// entry (NodeInfo) as memberlist node metadata and updates it when its
// leaderships change.
//
// Gossip is a hint, never the truth about replicas: each raft group's
// configuration (its conf state, changed by conf changes) says which nodes
// hold its replicas. Gossip tells the gateway where a group's leader
// probably is (a wrong guess costs a retry with the leader the wrong node
// names) and tells a group's leader how long a peer has been unreachable,
// so it can replace the replicas of a dead node.
package cluster
