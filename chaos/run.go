package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/brainkv/brain/internal/history"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Config is one chaos run.
type Config struct {
	// Bin is the brainnode binary.
	Bin string
	// Out is the report directory (created; the nodes' data goes under it).
	Out      string
	Nodes    int
	Duration time.Duration // of the fault phase
	Seed     int64
	// Faults to draw from (FaultNames, and NetFaultNames with Netns);
	// empty: all that apply.
	Faults []string
	// Netns runs every node in a network namespace of its own (root only),
	// which the network faults need.
	Netns bool
	// Workloads to run (see WorkloadNames); empty: all.
	Workloads []string
	// Clients per workload.
	Clients int
	// Env is added to every node's environment.
	Env []string
	// System is SystemBrain (default), or SystemEtcd to run the same
	// schedule against etcd (Bin then an etcdref binary; the faults
	// EtcdFaultNames only).
	System string
	// Progress receives one line per step (nil: none).
	Progress io.Writer
}

// WorkloadNames are the workloads a run can mix.
var WorkloadNames = []string{"register", "kube", "watch", "lease", "serial-reads"}

// Result is what a run found.
type Result struct {
	Seed       int64
	Ops        int // recorded operations
	Acked      int // acknowledged writes
	Unknown    int // operations of unknown outcome
	Lists      int
	Leases     int
	Faults     int
	FinalRev   int64
	Violations []string
	Report     string // the report directory
	// Costs is what each fault cost the clients (availability.txt).
	Costs []FaultCost
	// StreamEnds counts the watch streams that ended with an error.
	StreamEnds int
	// SerialReads counts the serializable reads through single nodes;
	// Staleness says how stale they were.
	SerialReads int
	Staleness   Staleness
}

// Summary is the run's one-line summary.
func (r *Result) Summary() string {
	verdict := "ok"
	if len(r.Violations) > 0 {
		verdict = fmt.Sprintf("%d violations", len(r.Violations))
	}
	return fmt.Sprintf("seed=%d faults=%d ops=%d acked-writes=%d unknown=%d lists=%d leases=%d serial-reads=%d final-revision=%d watch-stream-ends=%d: %s",
		r.Seed, r.Faults, r.Ops, r.Acked, r.Unknown, r.Lists, r.Leases, r.SerialReads, r.FinalRev, r.StreamEnds, verdict)
}

// splits put the registers and kube objects into four partitions.
var splits = []string{"/registry/events/", "/registry/leases/", "/registry/pods/"}

// registerKeys are the single-key registers, spread over the partitions.
var registerKeys = []string{
	"/registry/configmaps/r1", "/registry/configmaps/r2",
	"/registry/events/r1", "/registry/events/r2",
	"/registry/leases/r1", "/registry/leases/r2",
	"/registry/pods/r1", "/registry/pods/r2", "/z",
}

// kubeResources are the kube workload's prefixes (one per partition).
var kubeResources = []string{"configmaps", "events", "leases", "pods"}

func kubeKeys() []string {
	var keys []string
	for _, r := range kubeResources {
		for ns := 0; ns < 3; ns++ {
			for i := 0; i < 15; i++ {
				keys = append(keys, fmt.Sprintf("/registry/%s/ns%d/obj%02d", r, ns, i))
			}
		}
	}
	return keys
}

