// Command benchplot renders the scaling benchmark's results
// (bench/scaling.sh) as a PNG: write throughput against cluster size, one
// line per system. It is a module of its own so that the server's module
// does not depend on a plotting library.
//
// Its input is tab-separated lines "system<TAB>nodes<TAB>ops/s" (lines
// starting with # are ignored):
//
//	go run . --in results.tsv --out scaling.png --title "creates/s at 0.25 CPU per node"
package main
