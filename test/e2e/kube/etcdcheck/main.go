package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func main() {
	endpoints := flag.String("endpoints", "http://127.0.0.1:2379", "comma-separated client URLs")
	cacert := flag.String("cacert", "", "CA bundle verifying https endpoints")
	cert := flag.String("cert", "", "client certificate for https endpoints")
	key := flag.String("key", "", "client key for https endpoints")
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		fail(2, "usage: etcdcheck -endpoints URLS status|get KEY|put KEY VALUE|count PREFIX|compaction|wait-gone KEY DURATION")
	}
	var tlsConfig *tls.Config
	if *cacert != "" || *cert != "" {
		info := transport.TLSInfo{TrustedCAFile: *cacert, CertFile: *cert, KeyFile: *key}
		c, err := info.ClientConfig()
		if err != nil {
			fail(2, "TLS: %v", err)
		}
		tlsConfig = c
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*endpoints, ","),
		DialTimeout: 5 * time.Second,
		TLS:         tlsConfig,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		fail(1, "connect: %v", err)
	}
	defer cli.Close()
	switch args[0] {
	case "status":
		for _, ep := range cli.Endpoints() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			st, err := cli.Status(ctx, ep)
			cancel()
			if err != nil {
				fmt.Printf("%s error: %v\n", ep, err)
				continue
			}
			fmt.Printf("%s version=%s member=%x leader=%x revision=%d\n", ep, st.Version, st.Header.MemberId, st.Leader, st.Header.Revision)
		}
	case "get":
		need(args, 2)
		resp := get(cli, args[1])
		if len(resp.Kvs) == 0 {
			fmt.Printf("%s absent (revision %d)\n", args[1], resp.Header.Revision)
			os.Exit(3)
		}
		kv := resp.Kvs[0]
		fmt.Printf("%s create_revision=%d mod_revision=%d version=%d lease=%x value_bytes=%d\n",
			kv.Key, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease, len(kv.Value))
	case "put":
		need(args, 3)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cli.Put(ctx, args[1], args[2])
		cancel()
		if err != nil {
			fail(1, "put %s: %v", args[1], err)
		}
		fmt.Printf("%s put at revision %d\n", args[1], resp.Header.Revision)
	case "count":
		need(args, 2)
		resp := get(cli, args[1], clientv3.WithPrefix(), clientv3.WithCountOnly())
		fmt.Println(resp.Count)
	case "compaction":
		compaction(cli)
	case "wait-gone":
		need(args, 3)
		d, err := time.ParseDuration(args[2])
		if err != nil {
			fail(2, "duration: %v", err)
		}
		start := time.Now()
		for {
			resp := get(cli, args[1])
			if len(resp.Kvs) == 0 {
				fmt.Printf("%s gone after %s (revision %d)\n", args[1], time.Since(start).Round(time.Second), resp.Header.Revision)
				return
			}
			if time.Since(start) > d {
				kv := resp.Kvs[0]
				fmt.Printf("%s still present after %s: mod_revision=%d lease=%x\n", kv.Key, d, kv.ModRevision, kv.Lease)
				if kv.Lease != 0 {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
					cancel()
					fmt.Printf("lease %x: ttl=%v granted=%v err=%v\n", kv.Lease, ttlOf(ttl), grantedOf(ttl), err)
				}
				os.Exit(5)
			}
			time.Sleep(time.Second)
		}
	case "watch":
		need(args, 3)
		d, err := time.ParseDuration(args[2])
		if err != nil {
			fail(2, "duration: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		for resp := range cli.Watch(ctx, args[1], clientv3.WithPrefix(), clientv3.WithProgressNotify()) {
			if err := resp.Err(); err != nil {
				fmt.Printf("ERROR %v\n", err)
			}
			if resp.IsProgressNotify() {
				fmt.Printf("PROGRESS %d\n", resp.Header.Revision)
			}
			for _, ev := range resp.Events {
				fmt.Printf("%s %s %d\n", ev.Type, ev.Kv.Key, ev.Kv.ModRevision)
			}
		}
	default:
		fail(2, "unknown command %q", args[0])
	}
}

// compaction prints kube-apiserver's compact_rev_key and the store's
// compaction revision: the smallest revision a read at that revision is
// still served at (binary search with reads of compact_rev_key).
func compaction(cli *clientv3.Client) {
	const key = "compact_rev_key"
	resp := get(cli, key)
	if len(resp.Kvs) == 0 {
		fmt.Printf("%s absent: kube-apiserver's compactor has not run\n", key)
		os.Exit(4)
	}
	kv := resp.Kvs[0]
	fmt.Printf("%s version=%d value=%s mod_revision=%d (store revision %d)\n", key, kv.Version, kv.Value, kv.ModRevision, resp.Header.Revision)
	lo, hi := int64(1), resp.Header.Revision // the answer is in [lo, hi]
	for lo < hi {
		mid := lo + (hi-lo)/2
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := cli.Get(ctx, key, clientv3.WithRev(mid))
		cancel()
		switch {
		case err == nil:
			hi = mid
		case errors.Is(err, rpctypes.ErrCompacted):
			lo = mid + 1
		default:
			fail(1, "get %s at revision %d: %v", key, mid, err)
		}
	}
	fmt.Printf("compacted revision: %d\n", lo)
	if lo <= 1 {
		os.Exit(4)
	}
	if v, err := strconv.ParseInt(string(kv.Value), 10, 64); err == nil && kv.Version >= 2 && lo < v {
		fmt.Printf("warning: compactor recorded %d but reads below it are still served\n", v)
	}
}

func get(cli *clientv3.Client, key string, opts ...clientv3.OpOption) *clientv3.GetResponse {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key, opts...)
	if err != nil {
		fail(1, "get %s: %v", key, err)
	}
	return resp
}

func ttlOf(r *clientv3.LeaseTimeToLiveResponse) int64 {
	if r == nil {
		return 0
	}
	return r.TTL
}

func grantedOf(r *clientv3.LeaseTimeToLiveResponse) int64 {
	if r == nil {
		return 0
	}
	return r.GrantedTTL
}

func need(args []string, n int) {
	if len(args) < n {
		fail(2, "%s needs %d arguments", args[0], n-1)
	}
}

func fail(code int, format string, a ...any) {
	fmt.Fprintf(os.Stderr, "etcdcheck: "+format+"\n", a...)
	os.Exit(code)
}
