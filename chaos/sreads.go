package chaos

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/brainkv/brain/internal/history"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxStaleness is the staleness bound of serializable reads the checks
// hold brainnode to (its --max-serializable-staleness default).
const MaxStaleness = 100 * time.Millisecond

// SerialRead is a serializable Get through one node.
type SerialRead struct {
	Node         string
	Key          string
	Call, Return int64 // on the history's clock
	Rev          int64 // the header revision: the revision it read at
	Exists       bool
	Value        string
	Mod          int64
	Member       uint64
	Err          string `json:",omitempty"`
}

type serialReadLog struct {
	mu sync.Mutex
	rs []SerialRead
}

func (l *serialReadLog) add(r SerialRead) {
	l.mu.Lock()
	l.rs = append(l.rs, r)
	l.mu.Unlock()
}

func (l *serialReadLog) all() []SerialRead {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.rs)
}

// runSerialReads reads random keys serializably through node's client (one
// endpoint) until stop closes.
func runSerialReads(rec *history.Recorder, cl *clientv3.Client, node string, keys []string, seed int64, stop <-chan struct{}, log *serialReadLog) {
	rng := rand.New(rand.NewSource(seed))
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(rng.Intn(10)) * time.Millisecond):
		}
		key := keys[rng.Intn(len(keys))]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r := SerialRead{Node: node, Key: key, Call: rec.Now()}
		resp, err := cl.Get(ctx, key, clientv3.WithSerializable())
		cancel()
		r.Return = rec.Now()
		if err != nil {
			r.Err = err.Error()
		} else {
			r.Rev, r.Member = resp.Header.Revision, resp.Header.MemberId
			if len(resp.Kvs) == 1 {
				r.Exists, r.Value, r.Mod = true, string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision
			}
		}
		log.add(r)
	}
}

// restarts lists, per node, when the faults that stop its process began
// (a process's memory of what it answered starts over).
func restarts(spans []Span, nodes []string) map[string][]int64 {
	out := map[string][]int64{}
	for _, sp := range spans {
		switch sp.Fault {
		case "kill", "kill-tso-leader", "kill-meta-leader", "disk-fail", "disk-full":
			out[sp.Node] = append(out[sp.Node], sp.Start)
		case "restart-all":
			for _, n := range nodes {
				out[n] = append(out[n], sp.Start)
			}
		}
	}
	return out
}

