package server

import "testing"

// TestGossipAdvertiseAddr: gossip advertises the peer URL's IP, or what its
// host name resolves to, never the wildcard.
func TestGossipAdvertiseAddr(t *testing.T) {
	for host, want := range map[string]string{
		"10.1.2.3":             "10.1.2.3",
		"0.0.0.0":              "",
		"::":                   "",
		"localhost":            "127.0.0.1",
		"no-such-host.invalid": "",
		"127.0.0.1":            "127.0.0.1",
	} {
		if got := gossipAdvertiseAddr(host); got != want {
			t.Errorf("gossipAdvertiseAddr(%q) = %q, want %q", host, got, want)
		}
	}
}
