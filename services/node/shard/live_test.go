package shard_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/shard"
)

func TestConfigDefaultsAndJitter(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	for _, tc := range []struct {
		name string
		cfg  shard.Config
		u    float64
		want uint64
	}{
		{"default capacity, no draw", shard.Config{}, 0, shard.DefaultCapacity},
		{"default jitter, half draw", shard.Config{}, 0.5, 117440512 - 5872025},
		{"default jitter, largest draw", shard.Config{}, math.Nextafter(1, 0), 117440512 - 11744051},
		{"jitter off", shard.Config{Capacity: 1000, Jitter: -1}, 0.9, 1000},
		{"full jitter", shard.Config{Capacity: 1000, Jitter: 1}, 0.25, 750},
		{"draw out of range", shard.Config{Capacity: 1000, Jitter: 0.5}, 7, 1000},
		{"capacity off", shard.Config{Capacity: shard.Off}, 0.5, shard.Off},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Rand = fixed(tc.u)
			m := newManager(t, tc.cfg)
			require.NoError(t, m.Create(v, 0, 1, t0))
			require.Equal(t, tc.want, seg(t, m, 1).Capacity)
		})
	}
	for _, bad := range []float64{1.5, math.NaN(), math.Inf(1)} {
		_, err := shard.New(shard.Config{Jitter: bad})
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "jitter %v", bad)
	}
}

func TestCreateAndGrowing(t *testing.T) {
	s := newStream(t)
	v, w := s.vs[0], s.vs[1]
	m := newManager(t, shard.Config{})
	_, ok := m.Growing(v, 0)
	require.False(t, ok)

	require.NoError(t, m.Create(v, -3, 10, t0))
	id, ok := m.Growing(v, 0)
	require.True(t, ok)
	require.Equal(t, int64(10), id)
	id, ok = m.Growing(v, -1)
	require.True(t, ok, "every partition <= 0 is partition 0")
	require.Equal(t, int64(10), id)
	_, ok = m.Growing(w, 0)
	require.False(t, ok, "another vchannel")
	_, ok = m.Growing(v, 7)
	require.False(t, ok, "another partition")

	got := seg(t, m, 10)
	require.Equal(t, shard.Segment{ID: 10, VChannel: v, Partition: 0, State: shard.Growing, Created: t0, LastInsert: t0, Capacity: got.Capacity}, got)

	err := m.Create(v, 0, 11, t0)
	require.ErrorIs(t, err, shard.ErrGrowingExists)
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
	err = m.Create(w, 0, 10, t0)
	require.ErrorIs(t, err, shard.ErrIDUsed)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.ErrorIs(t, m.Create(s.cc, 0, 12, t0), shard.ErrMalformed)
	require.ErrorIs(t, m.Create(streamwal.VChannel{}, 0, 12, t0), shard.ErrMalformed)
	require.ErrorIs(t, m.Create(w, 0, 0, t0), shard.ErrMalformed)

	require.NoError(t, m.Create(v, 7, 12, t0))
	m.SealPartition(v, 0, shard.ReasonManual)
	require.NoError(t, m.Create(v, 0, 13, t0), "a sealed segment does not block a new one")
	id, _ = m.Growing(v, 0)
	require.Equal(t, int64(13), id)
	g, sealed, flushed := m.Counts()
	require.Equal(t, []int{2, 1, 0}, []int{g, sealed, flushed})
}

func TestStampAndResolve(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.ErrorIs(t, m.Stamp(99, 1, 1, 0, t0), shard.ErrUnknownSegment)

	for i := range 3 {
		require.NoError(t, m.Stamp(1, 10, 100, 0, t0.Add(time.Duration(i)*time.Second)))
	}
	got := seg(t, m, 1)
	require.Equal(t, 3, got.InFlight)
	require.Equal(t, uint64(30), got.StampedRows)
	require.Equal(t, uint64(300), got.StampedBytes)
	require.Equal(t, t0.Add(2*time.Second), got.LastInsert)
	require.Zero(t, got.Rows)

	// Resolved out of stream order: First..Last still bound them.
	m.Resolve(1, 10, 100, true, 9, 900)
	m.Resolve(1, 10, 100, false, 0, 0)
	m.Resolve(1, 10, 100, true, 7, 700)
	m.Resolve(1, 10, 100, true, 5, 500) // no stamp left in flight: ignored
	m.Resolve(42, 1, 1, true, 5, 500)   // unknown: ignored
	got = seg(t, m, 1)
	require.Zero(t, got.InFlight)
	require.Zero(t, got.StampedRows)
	require.Zero(t, got.StampedBytes)
	require.Equal(t, uint64(20), got.Rows)
	require.Equal(t, uint64(200), got.Bytes)
	require.Equal(t, messages.MessageID(7), got.First)
	require.Equal(t, messages.MessageID(9), got.Last)
	require.Equal(t, messages.TimeTick(700), got.FirstTT)
	require.Equal(t, messages.TimeTick(900), got.LastTT)
}

