//go:build tools

// Package epp pins the endpoint picker the e2e tests scrape: the Gateway
// API Inference Extension's EPP, built from its Go module with the
// dependencies its own go.mod chose. v1.5.0 is the last release with the
// full EPP (v1.6.0 keeps only the lightweight one); the llm-d router's
// module is not served by the Go module proxy here.
package epp

import _ "sigs.k8s.io/gateway-api-inference-extension/cmd/epp"
