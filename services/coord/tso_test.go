package coord

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// epoch0 is an arbitrary wall-clock origin for the oracle's clock.
var epoch0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// hand reserves n TimeTicks at now, "persists" the bound it asks for and
// commits, as the tenure does; it returns the range and the bound asked for.
func hand(t require.TestingT, o *oracle, now time.Time, n uint32) (first, last, persist messages.TimeTick) {
	first, last, persist, err := o.reserve(now, n)
	require.NoError(t, err)
	o.commit(last, persist)
	return first, last, persist
}

func TestOracleStrictlyIncreasing(t *testing.T) {
	o := newOracle(0)
	now := epoch0
	var prev messages.TimeTick
	for i, n := range []uint32{1, 1, 10, wire.MaxTSOCount, 3, 1} {
		first, last, _ := hand(t, o, now, n)
		require.Greater(t, first, prev, "batch %d", i)
		require.Equal(t, messages.TimeTick(n), last-first+1, "batch %d is n consecutive TimeTicks", i)
		require.LessOrEqual(t, last, o.bound, "batch %d handed out above the bound", i)
		prev = last
		if i%2 == 1 {
			now = now.Add(time.Millisecond) // some batches in the same millisecond
		}
	}
	// The first TimeTick follows the clock.
	first, _, _ := hand(t, o, now.Add(time.Second), 1)
	require.Equal(t, messages.TimeTickAt(now.Add(time.Second)), first)
}

func TestOracleReserveDoesNotHandOut(t *testing.T) {
	// Until commit, nothing is handed out: a reserve whose bound could not
	// be persisted leaves the oracle as it was.
	o := newOracle(0)
	f1, l1, p1, err := o.reserve(epoch0, 5)
	require.NoError(t, err)
	f2, l2, p2, err := o.reserve(epoch0, 5)
	require.NoError(t, err)
	require.Equal(t, [3]messages.TimeTick{f1, l1, p1}, [3]messages.TimeTick{f2, l2, p2})
	require.Zero(t, o.last)
	require.Zero(t, o.bound)
}

func TestOraclePersistsBoundAhead(t *testing.T) {
	o := newOracle(0)
	now := epoch0

	// Past the (zero) bound: persist at least a window ahead of the clock.
	_, last, persist, err := o.reserve(now, 1)
	require.NoError(t, err)
	require.NotZero(t, persist)
	require.GreaterOrEqual(t, persist, last)
	require.GreaterOrEqual(t, persist, messages.TimeTickAt(now.Add(tsoWindow)))
	o.commit(last, persist)
	require.Equal(t, persist, o.bound)

	// Within the bound: nothing to persist, for many batches and until the
	// clock nears the bound.
	for _, d := range []time.Duration{0, time.Millisecond, time.Second, tsoWindow - time.Millisecond} {
		_, last, p, err := o.reserve(now.Add(d), 100)
		require.NoError(t, err)
		require.Zero(t, p, "at +%v", d)
		require.LessOrEqual(t, last, o.bound)
		o.commit(last, p)
	}

	// The clock passes the bound: a new one, a window ahead again.
	later := now.Add(tsoWindow + time.Millisecond)
	_, last, persist, err = o.reserve(later, 1)
	require.NoError(t, err)
	require.Greater(t, persist, o.bound)
	require.GreaterOrEqual(t, persist, last)
	require.GreaterOrEqual(t, persist, messages.TimeTickAt(later.Add(tsoWindow)))
	o.commit(last, persist)

	// A batch that itself runs past a window ahead of the clock: the
	// bound to persist is the batch's last TimeTick.
	far := messages.TimeTickAt(now.Add(time.Hour))
	o = newOracle(far)
	first, last, persist, err := o.reserve(now, wire.MaxTSOCount)
	require.NoError(t, err)
	require.Equal(t, far+1, first)
	require.Equal(t, last, persist)
}