func TestNoInsertAfterSeal(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(v, 3, 1, t0))
	require.NoError(t, m.Stamp(1, 1, 1, 0, t0))
	m.SealVChannel(v, shard.ReasonManual)
	_, ok := m.Growing(v, 3)
	require.False(t, ok)
	err := m.Stamp(1, 1, 1, 0, t0)
	require.ErrorIs(t, err, shard.ErrSealed)
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
	// The insert stamped before the seal still resolves into it.
	m.Resolve(1, 1, 1, true, 4, 4)
	got := seg(t, m, 1)
	require.Equal(t, shard.Sealed, got.State)
	require.Equal(t, shard.ReasonManual, got.Reason)
	require.Equal(t, uint64(1), got.Rows)
}

func TestSealScopes(t *testing.T) {
	s := newStream(t)
	v, w := s.vs[0], s.vs[2]
	m := newManager(t, noClock(shard.Config{}))
	for i, k := range []struct {
		v streamwal.VChannel
		p int64
	}{{v, 0}, {v, 1}, {v, 2}, {w, 0}, {w, 1}} {
		require.NoError(t, m.Create(k.v, k.p, int64(i+1), t0))
	}
	m.SealPartition(v, 1, shard.ReasonLifecycle)
	m.SealPartition(v, 9, shard.ReasonLifecycle) // none there
	require.Equal(t, map[int64]shard.State{1: shard.Growing, 2: shard.Sealed, 3: shard.Growing, 4: shard.Growing, 5: shard.Growing}, states(m))
	m.SealVChannel(v, shard.ReasonManual)
	require.Equal(t, map[int64]shard.State{1: shard.Sealed, 2: shard.Sealed, 3: shard.Sealed, 4: shard.Growing, 5: shard.Growing}, states(m))
	require.Equal(t, shard.ReasonLifecycle, seg(t, m, 2).Reason, "a second seal keeps the first reason")
	m.SealAll(shard.ReasonFlushAll)
	require.Equal(t, shard.ReasonFlushAll, seg(t, m, 5).Reason)
	g, sealed, _ := m.Counts()
	require.Equal(t, []int{0, 5}, []int{g, sealed})
}

func states(m *shard.Manager) map[int64]shard.State {
	out := map[int64]shard.State{}
	for _, s := range m.Segments() {
		out[s.ID] = s.State
	}
	return out
}

func TestReadyWaitsForInFlightInserts(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Stamp(1, 1, 10, 0, t0))
	require.NoError(t, m.Stamp(1, 1, 10, 0, t0))
	require.Empty(t, m.Ready(), "growing")
	m.SealVChannel(v, shard.ReasonManual)
	require.Empty(t, m.Ready(), "two inserts in flight")
	m.Resolve(1, 1, 10, true, 2, 2)
	require.Empty(t, m.Ready(), "one insert in flight")
	m.Resolve(1, 1, 10, false, 0, 0)
	require.Equal(t, []shard.Flush{{VChannel: v, CollectionID: 42, Segments: []int64{1}, Reason: shard.ReasonManual}}, m.Ready())
	require.Empty(t, m.Ready(), "handed out once")
	require.True(t, seg(t, m, 1).HandedOut)
}

func TestReadyWaitsForTransactions(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Stamp(1, 1, 10, 7, t0))
	require.NoError(t, m.Stamp(1, 1, 10, 7, t0))
	require.NoError(t, m.Stamp(1, 1, 10, 8, t0))
	m.Resolve(1, 1, 10, true, 2, 2)
	m.Resolve(1, 1, 10, true, 3, 3)
	m.Resolve(1, 1, 10, true, 4, 4)
	require.Equal(t, 2, seg(t, m, 1).Holds)
	m.SealAll(shard.ReasonFlushAll)
	require.Empty(t, m.Ready())
	m.TxnEnded(7)
	require.Empty(t, m.Ready(), "txn 8 still holds it")
	m.TxnEnded(99) // unknown: nothing
	m.TxnEnded(8)
	require.Len(t, m.Ready(), 1)
	require.Zero(t, seg(t, m, 1).Holds)
}

func TestTxnHoldsEverySegmentItTouched(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(v, 1, 1, t0))
	require.NoError(t, m.Create(v, 2, 2, t0))
	require.NoError(t, m.Stamp(1, 1, 10, 5, t0))
	require.NoError(t, m.Stamp(2, 1, 10, 5, t0))
	m.Resolve(1, 1, 10, true, 1, 1)
	m.Resolve(2, 1, 10, true, 2, 2)
	m.SealVChannel(v, shard.ReasonManual)
	require.Empty(t, m.Ready())
	m.TxnEnded(5)
	require.Equal(t, []shard.Flush{{VChannel: v, CollectionID: 42, Segments: []int64{1, 2}, Reason: shard.ReasonManual}}, m.Ready())
}

