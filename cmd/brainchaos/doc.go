// Command brainchaos runs a chaos run (package chaos) against a cluster of
// brainnode processes on this machine and exits non-zero on any violation.
//
//	go run ./cmd/brainchaos --duration 5m --seed 42
package main