// Run performs one chaos run and writes its report. It returns an error
// only when the run itself could not be carried out (the cluster did not
// start); violations are in the Result.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.Clients == 0 {
		cfg.Clients = 4
	}
	if cfg.System == "" {
		cfg.System = SystemBrain
	}
	defaults := FaultNames
	if cfg.System == SystemEtcd {
		defaults = EtcdFaultNames
	}
	if cfg.Netns {
		defaults = append(slices.Clone(defaults), NetFaultNames...)
	}
	known := append(slices.Clone(defaults), "none")
	if cfg.System != SystemEtcd {
		known = append(known, PlacementFaultNames...)
	}
	if len(cfg.Faults) == 0 {
		cfg.Faults = defaults
	}
	if len(cfg.Workloads) == 0 {
		cfg.Workloads = WorkloadNames
	}
	for _, f := range cfg.Faults {
		if !slices.Contains(known, f) {
			if slices.Contains(NetFaultNames, f) {
				return nil, fmt.Errorf("fault %q needs network namespaces (--netns)", f)
			}
			if cfg.System == SystemEtcd {
				return nil, fmt.Errorf("fault %q is brain's own; etcd runs %s", f, strings.Join(known, ", "))
			}
			return nil, fmt.Errorf("unknown fault %q (have %s)", f, strings.Join(known, ", "))
		}
	}
	for _, w := range cfg.Workloads {
		if !slices.Contains(WorkloadNames, w) {
			return nil, fmt.Errorf("unknown workload %q (have %s)", w, strings.Join(WorkloadNames, ", "))
		}
	}
	progress := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
		}
	}
	if err := os.MkdirAll(filepath.Join(cfg.Out, "data"), 0o755); err != nil {
		return nil, err
	}
	res := &Result{Seed: cfg.Seed, Report: cfg.Out}
	c, err := newCluster(cfg.Bin, filepath.Join(cfg.Out, "data"), cfg.Nodes, splits, cfg.Netns)
	if err != nil {
		return nil, err
	}
	c.System = cfg.System
	c.Env = cfg.Env
	for _, f := range cfg.Faults {
		if slices.Contains(DiskFaultNames, f) {
			c.Env = append(slices.Clone(c.Env), "BRAIN_DISK_FAULTS=1")
			break
		}
	}
	defer c.Close()
	for _, n := range c.Nodes {
		if err := c.Start(n); err != nil {
			return nil, err
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	err = c.WaitServing(sctx)
	cancel()
	if err != nil {
		return nil, err
	}
	progress("%d %s nodes serve (seed %d)", cfg.Nodes, cfg.System, cfg.Seed)

	var clients []*clientv3.Client
	newClient := func() (*clientv3.Client, error) {
		cl, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: time.Second, Logger: zap.NewNop(),
			DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: time.Second}) // 10 s: gRPC raises any lower keepalive time to it
		if err == nil {
			clients = append(clients, cl)
		}
		return cl, err
	}
	defer func() {
		for _, cl := range clients {
			cl.Close()
		}
	}()

	rec := history.NewRecorder()
	timeline := &Timeline{rec: rec}
	var lists listLog
	var leases leaseLog
	wctx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	var watches []*history.Watch
	nodeWatch := map[*history.Watch]string{} // a watch through one node alone
	var wwg sync.WaitGroup
	if slices.Contains(cfg.Workloads, "watch") {
		// Every key from the first revision with prev_kv, and one resource
		// from "now"; both resume on another node when their stream breaks,
		// and ask for progress.
		var wclients []*clientv3.Client
		for i := 0; i < 2; i++ {
			cl, err := newClient()
			if err != nil {
				return nil, err
			}
			wclients = append(wclients, cl)
		}
		start, err := currentRevision(ctx, wclients[0])
		if err != nil {
			return nil, err
		}
		watches = append(watches,
			&history.Watch{Name: "all-from-1", Key: "\x00", End: "\x00", Start: 1, PrevKV: true},
			&history.Watch{Name: "pods-from-now", Key: "/registry/pods/", End: "/registry/pods0", Start: start + 1})
		for _, w := range watches {
			wwg.Add(1)
			go func(w *history.Watch) {
				defer wwg.Done()
				history.RecordResumingWatch(wctx, wclients, w, 100*time.Millisecond)
			}(w)
		}
		// kubeadm's layout: each kube-apiserver watches through its own
		// node alone. Its client waits for that node through a restart;
		// only an error (such as "no leader") ends the watch, and the
		// watch is opened again on the same node.
		for _, n := range c.Nodes {
			cl, err := clientv3.New(clientv3.Config{Endpoints: []string{n.Endpoint()}, DialTimeout: time.Second, Logger: zap.NewNop(),
				DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: time.Second})
			if err != nil {
				return nil, err
			}
			clients = append(clients, cl)
			w := &history.Watch{Name: "through-" + n.Name, Key: "/registry/", End: "/registry0", Start: start + 1, PrevKV: true}
			watches = append(watches, w)
			nodeWatch[w] = n.Name
			wwg.Add(1)
			go func() {
				defer wwg.Done()
				history.RecordResumingWatch(wctx, []*clientv3.Client{cl}, w, 100*time.Millisecond)
			}()
		}
	}

	stop := make(chan struct{})
	var lwg sync.WaitGroup
	var sreads serialReadLog
	if slices.Contains(cfg.Workloads, "serial-reads") {
		// A reader per node, through that node alone.
		keys := append(slices.Clone(registerKeys), kubeKeys()...)
		for i, n := range c.Nodes {
			cl, err := clientv3.New(clientv3.Config{Endpoints: []string{n.Endpoint()}, DialTimeout: time.Second, Logger: zap.NewNop(),
				DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: time.Second})
			if err != nil {
				return nil, err
			}
			clients = append(clients, cl)
			lwg.Add(1)
			go func() {
				defer lwg.Done()
				runSerialReads(rec, cl, n.Name, keys, cfg.Seed*1000+500+int64(i), stop, &sreads)
			}()
		}
	}
	id := 0
	for _, wl := range cfg.Workloads {
		for i := 0; i < cfg.Clients && wl != "watch" && wl != "serial-reads"; i++ {
			cl, err := newClient()
			if err != nil {
				return nil, err
			}
			id++
			client, seed := id, cfg.Seed*1000+int64(id)
			lwg.Add(1)
			go func(wl string) {
				defer lwg.Done()
				switch wl {
				case "register":
					runRegisters(rec, cl, client, seed, stop)
				case "kube":
					runKube(rec, cl, client, seed, stop, &lists)
				case "lease":
					runLeases(rec, cl, client, seed, stop, &leases)
				}
			}(wl)
		}
	}

	// The fault phase.
	rng := rand.New(rand.NewSource(cfg.Seed))
	deadline := time.Now().Add(cfg.Duration)
	progress("faults for %v from %v", cfg.Duration, cfg.Faults)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		sleep(ctx, time.Duration(1000+rng.Intn(2000))*time.Millisecond)
		f := cfg.Faults[rng.Intn(len(cfg.Faults))]
		hold := time.Duration(1500+rng.Intn(2500)) * time.Millisecond
		if err := inject(ctx, c, f, hold, rng, timeline, progress); err != nil {
			res.Violations = append(res.Violations, fmt.Sprintf("fault %s: %v", f, err))
		}
		res.Faults++
	}
	progress("healing")
	timeline.add("heal", "")
	if err := c.Heal(); err != nil {
		return nil, err
	}
	sctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	if err := c.WaitServing(sctx); err != nil {
		res.Violations = append(res.Violations, fmt.Sprintf("the cluster does not serve after healing: %v", err))
	}
	cancel()
	for _, n := range c.Nodes {
		if k := n.Crashes(); k > 0 {
			res.Violations = append(res.Violations, fmt.Sprintf("%s exited on its own %d times, not through a fault (see %s.log)", n.Name, k, n.Name))
		}
	}
	sleep(ctx, 3*time.Second) // the workloads run on the healed cluster
	close(stop)
	lwg.Wait()
	ops := rec.Ops()

	// Checks.
	progress("checking %d operations", len(ops))
	final := int64(0)
	cl, err := newClient()
	if err != nil {
		return nil, err
	}
	ll := leases.all()
	if len(ll) > 0 {
		if err := waitLeasesExpired(ctx, cl, time.Minute); err != nil {
			res.Violations = append(res.Violations, "leases: "+err.Error())
		}
	}
	for i := 0; i < 30; i++ {
		if final, err = currentRevision(ctx, cl); err == nil {
			break
		}
		sleep(ctx, time.Second)
	}
	if err != nil {
		res.Violations = append(res.Violations, fmt.Sprintf("no read succeeds after healing: %v", err))
	}
	res.FinalRev = final
	for _, w := range watches {
		if !waitComplete(ctx, w, final, time.Minute) {
			res.Violations = append(res.Violations, fmt.Sprintf("watch %s stalled: complete up to %d, the store is at %d", w.Name, w.CompleteAt(), final))
		}
	}
	stopWatches()
	wwg.Wait()
	ref := &history.Watch{Name: "reference", Key: "\x00", End: "\x00", Start: 1, PrevKV: true}
	rctx, rcancel := context.WithCancel(ctx)
	rdone := make(chan struct{})
	go func() { defer close(rdone); _ = history.RecordWatch(rctx, cl, ref, 50*time.Millisecond) }()
	if !waitComplete(ctx, ref, final, time.Minute) {
		res.Violations = append(res.Violations, fmt.Sprintf("the reference watch from revision 1 reached only %d of %d", ref.CompleteAt(), final))
	}
	rcancel()
	<-rdone

	html := filepath.Join(cfg.Out, "porcupine.html")
	lin, err := history.CheckLinearizable(ops, 5*time.Minute, html)
	switch {
	case err != nil:
		res.Violations = append(res.Violations, fmt.Sprintf("porcupine: %v", err))
	case lin == porcupine.Illegal:
		res.Violations = append(res.Violations, "porcupine: the history is not linearizable (see porcupine.html)")
	case lin == porcupine.Unknown:
		res.Violations = append(res.Violations, "porcupine: timed out (result unknown)")
	}
	for _, e := range history.CheckRevisions(ops) {
		res.Violations = append(res.Violations, "revisions: "+e.Error())
	}
	for _, e := range checkLeases(ll, ref) {
		res.Violations = append(res.Violations, "leases: "+e.Error())
	}
	for _, e := range history.CheckHistory(ref, append(slices.Clone(ops), leaseOps(ll)...)) {
		res.Violations = append(res.Violations, "history: "+e.Error())
	}
	for _, w := range watches {
		for _, e := range history.CheckWatch(w, ref) {
			res.Violations = append(res.Violations, "watch: "+e.Error())
		}
	}
	spans := timeline.Spans()
	endNow := rec.Now()
	var nodeNames []string
	for _, n := range c.Nodes {
		nodeNames = append(nodeNames, n.Name)
	}
	srs := sreads.all()
	for _, e := range checkSerialReads(srs, ops, ref, spans, nodeNames) {
		res.Violations = append(res.Violations, "serializable read: "+e.Error())
	}
	res.SerialReads = len(srs)
	res.Staleness = serialStaleness(srs, ops)
	ends, nEnds := checkStreamEnds(rec, watches, func(w *history.Watch, _ int) string { return nodeWatch[w] }, spans, endNow)
	res.StreamEnds = nEnds
	for _, v := range ends {
		res.Violations = append(res.Violations, "watch: "+v)
	}
	res.Costs = faultCosts(ops, spans, endNow)
	ls := lists.all()
	for _, e := range checkLists(ls, ref) {
		res.Violations = append(res.Violations, "list: "+e.Error())
	}

	for _, op := range ops {
		switch {
		case op.Out.Unknown:
			res.Unknown++
		case op.IsWrite():
			res.Acked++
		}
	}
	res.Ops, res.Lists, res.Leases = len(ops), len(ls), len(ll)
	if lin != porcupine.Illegal {
		os.Remove(html)
	}
	if err := writeReport(cfg, res, ops, ls, ll, srs, append(watches, ref), timeline, c); err != nil {
		return res, err
	}
	progress("%s", res.Summary())
	return res, nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func currentRevision(ctx context.Context, cl *clientv3.Client) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	r, err := cl.Get(ctx, "/chaos-probe")
	if err != nil {
		return 0, err
	}
	return r.Header.Revision, nil
}