func TestReadyGroupsByVChannelAndReason(t *testing.T) {
	s := newStream(t)
	v, w := s.vs[0], s.vs[2]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(w, 0, 1, t0))
	require.NoError(t, m.Create(v, 0, 2, t0))
	require.NoError(t, m.Create(v, 1, 3, t0))
	require.NoError(t, m.Create(v, 2, 4, t0))
	require.NoError(t, m.Create(w, 1, 5, t0))
	m.SealPartition(v, 1, shard.ReasonLifecycle)
	m.SealAll(shard.ReasonFlushAll)
	require.Equal(t, []shard.Flush{
		{VChannel: w, CollectionID: 43, Segments: []int64{1, 5}, Reason: shard.ReasonFlushAll},
		{VChannel: v, CollectionID: 42, Segments: []int64{2, 4}, Reason: shard.ReasonFlushAll},
		{VChannel: v, CollectionID: 42, Segments: []int64{3}, Reason: shard.ReasonLifecycle},
	}, m.Ready())
}

func TestFlushFailedAndLanded(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Create(v, 1, 2, t0))
	m.SealVChannel(v, shard.ReasonManual)
	fs := m.Ready()
	require.Len(t, fs, 1)
	require.Equal(t, messages.FlushBody{CollectionID: 42, SegmentIDs: []int64{1, 2}, Reason: "manual"}, fs[0].Body())

	m.FlushFailed(fs[0])
	again := m.Ready()
	require.Equal(t, fs, again, "given back, handed out again")
	require.Empty(t, m.Ready())

	require.ErrorIs(t, m.MarkFlushed(1), shard.ErrFlushPending)
	require.ErrorIs(t, m.FlushLanded(again[0], 0), streamwal.ErrInvalidArgument)
	require.NoError(t, m.FlushLanded(again[0], 40))
	m.FlushFailed(again[0]) // too late: landed
	require.Empty(t, m.Ready())
	got := seg(t, m, 1)
	require.Equal(t, messages.MessageID(40), got.FlushedAt)
	require.False(t, got.HandedOut)

	require.NoError(t, m.MarkFlushed(1))
	require.NoError(t, m.MarkFlushed(1), "again: nothing")
	require.ErrorIs(t, m.MarkFlushed(77), shard.ErrUnknownSegment)
	require.Equal(t, shard.Flushed, seg(t, m, 1).State)
	g, sealed, flushed := m.Counts()
	require.Equal(t, []int{0, 1, 1}, []int{g, sealed, flushed})

	m.Forget(2) // sealed: kept
	m.Forget(1)
	_, ok := m.Segment(1)
	require.False(t, ok)
	require.Len(t, m.Segments(), 1)
	require.ErrorIs(t, m.Create(v, 0, 1, t0), shard.ErrIDUsed, "a forgotten id stays used")
	require.NoError(t, m.Create(v, 0, 3, t0))
}

func TestMarkFlushedNeedsFlushOut(t *testing.T) {
	s := newStream(t)
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(s.vs[0], 0, 1, t0))
	err := m.MarkFlushed(1)
	require.ErrorIs(t, err, shard.ErrFlushPending)
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
}

func TestCreateFailed(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Stamp(1, 1, 1, 0, t0))
	m.CreateFailed(1)
	m.CreateFailed(99)
	_, ok := m.Growing(v, 0)
	require.False(t, ok, "inserts go to a new segment")
	require.Equal(t, shard.ReasonCreateFailed, seg(t, m, 1).Reason)
	require.Empty(t, m.Ready())
	m.Resolve(1, 1, 1, false, 0, 0)
	require.Equal(t, []shard.Flush{{VChannel: v, CollectionID: 42, Segments: []int64{1}, Reason: shard.ReasonCreateFailed}}, m.Ready())
}

func TestDropped(t *testing.T) {
	s := newStream(t)
	v, w := s.vs[0], s.vs[1]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Create(v, 1, 2, t0))
	require.NoError(t, m.Create(w, 0, 3, t0))
	m.SealPartition(v, 1, shard.ReasonManual)
	require.ErrorIs(t, m.Dropped(v, 0), streamwal.ErrInvalidArgument)
	require.NoError(t, m.Dropped(v, 12))
	require.Empty(t, m.Ready(), "no Flush after DropCollection")
	for _, id := range []int64{1, 2} {
		got := seg(t, m, id)
		require.Equal(t, shard.Sealed, got.State)
		require.Equal(t, messages.MessageID(12), got.FlushedAt)
		require.NoError(t, m.MarkFlushed(id))
	}
	require.Equal(t, shard.ReasonLifecycle, seg(t, m, 1).Reason)
	require.Equal(t, shard.ReasonManual, seg(t, m, 2).Reason)
	require.Equal(t, shard.Growing, seg(t, m, 3).State, "the other shard lives on")
}

func TestErrorsMatchTheirSentinels(t *testing.T) {
	m := newManager(t, shard.Config{})
	err := m.Stamp(1, 1, 1, 0, t0)
	require.True(t, errors.Is(err, shard.ErrUnknownSegment))
	require.Equal(t, streamwal.CodeInvalidArgument, streamwal.CodeOf(err))
}