// checkSerialReads checks the serializable reads against the reference
// watch and the history:
//   - each read is the state of its key at the revision it read at (its
//     header): a consistent snapshot;
//   - it is at most MaxStaleness stale: it reads at or above every write
//     acknowledged that long before it began, unless a fault was under way
//     (a node that cannot reach the TSO serves what it has, as an etcd
//     member cut off from its leader does);
//   - on each node its header is never below the header of an operation
//     that node answered before it began (since the node's last restart),
//     as on an etcd member.
func checkSerialReads(reads []SerialRead, ops []history.Op, ref *history.Watch, spans []Span, nodes []string) []error {
	var errs []error
	add := func(format string, args ...any) bool {
		errs = append(errs, fmt.Errorf(format, args...))
		return len(errs) < 20
	}
	// Each key's events, in revision order.
	events := map[string][]history.Event{}
	for _, r := range ref.Resps {
		for _, ev := range r.Events {
			events[ev.Key] = append(events[ev.Key], ev)
		}
	}
	stateAt := func(key string, rev int64) (exists bool, value string, mod int64) {
		evs := events[key]
		i := sort.Search(len(evs), func(i int) bool { return evs[i].Rev > rev })
		if i == 0 || evs[i-1].Delete {
			return false, "", 0
		}
		return true, evs[i-1].Value, evs[i-1].Rev
	}
	var writes []history.Op
	for _, op := range ops {
		if op.IsWrite() {
			writes = append(writes, op)
		}
	}
	sort.Slice(writes, func(i, j int) bool { return writes[i].Return < writes[j].Return })
	faulted := func(from, to int64) bool {
		for _, sp := range spans {
			end := sp.End
			if end == 0 {
				end = 1 << 62
			}
			if sp.Start <= to && end+int64(2*time.Second) >= from {
				return true
			}
		}
		return false
	}
	ok := slices.DeleteFunc(slices.Clone(reads), func(r SerialRead) bool { return r.Err != "" })
	sort.Slice(ok, func(i, j int) bool { return ok[i].Call < ok[j].Call })
	var maxRev int64
	w := 0
	for _, r := range ok {
		if r.Rev <= ref.Complete {
			if e, v, m := stateAt(r.Key, r.Rev); e != r.Exists || v != r.Value || m != r.Mod {
				if !add("serializable read of %s through %s at revision %d saw (exists %v, mod %d, value %q); the history has (exists %v, mod %d, value %q) there",
					r.Key, r.Node, r.Rev, r.Exists, r.Mod, r.Value, e, m, v) {
					return errs
				}
			}
		}
		bound := r.Call - int64(MaxStaleness)
		for w < len(writes) && writes[w].Return < bound {
			maxRev = max(maxRev, writes[w].Out.Rev)
			w++
		}
		if r.Rev < maxRev && !faulted(bound, r.Return) {
			if !add("serializable read of %s through %s at revision %d is more than %v stale: revision %d was acknowledged before %v ahead of it",
				r.Key, r.Node, r.Rev, MaxStaleness, maxRev, MaxStaleness) {
				return errs
			}
		}
	}
	// Per node: answered headers never go backwards for a serializable read.
	memberNode := map[uint64]string{}
	for _, r := range ok {
		memberNode[r.Member] = r.Node
	}
	type answer struct {
		call, ret, rev int64
		serial         bool
		what           string
	}
	byNode := map[string][]answer{}
	for _, op := range ops {
		if n, known := memberNode[op.Out.Member]; known && !op.Out.Unknown {
			byNode[n] = append(byNode[n], answer{op.Call, op.Return, op.Out.Rev, false, fmt.Sprint(op.In)})
		}
	}
	for _, r := range ok {
		byNode[r.Node] = append(byNode[r.Node], answer{r.Call, r.Return, r.Rev, true, "serializable get " + r.Key})
	}
	resets := restarts(spans, nodes)
	for node, as := range byNode {
		byRet := slices.Clone(as)
		sort.Slice(byRet, func(i, j int) bool { return byRet[i].ret < byRet[j].ret })
		sort.Slice(as, func(i, j int) bool { return as[i].call < as[j].call })
		var high answer
		j := 0
		for _, a := range as {
			for j < len(byRet) && byRet[j].ret < a.call {
				if byRet[j].rev > high.rev {
					high = byRet[j]
				}
				j++
			}
			for _, at := range resets[node] {
				if at > high.ret && at < a.call {
					high = answer{} // the node restarted since
				}
			}
			if a.serial && a.rev < high.rev {
				if !add("%s through %s answered header revision %d, below the %d of %s it answered before", a.what, node, a.rev, high.rev, high.what) {
					return errs
				}
			}
		}
	}
	return errs
}

// Staleness summarizes how stale the serializable reads were: for each
// read, how long before it began the first acknowledged write it did not
// see (the write with the lowest revision above the read's) had been
// acknowledged; 0 if it missed none.
type Staleness struct {
	Reads         int
	P50, P99, Max time.Duration
	MissedAny     int // reads that missed an acknowledged write
}

func (s Staleness) String() string {
	return fmt.Sprintf("%d serializable reads: stale p50 %v, p99 %v, max %v; %d missed a write acknowledged before they began",
		s.Reads, s.P50, s.P99, s.Max, s.MissedAny)
}

// serialStaleness measures the reads' staleness against the history's
// acknowledged writes.
func serialStaleness(reads []SerialRead, ops []history.Op) Staleness {
	type w struct{ rev, ret int64 }
	var ws []w
	for _, op := range ops {
		if op.IsWrite() {
			ws = append(ws, w{op.Out.Rev, op.Return})
		}
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].rev < ws[j].rev })
	var st Staleness
	var ds []time.Duration
	for _, r := range reads {
		if r.Err != "" {
			continue
		}
		st.Reads++
		d := time.Duration(0)
		if i := sort.Search(len(ws), func(i int) bool { return ws[i].rev > r.Rev }); i < len(ws) && ws[i].ret < r.Call {
			d = time.Duration(r.Call - ws[i].ret)
			st.MissedAny++
		}
		ds = append(ds, d)
	}
	if len(ds) == 0 {
		return st
	}
	slices.Sort(ds)
	st.P50, st.P99, st.Max = ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1]
	return st
}
