package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
)

// Namespace prefixes. See the package documentation for the layout.
const (
	RaftPrefix  byte = 0x01
	GroupPrefix byte = 0x02
	MVCCPrefix  byte = 0x10
	EventPrefix byte = 0x11
	LeasePrefix byte = 0x12
)

const (
	escape    byte = 0x00
	escaped00 byte = 0xFF
	term      byte = 0x01
)

// ErrCorruptKey reports a key that does not decode.
var ErrCorruptKey = errors.New("engine: corrupt key")

// AppendKey appends the order-preserving, prefix-free encoding of key to dst.
func AppendKey(dst, key []byte) []byte {
	for {
		i := bytes.IndexByte(key, escape)
		if i < 0 {
			dst = append(dst, key...)
			break
		}
		dst = append(dst, key[:i]...)
		dst = append(dst, escape, escaped00)
		key = key[i+1:]
	}
	return append(dst, escape, term)
}

// EncodedLen returns the length of the encoding of key.
func EncodedLen(key []byte) int {
	return len(key) + bytes.Count(key, []byte{escape}) + 2
}

// DecodeKey decodes one encoded key from the front of b, appending the user
// key to dst. It returns the user key and the remainder of b.
func DecodeKey(dst, b []byte) (key, rest []byte, err error) {
	for {
		i := bytes.IndexByte(b, escape)
		if i < 0 || i+1 >= len(b) {
			return nil, nil, ErrCorruptKey
		}
		dst = append(dst, b[:i]...)
		switch b[i+1] {
		case term:
			if dst == nil {
				dst = []byte{}
			}
			return dst, b[i+2:], nil
		case escaped00:
			dst = append(dst, 0)
			b = b[i+2:]
		default:
			return nil, nil, ErrCorruptKey
		}
	}
}

// PrefixEnd returns the smallest key greater than every key with the given
// prefix, or nil if there is none (the prefix is all 0xFF).
func PrefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xFF {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// PutUint64 appends v big-endian.
func PutUint64(dst []byte, v uint64) []byte {
	return binary.BigEndian.AppendUint64(dst, v)
}

// GroupKey returns GroupPrefix + BE64(group) + suffix.
func GroupKey(group uint64, suffix string) []byte {
	k := make([]byte, 0, 9+len(suffix))
	k = append(k, GroupPrefix)
	k = PutUint64(k, group)
	return append(k, suffix...)
}
