// Package server is one brain node: it opens the node's Pebble store and
// raft host, creates the TSO, meta and partition replicas it holds, and
// serves the etcd API (etcdcompat), the internal peer API (kvapi), the
// operator API (/brain/v1/...), health and metrics.
//
// Files:
//
//	server.go      opening, serving and stopping a node
//	config.go      the configuration and its flags' defaults and checks
//	identity.go    the persisted member identity (ID, cluster, members)
//	membership.go  gossip (cluster package) and the identity of a new store
//	members.go     etcd's MemberList/Add/Remove and --join
//	placement.go   initial placement, preferred leaders, leader balancing
//	rebalance.go   moving replicas to the placement over current members
//	replicas.go    this node's replicas over time: added, removed, repaired
//	move.go        manual replica moves (brainnode move-replica)
//	splits.go      the partition map, split partitions' replicas, automatic splits
//	loadbalance.go moving leaderships by write load; splits for balance, within
//	               the voters and across placements
//	admin.go       the operator API (status, transfer-leader, move-replica, split)
//	maintenance.go etcd's Maintenance service (status, hash, snapshot)
//	restore.go     restoring a backup into a new data directory
//	quota.go       the backend quota and its NOSPACE alarm
//	tls.go         client and peer TLS
//	ballast.go     the emergency ballast that lets a node start on a full disk
//
// # Starting and stopping
//
// A node binds its client listeners before it opens its store and serves
// the etcd API only once it is ready (it knows its meta leader and the TSO
// answers), as etcd serves clients only once its member is ready; until
// then clients wait in their connections. A restarted member advances its
// groups' elections once a peer is reachable (etcd's initial election tick
// advance). A clean stop ends client streams, hands leaderships off, and
// flushes the memtables so that the next start replays no log.
//
// Raft is the truth for each group's replicas; gossip carries addresses,
// liveness and leader hints.
package server
