// Command kubedecode reads the values kube-apiserver stores under
// /registry/ in brain (or any etcd) and prints them as YAML or JSON.
//
// kube-apiserver stores built-in objects in its protobuf envelope: the
// bytes "k8s\x00" followed by a runtime.Unknown message carrying the
// object's apiVersion, kind and protobuf encoding (seed 000, "Protobuf
// serialization and internal storage"). Custom resources and a few other
// objects are stored as JSON. kubedecode decodes both with client-go's
// scheme of built-in types; an envelope whose kind the scheme does not
// know is printed with its apiVersion, kind and raw bytes.
//
//	kubedecode get /registry/configmaps/default/x --endpoints 127.0.0.1:2379
//	kubedecode get /registry/pods/ --prefix -o json
//
// It is a separate module so that the server's module does not depend on
// the Kubernetes tree.
package main
