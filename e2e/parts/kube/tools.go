//go:build tools

// Package kube pins the control plane the e2e tests run: kube-apiserver
// from the k8s.io/kubernetes module and etcd at the version that module
// pins. The replace lines point the kubernetes module's staging
// directories at the published k8s.io modules of the same release.
package kube

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
