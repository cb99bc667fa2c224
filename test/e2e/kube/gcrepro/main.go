package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

var bin, dir string

func start(i int) *exec.Cmd {
	c := exec.Command(bin, "--name", fmt.Sprintf("n%d", i), "--data-dir", fmt.Sprintf("%s/n%d", dir, i),
		"--listen-client-urls", fmt.Sprintf("http://127.0.0.1:3%d379", i),
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:3%d380", i), "--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:3%d380", i),
		"--initial-cluster", "n1=http://127.0.0.1:31380,n2=http://127.0.0.1:32380,n3=http://127.0.0.1:33380")
	f, _ := os.OpenFile(fmt.Sprintf("%s/n%d.log", dir, i), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	c.Stdout, c.Stderr = f, f
	if err := c.Start(); err != nil {
		panic(err)
	}
	return c
}

func main() {
	bin, dir = os.Args[1], os.Args[2]
	mode := os.Args[3] // "kill" or "nokill"
	nodes := map[int]*exec.Cmd{}
	for i := 1; i <= 3; i++ {
		nodes[i] = start(i)
	}
	defer func() {
		for _, n := range nodes {
			n.Process.Signal(os.Interrupt)
			n.Wait()
		}
	}()
	time.Sleep(4 * time.Second)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:32379", "127.0.0.1:33379"}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	churn := func(tag string) int64 {
		var rev int64
		for i := 0; i < 20; i++ {
			k := fmt.Sprintf("/registry/configmaps/default/%s-%d", tag, i)
			for j := 0; j < 3; j++ {
				r, err := c.Put(ctx, k, fmt.Sprint(j))
				if err != nil {
					fmt.Println("put:", err)
					continue
				}
				rev = r.Header.Revision
			}
			if r, err := c.Delete(ctx, k); err == nil {
				rev = r.Header.Revision
			} else {
				fmt.Println("delete:", err)
			}
		}
		return rev
	}
	compact := func(rev int64) {
		if _, err := c.Compact(ctx, rev); err != nil {
			fmt.Println("compact:", err)
		} else {
			fmt.Println("compacted at", rev)
		}
	}
	rev := churn("a")
	compact(rev)
	if mode == "none" {
		fmt.Println("no stop")
	} else if mode == "kill" {
		nodes[1].Process.Kill()
		nodes[1].Wait()
		fmt.Println("killed n1")
	} else {
		nodes[1].Process.Signal(os.Interrupt)
		nodes[1].Wait()
		fmt.Println("stopped n1 cleanly")
	}
	rev = churn("b")
	compact(rev)
	time.Sleep(2 * time.Second)
	if mode != "none" {
		nodes[1] = start(1)
		fmt.Println("restarted n1")
	}
	time.Sleep(8 * time.Second)
	rev = churn("c")
	compact(rev)
	time.Sleep(5 * time.Second)
	for i := 1; i <= 3; i++ {
		b, _ := os.ReadFile(fmt.Sprintf("%s/n%d.log", dir, i))
		fmt.Printf("n%d: %d \"corrupt mvcc record\" GC errors\n", i, strings.Count(string(b), "corrupt mvcc record"))
	}
}
