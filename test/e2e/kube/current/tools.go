//go:build tools

// Package build only pins the Kubernetes commands run.sh builds.
package build

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
