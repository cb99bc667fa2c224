package engine

import (
	"bytes"
	"math/rand"
	"sort"
	"testing"
)

func TestEncodeKeyRoundTripAndOrder(t *testing.T) {
	seed := rand.Int63()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	alphabet := []byte{0x00, 0x01, 0xFE, 0xFF, 'a', '/'}
	var keys [][]byte
	keys = append(keys, []byte{}, []byte{0}, []byte{0, 0}, []byte{0xFF}, []byte{0, 0xFF})
	for i := 0; i < 2000; i++ {
		k := make([]byte, rng.Intn(6))
		for j := range k {
			k[j] = alphabet[rng.Intn(len(alphabet))]
		}
		keys = append(keys, k)
	}
	for _, k := range keys {
		enc := AppendKey(nil, k)
		if len(enc) != EncodedLen(k) {
			t.Fatalf("EncodedLen(%x)=%d, encoding has %d bytes", k, EncodedLen(k), len(enc))
		}
		dec, rest, err := DecodeKey(nil, append(enc, 0xAB))
		if err != nil || !bytes.Equal(dec, k) || !bytes.Equal(rest, []byte{0xAB}) {
			t.Fatalf("round trip %x: got %x rest %x err %v", k, dec, rest, err)
		}
	}
	// Order of encodings (with arbitrary suffixes) follows the order of keys.
	sort.Slice(keys, func(i, j int) bool { return bytes.Compare(keys[i], keys[j]) < 0 })
	for i := 1; i < len(keys); i++ {
		a := append(AppendKey(nil, keys[i-1]), 0xFF, 0xFF)
		b := append(AppendKey(nil, keys[i]), 0x00)
		c := bytes.Compare(keys[i-1], keys[i])
		if c == 0 {
			continue
		}
		if bytes.Compare(a, b) >= 0 {
			t.Fatalf("order broken: %x < %x but %x >= %x", keys[i-1], keys[i], a, b)
		}
	}
}

func TestDecodeKeyCorrupt(t *testing.T) {
	for _, b := range [][]byte{{}, {'a'}, {0x00}, {0x00, 0x05}, {'a', 0x00, 0x02}} {
		if _, _, err := DecodeKey(nil, b); err == nil {
			t.Fatalf("DecodeKey(%x): want error", b)
		}
	}
}

func TestPrefixEnd(t *testing.T) {
	cases := []struct{ in, want []byte }{
		{[]byte("a"), []byte("b")},
		{[]byte{'a', 0xFF}, []byte("b")},
		{[]byte{0xFF, 0xFF}, nil},
	}
	for _, c := range cases {
		if got := PrefixEnd(c.in); !bytes.Equal(got, c.want) {
			t.Fatalf("PrefixEnd(%x)=%x want %x", c.in, got, c.want)
		}
	}
}
