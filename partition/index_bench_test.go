package partition

import (
	"fmt"
	"testing"
)

// BenchmarkIndexedScanPoint reads one key's metadata through the key
// index, as a get or a write's compare does, in an index of 100000 keys
// shaped like Kubernetes'.
func BenchmarkIndexedScanPoint(b *testing.B) {
	x := newKeyIndex()
	const n = 100000
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("/registry/pods/ns-%d/pod-%d", i%100, i))
		x.set(string(keys[i]), meta{mod: int64(i + 1), create: int64(i + 1), version: 1})
	}
	ends := make([][]byte, n)
	for i, k := range keys {
		ends[i] = append(append([]byte(nil), k...), 0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		j := i * 7919 % n
		kvs, count, err := x.indexedScan(nil, keys[j], ends[j], scanOptions{rev: n, keysOnly: true})
		if err != nil || count != 1 || len(kvs) != 1 {
			b.Fatalf("key %d: %d kvs, count %d, %v", j, len(kvs), count, err)
		}
	}
}