func waitComplete(ctx context.Context, w *history.Watch, rev int64, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for w.CompleteAt() < rev {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		sleep(ctx, 20*time.Millisecond)
	}
	return true
}

// runRegisters drives single-key registers: get, put, compare-and-swap on
// mod_revision (as kube-apiserver updates), delete.
func runRegisters(rec *history.Recorder, cl *clientv3.Client, client int, seed int64, stop <-chan struct{}) {
	wl := history.NewWorkload(seed, registerKeys, 25, 25, 40)
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		in := wl.Next(fmt.Sprintf("r%d-%d", client, i))
		wl.Observe(in, history.Do(rec, cl, client, in, 2*time.Second))
	}
}

// runKube drives kube-shaped traffic on many objects across partitions:
// creates and updates as compare-and-swaps on mod_revision, deletes, gets,
// and prefix lists.
func runKube(rec *history.Recorder, cl *clientv3.Client, client int, seed int64, stop <-chan struct{}, lists *listLog) {
	keys := kubeKeys()
	wl := history.NewWorkload(seed, keys, 20, 5, 65)
	rng := rand.New(rand.NewSource(seed))
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		if rng.Intn(10) == 0 {
			lists.record(cl, rec, "/registry/"+kubeResources[rng.Intn(len(kubeResources))]+"/")
			continue
		}
		in := wl.Next(fmt.Sprintf("k%d-%d", client, i))
		wl.Observe(in, history.Do(rec, cl, client, in, 2*time.Second))
	}
}

