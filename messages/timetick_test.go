package messages_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// maxPhysical is the largest physical millisecond a TimeTick can carry
// (64 bits minus the logical bits).
const maxPhysical = int64(1)<<(64-messages.LogicalBits) - 1

func TestTimeTickLayout(t *testing.T) {
	require.Equal(t, 18, messages.LogicalBits)
	require.Equal(t, 1<<18-1, messages.MaxLogical)
	tt := mustTick(t, 1, 0)
	require.Equal(t, messages.TimeTick(1<<18), tt, "physical milliseconds shifted left 18 bits")
	tt = mustTick(t, 1, 5)
	require.Equal(t, messages.TimeTick(1<<18|5), tt)
	require.Equal(t, messages.TimeTick(0), mustTick(t, 0, 0))
}

func TestTimeTickRoundTrip(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		ms := rapid.Int64Range(0, maxPhysical).Draw(rt, "ms")
		logical := rapid.Uint32Range(0, messages.MaxLogical).Draw(rt, "logical")
		// Sub-millisecond parts are truncated.
		ns := rapid.Int64Range(0, int64(time.Millisecond)-1).Draw(rt, "ns")
		phys := time.UnixMilli(ms).Add(time.Duration(ns))
		tt, err := messages.NewTimeTick(phys, logical)
		require.NoError(rt, err)
		require.Equal(rt, ms, tt.PhysicalMillis())
		require.True(rt, tt.Physical().Equal(time.UnixMilli(ms)), "%v vs %v", tt.Physical(), time.UnixMilli(ms))
		require.Equal(rt, time.UTC, tt.Physical().Location())
		require.Equal(rt, logical, tt.Logical())
		// Wire form: decimal, parsed back exactly.
		s := strconv.FormatUint(uint64(tt), 10)
		back, err := messages.ParseTimeTick(s)
		require.NoError(rt, err)
		require.Equal(rt, tt, back)
		// TimeTickAt is the smallest tick of the millisecond.
		at := messages.TimeTickAt(phys)
		require.Equal(rt, ms, at.PhysicalMillis())
		require.Equal(rt, uint32(0), at.Logical())
		require.LessOrEqual(rt, at, tt)
		require.NotEmpty(rt, tt.String())
	})
}

func TestTimeTickOrdering(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		ms1 := rapid.Int64Range(0, maxPhysical).Draw(rt, "ms1")
		ms2 := rapid.Int64Range(0, maxPhysical).Draw(rt, "ms2")
		l1 := rapid.Uint32Range(0, messages.MaxLogical).Draw(rt, "l1")
		l2 := rapid.Uint32Range(0, messages.MaxLogical).Draw(rt, "l2")
		t1, err := messages.NewTimeTick(time.UnixMilli(ms1), l1)
		require.NoError(rt, err)
		t2, err := messages.NewTimeTick(time.UnixMilli(ms2), l2)
		require.NoError(rt, err)
		switch {
		case ms1 < ms2:
			require.Less(rt, t1, t2, "later physical time must give a larger TimeTick whatever the logical parts")
		case ms1 > ms2:
			require.Greater(rt, t1, t2)
		case l1 < l2:
			require.Less(rt, t1, t2, "same millisecond: ordered by logical")
		case l1 > l2:
			require.Greater(rt, t1, t2)
		default:
			require.Equal(rt, t1, t2)
		}
	})
}

func TestTimeTickExtremes(t *testing.T) {
	tt := mustTick(t, maxPhysical, messages.MaxLogical)
	require.Equal(t, messages.TimeTick(^uint64(0)), tt)
	require.Equal(t, maxPhysical, tt.PhysicalMillis())
	require.Equal(t, uint32(messages.MaxLogical), tt.Logical())

	require.Equal(t, messages.TimeTick(0), messages.TimeTickAt(time.UnixMilli(-5)), "before the epoch maps to 0")
	require.Equal(t, messages.TimeTick(0), messages.TimeTickAt(time.Unix(0, 0)))
	require.Equal(t, maxPhysical, messages.TimeTickAt(time.UnixMilli(maxPhysical+1000)).PhysicalMillis(), "clamped")

	// A real time of today.
	now := time.Now()
	tt = mustTick(t, now.UnixMilli(), 7)
	require.Equal(t, now.UnixMilli(), tt.Physical().UnixMilli())
	require.Contains(t, tt.String(), "+7")
	require.Contains(t, tt.String(), now.UTC().Format("2006-01-02T15:04:05"))
}

func TestTimeTickBounds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		phys    time.Time
		logical uint32
	}{
		{"before epoch", time.UnixMilli(-1), 0},
		{"far before epoch", time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC), 0},
		{"physical overflow", time.UnixMilli(maxPhysical + 1), 0},
		{"logical overflow", time.UnixMilli(1000), messages.MaxLogical + 1},
		{"logical max uint32", time.UnixMilli(1000), ^uint32(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := messages.NewTimeTick(tc.phys, tc.logical)
			requireInvalid(t, err, nil)
		})
	}
}

func TestParseTimeTickAndMessageID(t *testing.T) {
	good := map[string]uint64{
		"0":                    0,
		"1":                    1,
		"262144":               262144,
		"18446744073709551615": ^uint64(0),
	}
	for s, want := range good {
		tt, err := messages.ParseTimeTick(s)
		require.NoError(t, err, s)
		require.Equal(t, messages.TimeTick(want), tt)
		id, err := messages.ParseMessageID(s)
		require.NoError(t, err, s)
		require.Equal(t, messages.MessageID(want), id)
		require.Equal(t, s, id.String())
	}
	bad := []string{
		"", "-1", "+1", " 1", "1 ", "\t1", "1\n", "01", "00", "007", "1_000", "1e3", "0x10", "1.0",
		"18446744073709551616", "99999999999999999999", "١", "１", "-0", "+0",
	}
	for _, s := range bad {
		_, err := messages.ParseTimeTick(s)
		requireInvalid(t, err, nil)
		_, err = messages.ParseMessageID(s)
		requireInvalid(t, err, nil)
	}
}

func TestParseTimeTickProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.Uint64().Draw(rt, "n")
		s := strconv.FormatUint(n, 10)
		tt, err := messages.ParseTimeTick(s)
		require.NoError(rt, err)
		require.Equal(rt, messages.TimeTick(n), tt)
		id, err := messages.ParseMessageID(s)
		require.NoError(rt, err)
		require.Equal(rt, s, id.String())
		// Any decoration is refused.
		deco := rapid.SampledFrom([]string{"0", "+", "-", " "}).Draw(rt, "prefix")
		_, err = messages.ParseTimeTick(deco + s)
		require.ErrorIs(rt, err, streamwal.ErrInvalidArgument)
		_, err = messages.ParseMessageID(deco + s)
		require.ErrorIs(rt, err, streamwal.ErrInvalidArgument)
	})
}
