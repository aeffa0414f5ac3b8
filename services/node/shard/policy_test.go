package shard_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/shard"
)

func TestCapacitySealsAtTheInsertThatFillsIt(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{Capacity: 1000}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Stamp(1, 1, 600, 0, t0))
	m.Resolve(1, 1, 600, true, 1, 1)
	require.NoError(t, m.Stamp(1, 1, 399, 0, t0))
	require.Equal(t, shard.Growing, seg(t, m, 1).State, "999 of 1000")
	require.NoError(t, m.Stamp(1, 1, 1, 0, t0), "in flight counts")
	got := seg(t, m, 1)
	require.Equal(t, shard.Sealed, got.State)
	require.Equal(t, shard.ReasonCapacity, got.Reason)
	require.Equal(t, uint64(400), got.StampedBytes, "the filling insert is in it")
	require.ErrorIs(t, m.Stamp(1, 1, 1, 0, t0), shard.ErrSealed)
}

func TestCapacityIsTheSegmentsOwn(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	// Capacities 1000*(1-0.5*0.5) = 750 and 1000*(1-0.5*0) = 1000.
	m := newManager(t, noClock(shard.Config{Capacity: 1000, Jitter: 0.5, Rand: fixed(0.5, 0)}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Create(v, 1, 2, t0))
	require.Equal(t, uint64(750), seg(t, m, 1).Capacity)
	require.Equal(t, uint64(1000), seg(t, m, 2).Capacity)
	require.NoError(t, m.Stamp(1, 1, 800, 0, t0))
	require.NoError(t, m.Stamp(2, 1, 800, 0, t0))
	require.Equal(t, shard.Sealed, seg(t, m, 1).State)
	require.Equal(t, shard.Growing, seg(t, m, 2).State)
}

func TestCapacityByTick(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{Capacity: 1000}))
	// A segment restored from metadata written under a larger capacity.
	require.NoError(t, m.Restore([]shard.Segment{{ID: 1, VChannel: v, State: shard.Growing, Bytes: 5000, Capacity: 4000, Created: t0, LastInsert: t0}}, 10))
	m.Tick(t0)
	require.Equal(t, shard.ReasonCapacity, seg(t, m, 1).Reason)
}

func TestCapacityOff(t *testing.T) {
	s := newStream(t)
	m := newManager(t, noClock(shard.Config{Capacity: shard.Off}))
	require.NoError(t, m.Create(s.vs[0], 0, 1, t0))
	require.NoError(t, m.Stamp(1, 1, 1<<62, 0, t0))
	m.Tick(t0)
	require.Equal(t, shard.Growing, seg(t, m, 1).State)
}

func TestRows(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{MaxRows: 10}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Stamp(1, 6, 1, 0, t0))
	m.Resolve(1, 6, 1, true, 1, 1)
	require.NoError(t, m.Stamp(1, 3, 1, 0, t0))
	require.Equal(t, shard.Growing, seg(t, m, 1).State)
	require.NoError(t, m.Stamp(1, 1, 1, 0, t0))
	require.Equal(t, shard.ReasonRows, seg(t, m, 1).Reason)

	for _, rows := range []uint64{0, shard.Off} {
		m := newManager(t, noClock(shard.Config{MaxRows: rows}))
		require.NoError(t, m.Create(v, 0, 1, t0))
		require.NoError(t, m.Stamp(1, 1<<40, 1, 0, t0))
		m.Tick(t0)
		require.Equal(t, shard.Growing, seg(t, m, 1).State, "rows off (%d)", rows)
	}
}

func TestLifetime(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, shard.Config{Lifetime: time.Hour, Idle: -1})
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Stamp(1, 1, 1, 0, t0.Add(50*time.Minute)))
	m.Tick(t0.Add(time.Hour - time.Millisecond))
	require.Equal(t, shard.Growing, seg(t, m, 1).State, "inserts do not extend the lifetime, but it is not over")
	m.Tick(t0.Add(time.Hour))
	require.Equal(t, shard.ReasonLifetime, seg(t, m, 1).Reason)

	def := newManager(t, shard.Config{Idle: -1})
	require.NoError(t, def.Create(v, 0, 1, t0))
	def.Tick(t0.Add(24*time.Hour - time.Second))
	require.Equal(t, shard.Growing, seg(t, def, 1).State)
	def.Tick(t0.Add(24 * time.Hour))
	require.Equal(t, shard.ReasonLifetime, seg(t, def, 1).Reason, "default 24 h")

	off := newManager(t, shard.Config{Lifetime: -1, Idle: -1})
	require.NoError(t, off.Create(v, 0, 1, t0))
	off.Tick(t0.Add(1000 * time.Hour))
	require.Equal(t, shard.Growing, seg(t, off, 1).State)
}

