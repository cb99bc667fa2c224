// Package testutil starts brain nodes and reference etcd servers for tests.
package testutil
