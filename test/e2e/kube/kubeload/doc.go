// Command kubeload creates Kubernetes objects through a kube-apiserver with
// several concurrent clients and reports objects/s and the request latency
// it saw. It is the load generator of test/e2e/kube/bench.sh; it speaks
// plain HTTPS+JSON with a bearer token, so it needs nothing from the
// Kubernetes tree.
//
//	kubeload --server https://127.0.0.1:26443 --token T --namespace bench \
//	    --kind configmaps --count 5000 --clients 16
//
// It prints progress to stderr every second and one result line
// ("RESULT kind=... objects=... seconds=... objects_per_s=... p50_ms=...
// p99_ms=... errors=...") to stdout. It exits 1 if any create failed.
package main
