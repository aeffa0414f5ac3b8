// Package rotate is the driver of the benchmarks that compare paths (the
// WAL against a raw publish, a remote client against a local one...) in
// the same run: every path runs once a round, in an order that rotates
// each round, so that no path always runs first on a fresh disk or last
// behind the others' writeback, and a burst of load from elsewhere on the
// machine falls on all alike. A path's rate is its operations over its
// total time.
package rotate

import "time"

// Rounds runs every path with n operations once a round, rounds times,
// path (i+r) mod len(paths) i-th in round r, and returns each path's total
// time, by the index of paths.
func Rounds(paths []func(n int) time.Duration, rounds, n int) []time.Duration {
	took := make([]time.Duration, len(paths))
	for r := range rounds {
		for i := range paths {
			k := (i + r) % len(paths)
			took[k] += paths[k](n)
		}
	}
	return took
}

// Rate is ops operations per second over d.
func Rate(ops int, d time.Duration) float64 { return float64(ops) / d.Seconds() }
