package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	var (
		server    = flag.String("server", "https://127.0.0.1:26443", "kube-apiserver URL")
		token     = flag.String("token", "", "bearer token")
		namespace = flag.String("namespace", "bench", "namespace to create the objects in (created if missing)")
		kind      = flag.String("kind", "configmaps", "configmaps or pods")
		count     = flag.Int("count", 5000, "objects to create")
		clients   = flag.Int("clients", 16, "concurrent clients")
		size      = flag.Int("size", 1024, "bytes of payload per object (configmap data or a pod annotation)")
		prefix    = flag.String("prefix", "obj", "object name prefix")
		timeout   = flag.Duration("timeout", 30*time.Minute, "give up after this long")
	)
	flag.Parse()
	if *kind != "configmaps" && *kind != "pods" {
		fmt.Fprintln(os.Stderr, "kubeload: --kind must be configmaps or pods")
		os.Exit(2)
	}
	if *count < 1 || *clients < 1 {
		fmt.Fprintln(os.Stderr, "kubeload: --count and --clients must be positive")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c := &client{
		base:  strings.TrimRight(*server, "/"),
		token: *token,
		http: &http.Client{Timeout: time.Minute, Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, // the e2e apiserver's self-signed cert on loopback
			MaxIdleConnsPerHost: *clients,
			ForceAttemptHTTP2:   true,
		}},
	}
	if err := c.ensureNamespace(ctx, *namespace); err != nil {
		fmt.Fprintln(os.Stderr, "kubeload:", err)
		os.Exit(2)
	}
	res := run(ctx, c, *namespace, *kind, *prefix, *count, *clients, strings.Repeat("x", *size))
	fmt.Println(res)
	if res.errors > 0 {
		fmt.Fprintf(os.Stderr, "kubeload: %d creates failed; first: %s\n", res.errors, res.firstErr)
		os.Exit(1)
	}
}

// client is a minimal kube-apiserver client.
type client struct {
	base, token string
	http        *http.Client
}

// do sends one request with a JSON body and returns the status and body.
func (c *client) do(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// ensureNamespace creates the namespace and its default service account
// (pods need it; no controller-manager runs in the benchmark).
func (c *client) ensureNamespace(ctx context.Context, ns string) error {
	steps := []struct {
		path string
		obj  map[string]any
	}{
		{"/api/v1/namespaces", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}},
		{"/api/v1/namespaces/" + ns + "/serviceaccounts", map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "default"}}},
	}
	for _, s := range steps {
		code, body, err := c.do(ctx, http.MethodPost, s.path, s.obj)
		if err != nil {
			return err
		}
		if code != http.StatusCreated && code != http.StatusConflict {
			return fmt.Errorf("POST %s: %d %s", s.path, code, body)
		}
	}
	return nil
}

// object returns the i-th object of kind.
func object(kind, name, payload string) map[string]any {
	meta := map[string]any{"name": name, "labels": map[string]any{"app": "kubeload"}}
	if kind == "configmaps" {
		return map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": map[string]any{"payload": payload}}
	}
	meta["annotations"] = map[string]any{"kubeload/payload": payload}
	return map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": meta,
		"spec": map[string]any{"containers": []any{map[string]any{
			"name": "pause", "image": "registry.k8s.io/pause:3.10",
			"resources": map[string]any{"requests": map[string]any{"cpu": "10m", "memory": "16Mi"}},
		}}},
	}
}

// result is one load run's outcome.
type result struct {
	kind             string
	objects, errors  int
	elapsed          time.Duration
	latencies        []time.Duration
	firstErr         string
	clients, payload int
}

func (r result) String() string {
	slices.Sort(r.latencies)
	q := func(p float64) float64 {
		if len(r.latencies) == 0 {
			return 0
		}
		return float64(r.latencies[int(p*float64(len(r.latencies)-1))].Microseconds()) / 1000
	}
	return fmt.Sprintf("RESULT kind=%s objects=%d clients=%d seconds=%.2f objects_per_s=%.0f p50_ms=%.1f p90_ms=%.1f p99_ms=%.1f max_ms=%.1f errors=%d",
		r.kind, r.objects, r.clients, r.elapsed.Seconds(), float64(r.objects)/r.elapsed.Seconds(), q(0.5), q(0.9), q(0.99), q(1), r.errors)
}

// run creates count objects with clients workers.
func run(ctx context.Context, c *client, ns, kind, prefix string, count, clients int, payload string) result {
	var next, done atomic.Int64
	var mu sync.Mutex
	res := result{kind: kind, clients: clients, payload: len(payload)}
	path := "/api/v1/namespaces/" + ns + "/" + kind
	start := time.Now()
	stop := make(chan struct{})
	go progress(stop, &done, count, start)
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			var errs int
			var first string
			for {
				i := next.Add(1) - 1
				if i >= int64(count) || ctx.Err() != nil {
					break
				}
				t0 := time.Now()
				code, body, err := c.do(ctx, http.MethodPost, path, object(kind, fmt.Sprintf("%s-%06d", prefix, i), payload))
				d := time.Since(t0)
				if err == nil && code != http.StatusCreated {
					err = errors.New(fmt.Sprint(code, " ", strings.TrimSpace(string(body))))
				}
				if err != nil {
					errs++
					if first == "" {
						first = err.Error()
					}
				} else {
					lat = append(lat, d)
				}
				done.Add(1)
			}
			mu.Lock()
			res.latencies = append(res.latencies, lat...)
			res.objects += len(lat)
			res.errors += errs
			if res.firstErr == "" {
				res.firstErr = first
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	close(stop)
	return res
}

// progress prints done/count once a second until stop closes.
func progress(stop <-chan struct{}, done *atomic.Int64, count int, start time.Time) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			fmt.Fprintln(os.Stderr)
			return
		case <-t.C:
			n := done.Load()
			fmt.Fprintf(os.Stderr, "\rkubeload: %d/%d (%.0f/s)   ", n, count, float64(n)/time.Since(start).Seconds())
		}
	}
}
