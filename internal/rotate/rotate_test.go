package rotate_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/internal/rotate"
)

// TestRounds checks the order of the calls (each round starts one path
// later), the n each path is given and the total time each path returns.
func TestRounds(t *testing.T) {
	var order []int
	path := func(i int) func(n int) time.Duration {
		return func(n int) time.Duration {
			require.Equal(t, 7, n)
			order = append(order, i)
			return time.Duration(i+1) * time.Millisecond
		}
	}
	took := rotate.Rounds([]func(int) time.Duration{path(0), path(1), path(2)}, 4, 7)
	require.Equal(t, []int{0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2}, order)
	require.Equal(t, []time.Duration{4 * time.Millisecond, 8 * time.Millisecond, 12 * time.Millisecond}, took)
}

// TestRoundsOfNothing runs no path when there are no rounds or no paths.
func TestRoundsOfNothing(t *testing.T) {
	calls := 0
	one := func(int) time.Duration { calls++; return time.Second }
	require.Equal(t, []time.Duration{0}, rotate.Rounds([]func(int) time.Duration{one}, 0, 5))
	require.Empty(t, rotate.Rounds(nil, 3, 5))
	require.Zero(t, calls)
}

// TestRate is operations per second.
func TestRate(t *testing.T) {
	require.InDelta(t, 2000.0, rotate.Rate(1000, 500*time.Millisecond), 1e-9)
}
