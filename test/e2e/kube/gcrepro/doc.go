// Command gcrepro reproduces, without Kubernetes, the brain bug the
// end-to-end run found: a replica's compaction garbage collection fails
// forever with "partition: corrupt mvcc record" because the leader's
// cmdPurge (index keys of deleted keys, through the log) applied there before
// that replica's own background GC deleted the keys' versions.
//
//	go build -o /tmp/brainnode ./cmd/brainnode
//	go run ./test/e2e/kube/gcrepro /tmp/brainnode "$(mktemp -d)" kill|nokill|none
//
// It starts 3 nodes on ports 31379-33380, puts and deletes 20 keys three
// times with a compaction after each round (stopping n1 after the first
// round - kill -9 or SIGINT - and restarting it after the second; "none"
// stops nothing) and prints how many GC errors each node logged. With a
// restart n1 fails every time; without one, a follower sometimes does.
package main
