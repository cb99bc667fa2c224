package chaos

import (
	"fmt"
	"time"

	"github.com/brainkv/brain/internal/history"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// The chaos watches are opened as kube-apiserver opens its watches, with
// etcd's require-leader metadata, and etcd's client ends such a watch for
// good when the server answers "etcdserver: no leader" (kube-apiserver
// then re-lists). etcd's member says so only after it has had no leader
// for 3 election timeouts. So a watch that ends with "no leader" is a
// violation unless its node could have been without a leader that long:
// it was cut off from the others (isolate, isolate-tso-leader and one-way
// of that node; a bridge), or the cluster lost its quorum (restart-all),
// for at least the grace, and the end came before the fault healed (with
// a slack for a new election).
const (
	noLeaderGrace = 3 * time.Second // 3 election timeouts of the default 1 s
	noLeaderSlack = 5 * time.Second
)

// cutsOff reports whether fault can leave node without a leader for long.
func cutsOff(sp Span, node string) bool {
	switch sp.Fault {
	case "restart-all", "bridge":
		return true
	case "isolate", "isolate-tso-leader", "one-way":
		return node == "" || sp.Node == node
	}
	return false
}

// noLeaderAllowed reports whether a require-leader stream through node
// ("": unknown) may have ended with "no leader" at at.
func noLeaderAllowed(spans []Span, node string, at int64, end int64) bool {
	for _, sp := range spans {
		healed := sp.End
		if healed == 0 {
			healed = end
		}
		if cutsOff(sp, node) && at >= sp.Start+int64(noLeaderGrace) && at <= healed+int64(noLeaderSlack) {
			return true
		}
	}
	return false
}

// isNoLeader reports whether a stream's error is etcd's "no leader".
func isNoLeader(err string) bool { return err == rpctypes.ErrNoLeader.Error() }

// checkStreamEnds checks the watches' ended streams: "no leader" only when
// allowed, and counts every end. nodeOf names the node behind a watch's
// client i ("" when its client has every endpoint).
func checkStreamEnds(rec *history.Recorder, watches []*history.Watch, nodeOf func(w *history.Watch, client int) string, spans []Span, end int64) (violations []string, ends int) {
	for _, w := range watches {
		for _, e := range w.Ends() {
			ends++
			if !isNoLeader(e.Err) {
				continue
			}
			at := rec.At(e.At)
			node := nodeOf(w, e.Client)
			if !noLeaderAllowed(spans, node, at, end) {
				where := node
				if where == "" {
					where = "a node"
				}
				violations = append(violations, fmt.Sprintf("watch %s through %s ended with %q at %.3fs, with no fault that cut it off for %v before",
					w.Name, where, e.Err, float64(at)/1e9, noLeaderGrace))
			}
		}
	}
	return violations, ends
}
