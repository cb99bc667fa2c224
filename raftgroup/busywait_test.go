package raftgroup

import (
	"runtime"
	rtmetrics "runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestWaitWhileBusy: with BusyWait, a worker yields while other goroutines
// are runnable (here: spinners that yield in a loop, on one thread), for
// about BusyWait; without BusyWait it does not wait. (That it does not
// wait with nothing runnable is not checked: a test binary cannot make
// sure nothing else is.)
func TestWaitWhileBusy(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const wait = 20 * time.Millisecond
	h := &Host{cfg: Config{BusyWait: wait}, metrics: newMetrics(nil)}
	sample := []rtmetrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}

	var stop atomic.Bool
	var wg sync.WaitGroup
	var spins atomic.Int64
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				spins.Add(1)
				runtime.Gosched()
			}
		}()
	}
	runtime.Gosched() // let them start
	before := spins.Load()
	start := time.Now()
	h.waitWhileBusy(sample)
	took := time.Since(start)
	during := spins.Load() - before
	stop.Store(true)
	wg.Wait()
	if c := histogramCount(h.metrics.busyWait); c != 1 {
		t.Fatalf("brain_raft_busy_wait_seconds has %d samples with goroutines runnable, want 1", c)
	}
	if during == 0 {
		t.Fatal("the runnable goroutines did not run while the worker waited")
	}
	if took > wait+time.Second {
		t.Fatalf("waited %v, want about BusyWait (%v)", took, wait)
	}

	// Without BusyWait the worker never waits.
	h.cfg.BusyWait = 0
	stop.Store(false)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			runtime.Gosched()
		}
	}()
	h.waitWhileBusy(sample)
	stop.Store(true)
	wg.Wait()
	if c := histogramCount(h.metrics.busyWait); c != 1 {
		t.Fatalf("waited without BusyWait (%d samples)", c)
	}
}
