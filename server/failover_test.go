package server_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/brainkv/brain/internal/history"
	"github.com/brainkv/brain/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// procNode is a brainnode process of a test cluster.
type procNode struct {
	name   string
	dir    string
	client int
	peer   int
	cmd    *exec.Cmd
	logf   *os.File
}

func (n *procNode) endpoint() string { return fmt.Sprintf("127.0.0.1:%d", n.client) }

func (n *procNode) start(t *testing.T, bin, initial string) {
	t.Helper()
	args := []string{"--name", n.name, "--data-dir", n.dir,
		"--listen-client-urls", "http://" + n.endpoint(),
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", n.peer),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", n.peer),
		"--initial-cluster", initial,
		"--initial-split-points", strings.Join(concSplits, ","),
		"--log-level", "info"}
	n.cmd = exec.Command(bin, args...)
	var err error
	if n.logf, err = os.OpenFile(n.dir+".log", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
		t.Fatal(err)
	}
	n.cmd.Stdout, n.cmd.Stderr = n.logf, n.logf
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
}

func (n *procNode) signal(sig syscall.Signal) {
	if n.cmd != nil && n.cmd.Process != nil {
		_ = n.cmd.Process.Signal(sig)
	}
}

func (n *procNode) kill() {
	n.signal(syscall.SIGKILL)
	if n.cmd != nil {
		_, _ = n.cmd.Process.Wait()
		n.cmd = nil
	}
	if n.logf != nil {
		n.logf.Close()
	}
}

// leads returns the raft groups the node leads, from its metrics.
func (n *procNode) leads() []string {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + n.endpoint() + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var groups []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "brain_raft_is_leader{") && strings.HasSuffix(line, " 1") {
			groups = append(groups, strings.TrimSuffix(strings.TrimPrefix(line, `brain_raft_is_leader{group="`), `"} 1`))
		}
	}
	return groups
}

