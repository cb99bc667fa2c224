// Command composetest drives the failover scenario of deploy/cluster.sh
// test against the docker-compose cluster: it writes through every node,
// watches through the last one, kills -9 a container in the middle of the
// load (docker kill) and starts it again, then checks that every
// acknowledged write is readable with its revision and that the watch saw
// each exactly once, in revision order. It prints the longest gap between
// acknowledged writes and exits non-zero on any violation.
package main
