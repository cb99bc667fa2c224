// Command brainnode runs a brain node: an etcd-compatible metadata store
// for Kubernetes. Run without flags it serves a single-node store on
// 127.0.0.1:2379 with its data in ./default.brain, ready for etcdctl.
package main
