package main

import (
	"bytes"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
)

// storedProtobuf encodes obj as kube-apiserver stores it.
func storedProtobuf(t *testing.T, obj *corev1.ConfigMap) []byte {
	t.Helper()
	obj.APIVersion, obj.Kind = "v1", "ConfigMap"
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(obj, &buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(buf.Bytes(), []byte("k8s\x00")) {
		t.Fatalf("the serializer did not write the envelope: %q", buf.Bytes()[:8])
	}
	return buf.Bytes()
}

func TestDecodeProtobufEnvelope(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "default", UID: "u-1"}, Data: map[string]string{"k": "v"}}
	d, err := decodeValue(storedProtobuf(t, cm))
	if err != nil {
		t.Fatal(err)
	}
	if d.Encoding != "protobuf" || d.GVK.Kind != "ConfigMap" || d.GVK.Version != "v1" {
		t.Fatalf("decoded %+v", d)
	}
	y, err := render(d, "yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"apiVersion: v1", "kind: ConfigMap", "name: x", "namespace: default", "k: v"} {
		if !strings.Contains(string(y), want) {
			t.Fatalf("YAML lacks %q:\n%s", want, y)
		}
	}
}

func TestDecodeJSONAndOthers(t *testing.T) {
	d, err := decodeValue([]byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}`))
	if err != nil || d.Encoding != "json" || d.GVK.Group != "example.com" || d.GVK.Kind != "Widget" {
		t.Fatalf("JSON custom resource: %+v %v", d, err)
	}
	j, err := render(d, "json")
	if err != nil || !strings.Contains(string(j), `"name": "w"`) {
		t.Fatalf("JSON output %s %v", j, err)
	}
	// An envelope of a kind the built-in scheme does not know keeps its
	// type and raw bytes.
	unk := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "example.com/v1", Kind: "Gizmo"}, Raw: []byte{1, 2, 3}}
	b, err := unk.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	g, err := decodeValue(append([]byte("k8s\x00"), b...))
	if err != nil || g.Encoding != "protobuf" || g.GVK.Kind != "Gizmo" {
		t.Fatalf("unknown kind: %+v %v", g, err)
	}
	if m := g.Object.(map[string]any); m["kind"] != "Gizmo" || !bytes.Equal(m["raw"].([]byte), []byte{1, 2, 3}) {
		t.Fatalf("unknown kind printed as %v", m)
	}
	if d, err := decodeValue([]byte("k8s\x00\xff\xff")); err == nil {
		t.Fatalf("a corrupt envelope decoded: %+v", d)
	}
	if d, err := decodeValue([]byte("plain bytes")); err != nil || d.Encoding != "raw" {
		t.Fatalf("a non-object value: %+v %v", d, err)
	}
	if _, err := render(d, "xml"); err == nil {
		t.Fatal("an unknown output format was accepted")
	}
}