func TestOracleClockStepsBack(t *testing.T) {
	o := newOracle(0)
	_, prev, _ := hand(t, o, epoch0, 10)
	for _, back := range []time.Duration{time.Millisecond, time.Second, time.Hour, 24 * time.Hour} {
		first, last, persist := hand(t, o, epoch0.Add(-back), 10)
		require.Greater(t, first, prev, "clock %v back", back)
		require.Zero(t, persist, "a clock behind needs no new bound while the batch fits under it")
		prev = last
	}
	// Back to the clock: still above everything handed out.
	first, _, _ := hand(t, o, epoch0, 1)
	require.Greater(t, first, prev)
}

func TestOracleStartsAbovePersistedBound(t *testing.T) {
	// A predecessor persisted bound (and may have handed out anything up to
	// it); the successor's clock is an hour behind.
	bound := messages.TimeTickAt(epoch0.Add(tsoWindow))
	o := newOracle(bound)
	behind := epoch0.Add(-time.Hour)
	first, last, persist, err := o.reserve(behind, 7)
	require.NoError(t, err)
	require.Equal(t, bound+1, first)
	require.Greater(t, persist, bound, "the successor must persist a bound above its predecessor's before handing out")
	require.GreaterOrEqual(t, persist, last)
	o.commit(last, persist)
	for range 100 {
		f, _, _ := hand(t, o, behind, 1000)
		require.Greater(t, f, bound)
	}
	// A successor of a successor that never handed out anything: still
	// above the first bound.
	o2 := newOracle(o.bound)
	f, _, _ := hand(t, o2, behind.Add(-time.Hour), 1)
	require.Greater(t, f, o.last)
}

func TestOracleInvalidCount(t *testing.T) {
	o := newOracle(0)
	for _, n := range []uint32{0, wire.MaxTSOCount + 1, ^uint32(0)} {
		_, _, _, err := o.reserve(epoch0, n)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "count %d", n)
	}
	_, _, _, err := o.reserve(epoch0, wire.MaxTSOCount)
	require.NoError(t, err)
}

// TestOracleModel drives oracles with a clock that wanders (forward and
// back, by up to hours) and random batch sizes, persists the bounds they
// ask for (sometimes failing to, in which case the range is not handed
// out), and takes over at random points with a new oracle started from the
// last persisted bound, whose clock may be far off its predecessor's. Every
// range handed out is n consecutive TimeTicks, above every earlier range,
// and at or below the bound persisted when it was handed out.
func TestOracleModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var persisted messages.TimeTick // the store
		o := newOracle(persisted)
		now := epoch0
		var handed messages.TimeTick // the largest TimeTick handed out
		ranges := 0
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0: // takeover: a new oracle from the persisted bound, on another clock
				now = now.Add(time.Duration(rapid.Int64Range(-int64(2*time.Hour), int64(2*time.Hour)).Draw(t, "skew")))
				o = newOracle(persisted)
				continue
			case 1: // the clock jumps
				now = now.Add(time.Duration(rapid.Int64Range(-int64(time.Hour), int64(time.Hour)).Draw(t, "jump")))
				continue
			}
			now = now.Add(time.Duration(rapid.Int64Range(-int64(50*time.Millisecond), int64(200*time.Millisecond)).Draw(t, "tick")))
			n := rapid.OneOf(rapid.Uint32Range(1, 16), rapid.Uint32Range(1, wire.MaxTSOCount)).Draw(t, "n")
			first, last, persist, err := o.reserve(now, n)
			require.NoError(t, err)
			if persist != 0 {
				require.GreaterOrEqual(t, persist, last, "bound below the batch")
				require.GreaterOrEqual(t, persist, messages.TimeTickAt(now.Add(tsoWindow)), "bound less than a window ahead")
				require.Greater(t, persist, persisted, "bound does not advance the persisted one")
				if rapid.IntRange(0, 9).Draw(t, "persistFails") == 0 {
					continue // the write failed: nothing handed out, nothing committed
				}
				persisted = persist
			} else {
				require.LessOrEqual(t, last, persisted, "no bound asked for a batch above the persisted one")
			}
			o.commit(last, persist)
			require.Equal(t, messages.TimeTick(n), last-first+1)
			require.Greater(t, first, handed, "range %d [%d, %d] overlaps or precedes an earlier one ending at %d", ranges, first, last, handed)
			require.LessOrEqual(t, last, persisted)
			handed = last
			ranges++
		}
	})
}
