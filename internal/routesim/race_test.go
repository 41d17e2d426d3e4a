//go:build race

package routesim

// raceEnabled shortens the routing table under the race detector, which
// slows the simulation tenfold without finding more in it.
const raceEnabled = true