// List is a recorded prefix list: what a linearizable range returned at its
// header revision.
type List struct {
	Prefix string
	Rev    int64
	KVs    map[string]history.PrevKV // key -> value, mod revision
	Call   int64
	Return int64
}

type listLog struct {
	mu sync.Mutex
	ls []List
}

func (l *listLog) record(cl *clientv3.Client, rec *history.Recorder, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	call := rec.Now()
	r, err := cl.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return // a failed read tells nothing
	}
	li := List{Prefix: prefix, Rev: r.Header.Revision, KVs: map[string]history.PrevKV{}, Call: call, Return: rec.Now()}
	for _, kv := range r.Kvs {
		li.KVs[string(kv.Key)] = history.PrevKV{Value: string(kv.Value), Mod: kv.ModRevision}
	}
	l.mu.Lock()
	l.ls = append(l.ls, li)
	l.mu.Unlock()
}

func (l *listLog) all() []List {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]List(nil), l.ls...)
}

// checkLists checks every list against the reference history: it must be
// exactly the state of its prefix at its header revision.
func checkLists(ls []List, ref *history.Watch) []error {
	var events []history.Event
	for _, r := range ref.Resps {
		events = append(events, r.Events...)
	}
	var errs []error
	for _, li := range ls {
		if li.Rev > ref.Complete {
			continue
		}
		want := map[string]history.PrevKV{}
		for _, ev := range events {
			if ev.Rev > li.Rev {
				break
			}
			if !strings.HasPrefix(ev.Key, li.Prefix) {
				continue
			}
			if ev.Delete {
				delete(want, ev.Key)
			} else {
				want[ev.Key] = history.PrevKV{Value: ev.Value, Mod: ev.Rev}
			}
		}
		for k, v := range want {
			if got, ok := li.KVs[k]; !ok || got != v {
				errs = append(errs, fmt.Errorf("list of %s at revision %d: %s is %v, the history has %v", li.Prefix, li.Rev, k, li.KVs[k], v))
				break
			}
		}
		for k, v := range li.KVs {
			if _, ok := want[k]; !ok {
				errs = append(errs, fmt.Errorf("list of %s at revision %d has %s=%v, absent from the history at that revision", li.Prefix, li.Rev, k, v))
				break
			}
		}
		if len(errs) >= 20 {
			break
		}
	}
	return errs
}

