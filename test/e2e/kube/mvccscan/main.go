package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"

	"github.com/brainkv/brain/engine"
	"github.com/cockroachdb/pebble/v2"
)

func main() {
	db, err := pebble.Open(os.Args[1], &pebble.Options{ReadOnly: true})
	if err != nil {
		panic(err)
	}
	defer db.Close()
	it, _ := db.NewIter(&pebble.IterOptions{LowerBound: []byte{engine.MVCCPrefix}, UpperBound: []byte{engine.MVCCPrefix + 1}})
	defer it.Close()
	var prefix []byte
	n, bad := 0, 0
	for it.First(); it.Valid(); it.Next() {
		n++
		k := it.Key()
		if len(k) < 11 {
			fmt.Printf("short key %x\n", k)
			bad++
			continue
		}
		pre, suf := k[:len(k)-8], binary.BigEndian.Uint64(k[len(k)-8:])
		uk, _, _ := engine.DecodeKey(nil, pre[1:])
		if suf == 0 {
			prefix = append(prefix[:0], pre...)
			if len(os.Args) > 2 {
				fmt.Printf("index %q (%d bytes)\n", uk, len(it.Value()))
			}
			continue
		}
		rev := int64(^suf)
		if !bytes.Equal(pre, prefix) {
			bad++
			pk, _, _ := engine.DecodeKey(nil, append([]byte(nil), prefix...)[min(1, len(prefix)):])
			fmt.Printf("ORPHAN version %q rev %d (previous index key %q)\n", uk, rev, pk)
			continue
		}
		if len(os.Args) > 2 {
			fmt.Printf("  version %q rev %d (%d bytes)\n", uk, rev, len(it.Value()))
		}
	}
	fmt.Printf("%d mvcc keys, %d bad\n", n, bad)
}
