package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestGetFromBrain stores a ConfigMap the way kube-apiserver does in a
// brain node and reads it back with "kubedecode get".
func TestGetFromBrain(t *testing.T) {
	s := testutil.StartBrain(t, server.Config{})
	cli := testutil.Client(t, testutil.Endpoint(s))
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "default"}, Data: map[string]string{"color": "blue"}}
	if _, err := cli.Put(context.Background(), "/registry/configmaps/default/x", string(storedProtobuf(t, cm))); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(context.Background(), "/registry/example.com/widgets/default/w", `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}`); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := rootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append(args, "--endpoints", testutil.Endpoint(s)))
		if err := cmd.Execute(); err != nil {
			t.Fatalf("kubedecode %v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	y := run("get", "/registry/configmaps/default/x")
	for _, want := range []string{"kind: ConfigMap", "color: blue", "protobuf"} {
		if !strings.Contains(y, want) {
			t.Fatalf("output lacks %q:\n%s", want, y)
		}
	}
	all := run("get", "/registry/", "--prefix", "-o", "json")
	if !strings.Contains(all, `"kind": "Widget"`) || !strings.Contains(all, `"color": "blue"`) {
		t.Fatalf("prefix output:\n%s", all)
	}
	keys := run("get", "/registry/", "--prefix", "--keys-only")
	if keys != "/registry/configmaps/default/x\n/registry/example.com/widgets/default/w\n" {
		t.Fatalf("keys: %q", keys)
	}
}
