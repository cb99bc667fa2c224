package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

type ack struct {
	key, value string
	rev        int64
	at         time.Time
}

func main() {
	endpoints := flag.String("endpoints", "localhost:23791,localhost:23792,localhost:23793", "client endpoints")
	kill := flag.String("kill", "", "container (name or ID) to kill -9 mid-load")
	flag.Parse()
	eps := strings.Split(*endpoints, ",")
	if *kill == "" {
		log.Fatal("--kill: name the container to kill")
	}
	if err := run(eps, *kill); err != nil {
		log.Printf("FAIL: %v", err)
		os.Exit(1)
	}
	log.Printf("PASS")
}

func client(eps ...string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: time.Second}) // 10 s: gRPC raises any lower keepalive time to it
	if err != nil {
		log.Fatal(err)
	}
	return c
}

func run(eps []string, container string) error {
	// Wait until every node serves.
	deadline := time.Now().Add(90 * time.Second)
	for _, ep := range eps {
		c := client(ep)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := c.Put(ctx, "/compose/ready", ep)
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s never served: %v", ep, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		c.Close()
	}
	log.Printf("all %d nodes serve", len(eps))

	watcher := client(eps[len(eps)-1])
	defer watcher.Close()
	start, err := watcher.Get(context.Background(), "/compose/ready")
	if err != nil {
		return err
	}
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	var wmu sync.Mutex
	var seen []ack
	wdone := make(chan error, 1)
	go func() {
		// As kube-apiserver does, a watch that ends (require-leader cancels
		// it while its node has no leader, e.g. right after a restart) is
		// opened again from the revision after the last event seen.
		next := start.Header.Revision + 1
		for wctx.Err() == nil {
			var werr error
			for wr := range watcher.Watch(clientv3.WithRequireLeader(wctx), "/compose/k/", clientv3.WithPrefix(), clientv3.WithRev(next)) {
				if werr = wr.Err(); werr != nil {
					break
				}
				wmu.Lock()
				for _, ev := range wr.Events {
					seen = append(seen, ack{key: string(ev.Kv.Key), value: string(ev.Kv.Value), rev: ev.Kv.ModRevision})
					next = ev.Kv.ModRevision + 1
				}
				wmu.Unlock()
			}
			if wctx.Err() != nil {
				break
			}
			if werr != nil && errors.Is(werr, rpctypes.ErrCompacted) {
				wdone <- werr
				return
			}
			log.Printf("watch ended (%v); opening it again from revision %d", werr, next)
			time.Sleep(200 * time.Millisecond)
		}
		wdone <- nil
	}()

	var mu sync.Mutex
	var acks []ack
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := client(eps...)
			defer c.Close()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("/compose/k/%d/%d", w, i), fmt.Sprintf("v%d-%d", w, i)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				r, err := c.Put(ctx, k, v)
				cancel()
				if err == nil {
					mu.Lock()
					acks = append(acks, ack{k, v, r.Header.Revision, time.Now()})
					mu.Unlock()
				}
			}
		}(w)
	}
	time.Sleep(3 * time.Second)
	log.Printf("docker kill %s", container)
	killedAt := time.Now()
	if out, err := exec.Command("docker", "kill", container).CombinedOutput(); err != nil {
		return fmt.Errorf("docker kill: %v: %s", err, out)
	}
	time.Sleep(4 * time.Second)
	log.Printf("docker start %s", container)
	if out, err := exec.Command("docker", "start", container).CombinedOutput(); err != nil {
		return fmt.Errorf("docker start: %v: %s", err, out)
	}
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()

	sort.Slice(acks, func(i, j int) bool { return acks[i].at.Before(acks[j].at) })
	var gap time.Duration
	prev := killedAt
	for _, a := range acks {
		if a.at.Before(killedAt) {
			continue
		}
		if d := a.at.Sub(prev); d > gap {
			gap = d
		}
		prev = a.at
	}
	log.Printf("%d acknowledged writes; longest gap after the kill: %v", len(acks), gap.Round(time.Millisecond))

	// Every acknowledged write is readable through the restarted node.
	reader := client(eps[0])
	defer reader.Close()
	for _, a := range acks {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		g, err := reader.Get(ctx, a.key)
		cancel()
		if err != nil {
			return fmt.Errorf("read %s: %v", a.key, err)
		}
		if len(g.Kvs) != 1 || string(g.Kvs[0].Value) != a.value || g.Kvs[0].ModRevision != a.rev {
			return fmt.Errorf("acknowledged %s=%s at %d, read %v", a.key, a.value, a.rev, g.Kvs)
		}
	}
	// The watch saw every acknowledged write once, in revision order.
	last := acks[len(acks)-1].rev
	for i := 0; ; i++ {
		wmu.Lock()
		n := len(seen)
		done := n > 0 && seen[n-1].rev >= last
		wmu.Unlock()
		if done {
			break
		}
		if i > 300 {
			select {
			case err := <-wdone:
				return fmt.Errorf("watch stopped at %d events: it ended with %v", n, err)
			default:
				return fmt.Errorf("watch stopped at %d events (still open)", n)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopWatch()
	wmu.Lock()
	defer wmu.Unlock()
	got := map[string]int{}
	for i, e := range seen {
		if i > 0 && e.rev <= seen[i-1].rev {
			return fmt.Errorf("watch event at %d after %d", e.rev, seen[i-1].rev)
		}
		got[e.key+"="+e.value]++
	}
	for _, a := range acks {
		if got[a.key+"="+a.value] != 1 {
			return fmt.Errorf("watch saw %s=%s %d times", a.key, a.value, got[a.key+"="+a.value])
		}
	}
	log.Printf("every acknowledged write readable after the restart; the watch saw all %d once, in order", len(acks))
	return nil
}
