package workers

import (
	"sync"
	"testing"
	"time"
)

// TestPoolRunsEveryFunction runs more functions at once than the pool
// keeps goroutines: every one runs, none waits for another.
func TestPoolRunsEveryFunction(t *testing.T) {
	p := New(4, time.Minute)
	const n = 64
	var started, release sync.WaitGroup
	started.Add(n)
	release.Add(1)
	var done sync.WaitGroup
	done.Add(n)
	for i := 0; i < n; i++ {
		p.Go(func() {
			started.Done()
			release.Wait() // all n must be running at once to get past here
			done.Done()
		})
	}
	waitOrFail(t, &started, "not every function started while the others blocked")
	if k := p.Kept(); k != 4 {
		t.Fatalf("kept %d goroutines, want 4 (the max)", k)
	}
	release.Done()
	waitOrFail(t, &done, "not every function finished")
}

// TestPoolReusesIdleGoroutines: sequential functions run on the kept
// goroutines that finished the earlier ones, which exit after the idle
// time.
func TestPoolReusesIdleGoroutines(t *testing.T) {
	p := New(100, 200*time.Millisecond)
	for i := 0; i < 100; i++ {
		var wg sync.WaitGroup
		wg.Add(1)
		p.Go(wg.Done)
		wg.Wait()
		time.Sleep(2 * time.Millisecond) // the goroutine gets back to waiting for work
	}
	// One goroutine would do; a few more if one was late getting back.
	if k := p.Kept(); k > 10 {
		t.Fatalf("kept %d goroutines after 100 sequential functions, want at most 10", k)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.Kept() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("kept %d goroutines 5 s after the last function, want 0 (idle time 200ms)", p.Kept())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Still usable after its goroutines exited.
	var wg sync.WaitGroup
	wg.Add(1)
	p.Go(wg.Done)
	waitOrFail(t, &wg, "a function after the goroutines exited did not run")
}

func waitOrFail(t *testing.T, wg *sync.WaitGroup, msg string) {
	t.Helper()
	c := make(chan struct{})
	go func() { wg.Wait(); close(c) }()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatal(msg)
	}
}
