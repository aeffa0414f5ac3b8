package timetick_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/timetick"
)

// TestAckManagerModel checks the ack manager against a model: a set of
// allocated and a set of confirmed TimeTicks, the watermark being the
// largest T with every allocated TimeTick at or below T confirmed.
func TestAckManagerModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		start := messages.TimeTick(rapid.Uint64Range(0, 1000).Draw(t, "start"))
		m := timetick.NewAckManager(start)
		last := start
		allocated := map[messages.TimeTick]bool{}
		confirmed := map[messages.TimeTick]bool{}
		var open []messages.TimeTick
		for step := range rapid.IntRange(1, 200).Draw(t, "steps") {
			_ = step
			if len(open) == 0 || rapid.Bool().Draw(t, "allocate") {
				last += messages.TimeTick(rapid.Uint64Range(1, 5).Draw(t, "gap"))
				require.NoError(t, m.Allocate(last))
				allocated[last] = true
				open = append(open, last)
			} else {
				i := rapid.IntRange(0, len(open)-1).Draw(t, "which")
				tt := open[i]
				open = append(open[:i], open[i+1:]...)
				require.NoError(t, m.Confirm(tt))
				confirmed[tt] = true
				require.Error(t, m.Confirm(tt), "a second confirm must fail")
			}
			require.Equal(t, modelWatermark(start, last, allocated, confirmed), m.Watermark())
			require.Equal(t, len(open), m.Pending())
			require.Equal(t, last, m.Last())
		}
		require.Error(t, m.Allocate(last), "allocation must increase")
		require.Error(t, m.Confirm(last+1), "unknown timetick")
	})
}

// modelWatermark is the definition, computed the slow way.
func modelWatermark(start, last messages.TimeTick, allocated, confirmed map[messages.TimeTick]bool) messages.TimeTick {
	var pending []messages.TimeTick
	for tt := range allocated {
		if !confirmed[tt] {
			pending = append(pending, tt)
		}
	}
	if len(pending) == 0 {
		return last
	}
	sort.Slice(pending, func(i, j int) bool { return pending[i] < pending[j] })
	return pending[0] - 1
}

// steppingClock returns times that jump back and forth.
type steppingClock struct {
	times []time.Time
	i     int
}

func (c *steppingClock) now() time.Time {
	t := c.times[c.i%len(c.times)]
	c.i++
	return t
}

func TestLocalOracleNeverGoesBackwards(t *testing.T) {
	base := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := &steppingClock{times: []time.Time{base, base.Add(-time.Hour), base.Add(time.Millisecond), base.Add(-time.Minute)}}
	o := timetick.NewLocalOracle(clock.now)
	ctx := context.Background()
	var prevEnd messages.TimeTick
	for i := 0; i < 100; i++ {
		n := uint32(1 + i%7)
		first, err := o.Allocate(ctx, n)
		require.NoError(t, err)
		require.Greater(t, first, prevEnd)
		prevEnd = first + messages.TimeTick(n) - 1
	}
	require.GreaterOrEqual(t, prevEnd.Physical(), base, "follows the clock's high point")
	_, err := o.Allocate(ctx, 0)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, err = o.Allocate(ctx, timetick.MaxBatch+1)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

func TestAllocatorStrictlyIncreasesAcrossBatches(t *testing.T) {
	ctx := context.Background()
	a, err := timetick.NewAllocator(timetick.NewLocalOracle(nil), 3)
	require.NoError(t, err)
	var prev messages.TimeTick
	for i := 0; i < 50; i++ {
		if i == 20 {
			a.Reset()
		}
		tt, err := a.Next(ctx)
		require.NoError(t, err)
		require.Greater(t, tt, prev)
		prev = tt
	}
	_, err = timetick.NewAllocator(nil, 3)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	b, _ := timetick.NewAllocator(timetick.NewLocalOracle(nil), 3)
	_, err = b.Next(canceled)
	require.ErrorIs(t, err, context.Canceled)
}
