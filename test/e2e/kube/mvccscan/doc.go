// Command mvccscan is a diagnostic for the end-to-end run: it scans a
// stopped brainnode's Pebble (read-only) and prints MVCC version keys whose
// index key is missing, the state that makes brain's compaction garbage
// collection fail with "partition: corrupt mvcc record". A second argument
// prints every index and version key.
//
//	go run ./test/e2e/kube/mvccscan test/e2e/kube/.work/v1.36.3/n1.brain/pebble
package main
