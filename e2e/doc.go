// Package e2e holds the tests that run Grid beside the real parts it is
// built around, each built from its own Go module under parts/ and started
// as a process on loopback: llm-d-inference-sim (the vLLM simulator),
// etcd and kube-apiserver (a real control plane), and the Gateway API
// Inference Extension's endpoint picker. It is a module of its own so the
// product's module does not carry their dependencies.
//
// Run from this directory: go test -count=1 ./...
package e2e
