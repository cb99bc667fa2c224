// Package freeport picks loopback ports for test and chaos clusters.
//
// A port the kernel hands out for "127.0.0.1:0" comes from the ephemeral
// range, which is also where every outgoing connection's local port comes
// from: between picking such a port and a node binding it, a client
// connection of another test running in parallel can take it ("bind:
// address already in use"; CI failed that way). So ports are drawn at
// random below the ephemeral range (read from /proc on Linux) and checked
// by binding them, and one process never hands out a port twice.
package freeport