func writeReport(cfg Config, res *Result, ops []history.Op, ls []List, leases []*leaseRecord, srs []SerialRead, watches []*history.Watch, tl *Timeline, c *Cluster) error {
	write := func(name string, v any) error {
		b, err := json.MarshalIndent(v, "", " ")
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(cfg.Out, name), b, 0o644)
	}
	errs := []error{
		write("history.json", ops),
		write("lists.json", ls),
		write("leases.json", leases),
		write("serial-reads.json", srs),
		write("watches.json", watches),
		os.WriteFile(filepath.Join(cfg.Out, "timeline.txt"), []byte(tl.String()), 0o644),
		os.WriteFile(filepath.Join(cfg.Out, "availability.txt"), []byte(availabilityReport(cfg.System, res.Costs)+"\n"+AvailabilitySummary(res.Costs)+"\n"+res.Staleness.String()+"\n"), 0o644),
		os.WriteFile(filepath.Join(cfg.Out, "violations.txt"), []byte(strings.Join(res.Violations, "\n")+"\n"), 0o644),
		os.WriteFile(filepath.Join(cfg.Out, "summary.txt"), []byte(res.Summary()+"\n"), 0o644),
	}
	for _, n := range c.Nodes {
		b, err := os.ReadFile(n.LogPath())
		if err == nil {
			err = os.WriteFile(filepath.Join(cfg.Out, n.Name+".log"), b, 0o644)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
