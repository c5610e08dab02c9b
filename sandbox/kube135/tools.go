//go:build tools

// Package kube135 only records which upstream commands kubebin builds from this module (go build
// k8s.io/kubernetes/cmd/<name>), so that go mod tidy keeps their dependencies.
package kube135

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