func TestIdle(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, shard.Config{Idle: 10 * time.Minute, IdleMinBytes: 100, Lifetime: -1})
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Create(v, 1, 2, t0))
	require.NoError(t, m.Stamp(1, 1, 150, 0, t0))
	require.NoError(t, m.Stamp(2, 1, 50, 0, t0))
	m.Tick(t0.Add(time.Hour))
	require.Equal(t, shard.Growing, seg(t, m, 1).State, "in flight bytes do not count for idle")
	m.Resolve(1, 1, 150, true, 1, 1)
	m.Resolve(2, 1, 50, true, 2, 2)

	require.NoError(t, m.Stamp(1, 1, 1, 0, t0.Add(time.Hour)))
	m.Resolve(1, 1, 1, true, 3, 3)
	m.Tick(t0.Add(time.Hour + 10*time.Minute - time.Millisecond))
	require.Equal(t, shard.Growing, seg(t, m, 1).State, "an insert restarts the idle clock")
	m.Tick(t0.Add(time.Hour + 10*time.Minute))
	require.Equal(t, shard.ReasonIdle, seg(t, m, 1).Reason)
	require.Equal(t, shard.Growing, seg(t, m, 2).State, "below IdleMinBytes")

	for _, cfg := range []shard.Config{{Idle: -1, Lifetime: -1, IdleMinBytes: 1}, {Lifetime: -1, IdleMinBytes: shard.Off}} {
		m := newManager(t, cfg)
		require.NoError(t, m.Create(v, 0, 1, t0))
		require.NoError(t, m.Stamp(1, 1, 64<<20, 0, t0))
		m.Resolve(1, 1, 64<<20, true, 1, 1)
		m.Tick(t0.Add(100 * time.Hour))
		require.Equal(t, shard.Growing, seg(t, m, 1).State, "idle off: %+v", cfg)
	}

	def := newManager(t, shard.Config{Lifetime: -1})
	require.NoError(t, def.Create(v, 0, 1, t0))
	require.NoError(t, def.Stamp(1, 1, 16<<20, 0, t0))
	def.Resolve(1, 1, 16<<20, true, 1, 1)
	def.Tick(t0.Add(10*time.Minute - time.Millisecond))
	require.Equal(t, shard.Growing, seg(t, def, 1).State)
	def.Tick(t0.Add(10 * time.Minute))
	require.Equal(t, shard.ReasonIdle, seg(t, def, 1).Reason, "default 10 min with 16 MiB")
}

func TestTickPolicyOrder(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, shard.Config{Capacity: 1000, Jitter: -1, Lifetime: time.Minute, Idle: time.Minute, IdleMinBytes: 1})
	require.NoError(t, m.Restore([]shard.Segment{{ID: 1, VChannel: v, State: shard.Growing, Bytes: 1000, Capacity: 1000, Created: t0, LastInsert: t0}}, 1))
	m.Tick(t0.Add(time.Hour))
	require.Equal(t, shard.ReasonCapacity, seg(t, m, 1).Reason, "capacity comes before lifetime and idle")
}

// fill creates segment id on partition p of the first VChannel and lands
// bytes into it.
func fill(t *testing.T, m *shard.Manager, s *stream, p, id int64, bytes uint64) {
	t.Helper()
	require.NoError(t, m.Create(s.vs[0], p, id, t0))
	require.NoError(t, m.Stamp(id, 1, bytes, 0, t0))
	m.Resolve(id, 1, bytes, true, messages.MessageID(id), messages.TimeTick(id))
}

