package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// protobufPrefix starts every protobuf value kube-apiserver stores.
var protobufPrefix = []byte("k8s\x00")

// decoded is one stored value, decoded.
type decoded struct {
	// Encoding is "protobuf", "json" or "raw" (not a Kubernetes object).
	Encoding string
	GVK      schema.GroupVersionKind
	// Object is the value as a JSON-compatible document.
	Object any
}

// decodeValue decodes a stored value: the protobuf envelope with the
// built-in scheme, JSON as it is; anything else is reported raw.
func decodeValue(v []byte) (decoded, error) {
	if bytes.HasPrefix(v, protobufPrefix) {
		return decodeProtobuf(v)
	}
	var doc map[string]any
	if err := json.Unmarshal(v, &doc); err == nil {
		d := decoded{Encoding: "json", Object: doc}
		av, _ := doc["apiVersion"].(string)
		k, _ := doc["kind"].(string)
		if gv, err := schema.ParseGroupVersion(av); err == nil {
			d.GVK = gv.WithKind(k)
		}
		return d, nil
	}
	return decoded{Encoding: "raw", Object: map[string]any{"raw": v}}, nil
}

func decodeProtobuf(v []byte) (decoded, error) {
	var unk runtime.Unknown
	if err := unk.Unmarshal(v[len(protobufPrefix):]); err != nil {
		return decoded{}, fmt.Errorf("not a kube protobuf envelope: %w", err)
	}
	gv, err := schema.ParseGroupVersion(unk.APIVersion)
	if err != nil {
		return decoded{}, fmt.Errorf("envelope apiVersion %q: %w", unk.APIVersion, err)
	}
	d := decoded{Encoding: "protobuf", GVK: gv.WithKind(unk.Kind)}
	if !scheme.Scheme.Recognizes(d.GVK) {
		d.Object = map[string]any{"apiVersion": unk.APIVersion, "kind": unk.Kind, "raw": unk.Raw}
		return d, nil
	}
	s := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	obj, _, err := s.Decode(v, &d.GVK, nil)
	if err != nil {
		return decoded{}, fmt.Errorf("decode %s: %w", d.GVK, err)
	}
	// Stored objects carry no TypeMeta; print it as kubectl does.
	obj.GetObjectKind().SetGroupVersionKind(d.GVK)
	b, err := json.Marshal(obj)
	if err != nil {
		return decoded{}, err
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		return decoded{}, err
	}
	d.Object = doc
	return d, nil
}

// render prints a decoded value as "yaml" or "json".
func render(d decoded, format string) ([]byte, error) {
	switch format {
	case "json":
		return json.MarshalIndent(d.Object, "", "  ")
	case "yaml":
		return yaml.Marshal(d.Object)
	}
	return nil, fmt.Errorf("unknown output format %q (yaml or json)", format)
}
