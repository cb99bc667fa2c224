// Package peerconn keeps one gRPC connection to every peer node, shared by
// all node-to-node traffic: the raft transport's message and snapshot
// streams, internal calls (forwarded requests) and partition feeds.
//
// One connection per peer, rather than one per kind of traffic, lets
// gRPC's writer put frames of several kinds into one socket write: raft
// batches, forwarded requests and their answers that are ready together
// leave in one system call. On a node short of CPU the system calls are a
// large share of the cost of a write (they carry the network stack's
// work), and with more peers each connection carries less, so separate
// connections cost more per write the larger the cluster.
package peerconn