// TestFailoverKillAndPause runs a 3-node cluster of brainnode processes
// with the default timeouts under a write load from clients of every
// endpoint, kills -9 the node leading the TSO (and restarts it), then
// pauses (SIGSTOP) the node leading the most groups (and resumes it). It
// reports the longest gap between acknowledged writes after each fault
// (the unavailability window), and checks that the history is
// linearizable, that nothing acknowledged was lost, and that a watch
// failing over between nodes saw everything exactly once.
func TestFailoverKillAndPause(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes; skipped with -short")
	}
	bin := brainnodeBinary(t)
	dir := t.TempDir()
	var nodes []*procNode
	var initial []string
	for i := 1; i <= 3; i++ {
		n := &procNode{name: fmt.Sprintf("n%d", i), dir: filepath.Join(dir, fmt.Sprintf("n%d", i)), client: testutil.FreePort(t), peer: testutil.FreePortPair(t)}
		nodes = append(nodes, n)
		initial = append(initial, fmt.Sprintf("%s=http://127.0.0.1:%d", n.name, n.peer))
	}
	for _, n := range nodes {
		n.start(t, bin, strings.Join(initial, ","))
	}
	defer func() {
		for _, n := range nodes {
			n.signal(syscall.SIGCONT)
			n.kill()
		}
		if t.Failed() {
			for _, n := range nodes {
				b, _ := os.ReadFile(n.dir + ".log")
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				t.Logf("%s log tail:\n%s", n.name, b)
			}
		}
	}()
	var eps []string
	for _, n := range nodes {
		eps = append(eps, n.endpoint())
	}
	newClient := func() *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: time.Second, Logger: zap.NewNop(),
			DialKeepAliveTime: time.Second, DialKeepAliveTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	rec := history.NewRecorder()
	warm := newClient()
	for i := 0; ; i++ {
		if !history.Do(rec, warm, 99, history.Input{Kind: history.Put, Key: "/warm", Value: fmt.Sprint("warm-", i)}, time.Second).Unknown {
			break
		}
		if i > 600 {
			t.Fatal("the cluster did not start serving")
		}
		time.Sleep(50 * time.Millisecond)
	}

	ctx, stopWatch := context.WithCancel(context.Background())
	watch := &history.Watch{Name: "failover-watch", Key: "\x00", End: "\x00", Start: 1, PrevKV: true}
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		history.RecordResumingWatch(ctx, []*clientv3.Client{newClient()}, watch, 50*time.Millisecond)
	}()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for cl := 0; cl < 6; cl++ {
		wg.Add(1)
		go func(cl int) {
			defer wg.Done()
			kv := newClient()
			wl := history.NewWorkload(int64(cl), concKeys, 10, 60, 20)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				in := wl.Next(fmt.Sprintf("c%d-%d", cl, i))
				wl.Observe(in, history.Do(rec, kv, cl, in, 2*time.Second))
			}
		}(cl)
	}
	find := func(pick func(leads []string, n *procNode) bool) *procNode {
		for i := 0; i < 50; i++ {
			for _, n := range nodes {
				if pick(n.leads(), n) {
					return n
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatal("no node matches")
		return nil
	}
	time.Sleep(2 * time.Second)
	victim := find(func(l []string, _ *procNode) bool { return contains(l, "1") })
	t.Logf("kill -9 %s, leading %v", victim.name, victim.leads())
	killAt := rec.Now()
	victim.kill()
	time.Sleep(3 * time.Second)
	victim.start(t, bin, strings.Join(initial, ","))
	time.Sleep(3 * time.Second)
	var busiest *procNode
	most := -1
	for _, n := range nodes {
		if l := len(n.leads()); l > most {
			busiest, most = n, l
		}
	}
	t.Logf("SIGSTOP %s, leading %v", busiest.name, busiest.leads())
	pauseAt := rec.Now()
	busiest.signal(syscall.SIGSTOP)
	time.Sleep(4 * time.Second)
	busiest.signal(syscall.SIGCONT)
	resumeAt := rec.Now()
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	ops := rec.Ops()

	// Unavailability: the longest gap between acknowledged writes.
	var acks []int64
	for _, op := range ops {
		if op.IsWrite() {
			acks = append(acks, op.Return)
		}
	}
	sort.Slice(acks, func(i, j int) bool { return acks[i] < acks[j] })
	gap := func(from, to int64) time.Duration {
		var longest int64
		prev := from
		for _, a := range acks {
			if a < from {
				continue
			}
			if a > to {
				break
			}
			longest = max(longest, a-prev)
			prev = a
		}
		return time.Duration(longest)
	}
	killGap := gap(killAt, killAt+int64(3*time.Second))
	pauseGap := gap(pauseAt, resumeAt)
	t.Logf("unavailability after kill -9 of the TSO leader: %v; during the pause of the busiest leader: %v", killGap.Round(time.Millisecond), pauseGap.Round(time.Millisecond))
	if killGap > 15*time.Second || pauseGap > 15*time.Second {
		t.Errorf("writes did not resume")
	}

	final, err := warm.Get(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	waitWatches(t, []*history.Watch{watch}, final.Header.Revision)
	stopWatch()
	<-wdone
	ref := &history.Watch{Name: "reference", Key: "\x00", End: "\x00", Start: 1, PrevKV: true}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan struct{})
	go func() { defer close(rdone); _ = history.RecordWatch(rctx, newClient(), ref, 20*time.Millisecond) }()
	waitWatches(t, []*history.Watch{ref}, final.Header.Revision)
	rcancel()
	<-rdone

	res, err := history.CheckLinearizable(ops, 2*time.Minute, filepath.Join(dir, "porcupine.html"))
	if err != nil {
		t.Fatal(err)
	}
	if res != porcupine.Ok {
		t.Errorf("porcupine: %v", res)
	}
	for _, err := range history.CheckRevisions(ops) {
		t.Error(err)
	}
	for _, err := range history.CheckHistory(ref, ops) {
		t.Error(err)
	}
	for _, err := range history.CheckWatch(watch, ref) {
		t.Error(err)
	}
	unknown := 0
	for _, op := range ops {
		if op.Out.Unknown {
			unknown++
		}
	}
	t.Logf("%d operations, %d acknowledged writes, %d of unknown outcome, final revision %d", len(ops), len(acks), unknown, final.Header.Revision)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
