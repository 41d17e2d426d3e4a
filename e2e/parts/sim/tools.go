//go:build tools

// Package sim pins the vLLM simulator the e2e tests run as a real engine:
// llm-d-inference-sim, built from its Go module with the dependencies its
// own go.mod chose (e2e/parts.go builds it).
package sim

import _ "github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim"
