// Package layering holds no code: its test keeps the architecture's import
// rules (docs/protocol.md §1). The gateway side (gateway, loadstore, route)
// and the operator side (operator, backend, readiness, latency) share only
// the signals contract, identity and the neutral packages below them;
// signals depends on no package of either side nor on config; nothing
// imports cmd/.
package layering
