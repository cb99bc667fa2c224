package server_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// BenchmarkCreate measures kube-apiserver's create (a txn that puts a 1 KiB
// value if the key has never been written) on in-process clusters, with
// etcd 3.6 in the same process as the reference. All nodes and the clients
// share the process, so the allocation figures (-benchmem) and cpu-µs/op
// (the process's CPU time per create), reads/op and writes/op (its read and
// write system calls per create) are the whole cluster's, clients included. They vary far less than throughput on a shared machine;
// compare brain's with etcd's from the same run:
//
//	go test ./server -run '^$' -bench Create -benchmem -benchtime 5000x
//
// The 6-node runs have twice the 3-node runs' clients (the same number per
// node) and twelve resource prefixes, each its own partition, so that
// every node leads some: their cost per create next to the 3-node one's
// is what limits scaling at a fixed CPU share per node (see
// bench/scaling.sh).
func BenchmarkCreate(b *testing.B) {
	for _, n := range []int{1, 3, 6} {
		resources := []string{"configmaps", "pods", "services"}
		clients := 16
		if n == 6 {
			resources = append(resources, "deployments", "endpoints", "events", "leases", "namespaces", "nodes", "replicasets", "secrets", "serviceaccounts")
			clients = 32
		}
		b.Run(fmt.Sprintf("brain-%d", n), func(b *testing.B) {
			var splits []string
			for _, r := range resources {
				splits = append(splits, "/registry/"+r+"/")
			}
			slices.Sort(splits)
			// The production timings, not the tests' faster ones: six
			// busy nodes on a small machine miss 500 ms elections.
			c := testutil.StartCluster(b, n, server.Config{Logger: testutil.Quiet(), InitialSplitPoints: splits,
				HeartbeatInterval: 100 * time.Millisecond, ElectionTimeout: time.Second, LeaderBalanceInterval: 5 * time.Second})
			benchCreate(b, c.Endpoints(), clients, resources)
		})
		b.Run(fmt.Sprintf("etcd-%d", n), func(b *testing.B) {
			benchCreate(b, testutil.StartEtcdCluster(b, n), clients, resources)
		})
	}
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procIO returns a counter of /proc/self/io: syscr and syscw count the
// read and write system calls (sockets and files) of the process.
func procIO(b *testing.B, name string) int64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, name+": "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("no %s in /proc/self/io", name)
	return 0
}

// benchCreate runs b.N creates from concurrent clients spread over the
// endpoints, under the resource prefixes.
func benchCreate(b *testing.B, endpoints []string, clients int, resources []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var cls []*clientv3.Client
	for i := 0; i < clients; i++ {
		cl, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoints[i%len(endpoints)]}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		cls = append(cls, cl)
	}
	// Wait until every endpoint serves writes.
	for i := range endpoints {
		for {
			_, err := cls[i].Put(ctx, "/warm/"+endpoints[i], "up")
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				b.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	value := strings.Repeat("v", 1024)
	var next atomic.Int64
	var failed atomic.Value
	var retries atomic.Int64
	b.ReportAllocs()
	cpu0, r0, w0 := processCPU(b), procIO(b, "syscr"), procIO(b, "syscw")
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, cl := range cls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				key := fmt.Sprintf("/registry/%s/ns%d/obj-%d", resources[i%int64(len(resources))], i%7, i)
				for attempt := 0; ; attempt++ {
					resp, err := cl.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
						Then(clientv3.OpPut(key, value)).Else(clientv3.OpGet(key)).Commit()
					if err == nil && !resp.Succeeded && attempt == 0 {
						err = fmt.Errorf("create %s: key exists", key)
					}
					// Like kube's clients, retry a create that failed for
					// want of a leader (an earlier attempt may have
					// written the key); the retries are reported.
					if (errors.Is(err, rpctypes.ErrNoLeader) || errors.Is(err, rpctypes.ErrLeaderChanged)) && attempt < 20 {
						retries.Add(1)
						time.Sleep(50 * time.Millisecond)
						continue
					}
					if err != nil {
						failed.CompareAndSwap(nil, err)
						return
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(procIO(b, "syscr")-r0)/float64(b.N), "reads/op")
	b.ReportMetric(float64(procIO(b, "syscw")-w0)/float64(b.N), "writes/op")
	b.ReportMetric(float64(retries.Load())/float64(b.N), "retries/op")
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
}
