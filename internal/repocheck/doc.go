// Package repocheck holds no code: its tests keep rules about the repository
// itself. The import rules of the architecture (docs/protocol.md §1): the
// gateway side (gateway, loadstore, route) and the operator side (operator,
// backend, readiness, latency) share only the signals contract, identity and
// the neutral packages below them; signals depends on no package of either
// side nor on config; nothing imports cmd/. And the rules of the
// documentation: every link and every cited file exists, and every cited
// section of docs/protocol.md is there.
package repocheck
