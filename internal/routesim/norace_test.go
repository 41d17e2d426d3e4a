//go:build !race

package routesim

const raceEnabled = false