func TestMemorySealsTheLargestFirst(t *testing.T) {
	s := newStream(t)
	mem := shard.NewMemory(1000, 500)
	a := newManager(t, noClock(shard.Config{Memory: mem}))
	b := newManager(t, noClock(shard.Config{Memory: mem}))
	fill(t, a, s, 0, 1, 100)
	fill(t, a, s, 1, 2, 400)
	fill(t, a, s, 2, 3, 300)
	fill(t, b, s, 0, 4, 200)
	require.Equal(t, uint64(1000), mem.Growing())
	a.Tick(t0)
	require.Equal(t, shard.Growing, seg(t, a, 2).State, "at the high water mark, not above")

	fill(t, b, s, 1, 5, 100)
	require.Equal(t, uint64(1100), mem.Growing())
	b.Tick(t0)
	// b seals its own largest first: 4 (200) leaves 900, 5 (100) leaves
	// 800, and then it has nothing left to seal.
	require.Equal(t, shard.ReasonMemory, seg(t, b, 4).Reason)
	require.Equal(t, shard.ReasonMemory, seg(t, b, 5).Reason)
	require.Equal(t, uint64(800), mem.Growing())

	a.Tick(t0)
	require.Equal(t, shard.Growing, seg(t, a, 2).State, "not above the high water mark any more")
	fill(t, a, s, 3, 6, 250)
	require.Equal(t, uint64(1050), mem.Growing())
	a.Tick(t0)
	// 2 (400) leaves 650, 3 (300) leaves 350 <= 500: 6 and 1 stay.
	require.Equal(t, map[int64]shard.State{1: shard.Growing, 2: shard.Sealed, 3: shard.Sealed, 6: shard.Growing}, states(a))
	require.Equal(t, shard.ReasonMemory, seg(t, a, 3).Reason)
	require.Equal(t, uint64(350), mem.Growing())
	require.Equal(t, uint64(1000), mem.High())
	require.Equal(t, uint64(500), mem.Low())
}

func TestMemoryTiesGoToTheOldest(t *testing.T) {
	s := newStream(t)
	mem := shard.NewMemory(100, 0)
	require.Equal(t, uint64(75), mem.Low(), "default low water: 3/4 of high")
	m := newManager(t, noClock(shard.Config{Memory: mem}))
	fill(t, m, s, 0, 3, 60)
	fill(t, m, s, 1, 2, 60)
	m.Tick(t0)
	require.Equal(t, map[int64]shard.State{2: shard.Sealed, 3: shard.Growing}, states(m))
}

func TestMemoryAccount(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	mem := shard.NewMemory(0, 0)
	m := newManager(t, noClock(shard.Config{Memory: mem}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Stamp(1, 1, 100, 0, t0))
	require.NoError(t, m.Stamp(1, 1, 50, 0, t0))
	require.Equal(t, uint64(150), mem.Growing(), "stamped bytes count")
	m.Resolve(1, 1, 50, false, 0, 0)
	require.Equal(t, uint64(100), mem.Growing(), "lost bytes leave")
	m.Resolve(1, 1, 100, true, 1, 1)
	require.Equal(t, uint64(100), mem.Growing(), "landed bytes stay")
	require.NoError(t, m.Stamp(1, 1, 10, 0, t0))
	m.SealVChannel(v, shard.ReasonManual)
	require.Zero(t, mem.Growing(), "a sealed segment leaves the account at once")
	m.Resolve(1, 1, 10, true, 2, 2)
	require.Zero(t, mem.Growing())
	m.Tick(t0)
	require.Zero(t, mem.Growing(), "high 0: the policy is off")

	require.NoError(t, m.Create(v, 0, 2, t0))
	require.NoError(t, m.Stamp(2, 1, 70, 0, t0))
	require.NoError(t, m.Restore(nil, 0))
	require.Zero(t, mem.Growing(), "Restore gives back what the old state counted")
	require.NoError(t, m.Restore([]shard.Segment{{ID: 3, VChannel: v, State: shard.Growing, Bytes: 30}, {ID: 4, VChannel: v, Partition: 1, State: shard.Sealed, Bytes: 40}}, 0))
	require.Equal(t, uint64(30), mem.Growing(), "restored growing segments count")
}

func TestMemoryLowAboveHigh(t *testing.T) {
	mem := shard.NewMemory(100, 500)
	require.Equal(t, uint64(100), mem.Low())
}
