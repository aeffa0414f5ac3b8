package shard_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/shard"
)

func TestApplyCreateInsertFlush(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	c := s.create(v, 5, 100)
	applyAll(t, m, s.msgs)
	id, ok := m.Growing(v, 5)
	require.True(t, ok)
	require.Equal(t, int64(100), id)

	s.now = t0.Add(time.Minute)
	i1 := s.insert(v, 5, 100, 3, 30, 0)
	s.timeTick()
	i2 := s.insert(v, 5, 100, 4, 40, 0)
	s.now = t0.Add(2 * time.Minute)
	f := s.flush(v, shard.ReasonIdle, 100)
	applyAll(t, m, s.msgs[1:])

	got := seg(t, m, 100)
	require.Equal(t, shard.Segment{
		ID: 100, VChannel: v, Partition: 5, State: shard.Sealed,
		Rows: 7, Bytes: 70, First: i1.ID(), Last: i2.ID(), FirstTT: i1.TimeTick(), LastTT: i2.TimeTick(),
		Created: c.TimeTick().Physical(), LastInsert: i2.TimeTick().Physical(),
		Capacity: got.Capacity, Reason: shard.ReasonIdle, FlushedAt: f.ID(),
	}, got)
	require.Empty(t, m.Ready(), "its Flush landed")
	require.Equal(t, f.ID(), m.Applied())
	require.NoError(t, m.MarkFlushed(100))
}

func TestApplySealMessages(t *testing.T) {
	s := newStream(t)
	v, v1, w := s.vs[0], s.vs[1], s.vs[2]
	m := newManager(t, noClock(shard.Config{}))
	s.create(v, 0, 1)
	s.create(v, 1, 2)
	s.create(v1, 0, 3)
	s.create(w, 0, 4)
	s.create(w, 2, 5)
	s.dropPartition(v, 1)
	s.manualFlush(v1)
	applyAll(t, m, s.msgs)
	require.Equal(t, map[int64]shard.State{1: shard.Growing, 2: shard.Sealed, 3: shard.Sealed, 4: shard.Growing, 5: shard.Growing}, states(m))
	require.Equal(t, shard.ReasonLifecycle, seg(t, m, 2).Reason)
	require.Equal(t, shard.ReasonManual, seg(t, m, 3).Reason)

	n := len(s.msgs)
	s.truncate(w)
	applyAll(t, m, s.msgs[n:])
	require.Equal(t, shard.ReasonLifecycle, seg(t, m, 4).Reason)
	require.Equal(t, shard.ReasonLifecycle, seg(t, m, 5).Reason)
	require.Zero(t, seg(t, m, 4).FlushedAt, "truncate: a Flush follows")

	n = len(s.msgs)
	d := s.dropCollection(v)
	s.create(w, 0, 6)
	s.flushAll()
	applyAll(t, m, s.msgs[n:])
	for _, id := range []int64{1, 2} {
		got := seg(t, m, id)
		require.Equal(t, shard.Sealed, got.State)
		require.Equal(t, d.ID(), got.FlushedAt, "DropCollection flushes out its vchannel")
	}
	require.Equal(t, shard.ReasonFlushAll, seg(t, m, 6).Reason)
	require.Equal(t, []shard.Flush{
		{VChannel: v1, CollectionID: 42, Segments: []int64{3}, Reason: shard.ReasonManual},
		{VChannel: w, CollectionID: 43, Segments: []int64{4, 5}, Reason: shard.ReasonLifecycle},
		{VChannel: w, CollectionID: 43, Segments: []int64{6}, Reason: shard.ReasonFlushAll},
	}, m.Ready())
}

func TestApplyNeverFailsTheCaller(t *testing.T) {
	s := newStream(t)
	v, w := s.vs[0], s.vs[1]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Apply(s.create(v, 0, 1)))

	err := m.Apply(s.insert(v, 0, 99, 1, 10, 0))
	require.ErrorIs(t, err, shard.ErrUnknownSegment)
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
	require.ErrorIs(t, m.Apply(s.insert(w, 0, 1, 1, 10, 0)), shard.ErrUnknownSegment, "segment of another vchannel")
	require.Len(t, m.Segments(), 1, "creates nothing")

	require.NoError(t, m.Apply(s.insert(v, 0, 0, 1, 10, 0)), "no segment: nothing to count")
	require.NoError(t, m.Apply(s.insert(v, 0, 1, 1, 10, 0)))
	err = m.Apply(s.flush(v, shard.ReasonManual, 1, 98))
	require.ErrorIs(t, err, shard.ErrUnknownSegment)
	require.Equal(t, shard.Sealed, seg(t, m, 1).State, "the known segment is flushed out anyway")

	err = m.Apply(s.insert(v, 0, 1, 1, 10, 0))
	require.ErrorIs(t, err, shard.ErrSealed, "an insert after the flush")
	require.Equal(t, uint64(1), seg(t, m, 1).Rows, "not counted")

	require.ErrorIs(t, m.Apply(nil), streamwal.ErrInvalidArgument)
	mm, err := s.c.NewBody(messages.TypeCreateSegment, v, messages.CreateSegmentBody{SegmentID: 5})
	require.NoError(t, err)
	require.ErrorIs(t, m.Apply(mm.Freeze(0)), shard.ErrMalformed, "no message id")
}

func TestApplyMalformedBodies(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	for _, msg := range []*messages.ImmutableMessage{
		s.body(messages.TypeCreateSegment, v, messages.CreateSegmentBody{CollectionID: 42, SegmentID: 0}),
		s.body(messages.TypeCreateSegment, v, messages.CreateSegmentBody{CollectionID: 7, SegmentID: 3}),
		s.dropPartition(v, 0),
	} {
		err := m.Apply(msg)
		require.ErrorIs(t, err, shard.ErrMalformed, "%s", msg.Type())
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	}
	require.Empty(t, m.Segments())
	require.NoError(t, m.Apply(s.body(messages.TypeCreateSegment, v, messages.CreateSegmentBody{SegmentID: 3})), "collection 0: the vchannel's")
}

func TestApplyIgnoresTheCChannel(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	applyAll(t, m, []*messages.ImmutableMessage{s.create(v, 0, 1), s.dropCollection(s.cc), s.truncate(s.cc)})
	require.Equal(t, shard.Growing, seg(t, m, 1).State)
}

func TestApplyReplacedGrowingSegment(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	// The writer sealed 1 by a policy (no message), created 2, and wrote
	// 1's Flush once its inserts resolved.
	applyAll(t, m, []*messages.ImmutableMessage{s.create(v, 0, 1), s.insert(v, 0, 1, 1, 10, 0), s.create(v, 0, 2), s.insert(v, 0, 2, 1, 10, 0)})
	require.Equal(t, map[int64]shard.State{1: shard.Sealed, 2: shard.Growing}, states(m))
	require.Equal(t, shard.ReasonReplaced, seg(t, m, 1).Reason)
	id, _ := m.Growing(v, 0)
	require.Equal(t, int64(2), id)
	require.NoError(t, m.Apply(s.flush(v, shard.ReasonCapacity, 1)))
	require.Equal(t, shard.ReasonCapacity, seg(t, m, 1).Reason, "the Flush names the reason")
	require.Equal(t, shard.Growing, seg(t, m, 2).State)
}

func TestApplyIsIdempotent(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	s.create(v, 0, 1)
	s.insert(v, 0, 1, 2, 20, 0)
	s.create(v, 3, 2)
	s.insert(v, 3, 2, 2, 20, 0)
	s.manualFlush(v)
	s.flush(v, shard.ReasonManual, 1, 2)
	s.create(v, 0, 3)
	s.insert(v, 0, 3, 2, 20, 0)

	once := newManager(t, noClock(shard.Config{}))
	applyAll(t, once, s.msgs)
	twice := newManager(t, noClock(shard.Config{}))
	applyAll(t, twice, s.msgs)
	applyAll(t, twice, s.msgs)
	applyAll(t, twice, s.msgs[3:])
	require.Equal(t, once.Segments(), twice.Segments())
	require.Equal(t, shard.Growing, seg(t, twice, 3).State, "the re-read ManualFlush does not seal the newer segment")
}

func TestApplyCapacityIsDerivedFromTheID(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	cfg := shard.Config{Capacity: 1000, Jitter: 0.5}
	a, b := newManager(t, cfg), newManager(t, cfg)
	for id := int64(1); id <= 20; id++ {
		msg := s.create(v, id, id)
		require.NoError(t, a.Apply(msg))
		require.NoError(t, b.Apply(msg))
	}
	require.Equal(t, a.Segments(), b.Segments())
	seen := map[uint64]bool{}
	for _, sg := range a.Segments() {
		require.GreaterOrEqual(t, sg.Capacity, uint64(500))
		require.LessOrEqual(t, sg.Capacity, uint64(1000))
		seen[sg.Capacity] = true
	}
	require.Greater(t, len(seen), 10, "jittered")
}

func TestApplyTxnHolds(t *testing.T) {
	s := newStream(t)
	v, w := s.vs[0], s.vs[1]
	m := newManager(t, noClock(shard.Config{}))
	s.create(v, 0, 1)
	s.create(w, 0, 2)
	s.insert(v, 0, 1, 1, 10, 7)
	s.insert(v, 0, 1, 1, 10, 8)
	s.insert(w, 0, 2, 1, 10, 9)
	applyAll(t, m, s.msgs)
	require.Equal(t, 2, seg(t, m, 1).Holds)
	require.Equal(t, 1, seg(t, m, 2).Holds)

	require.NoError(t, m.Apply(s.txnEnd(messages.TypeCommitTxn, v, 7)))
	require.NoError(t, m.Apply(s.txnEnd(messages.TypeRollbackTxn, v, 8)))
	require.Zero(t, seg(t, m, 1).Holds, "commit and rollback release")
	require.NoError(t, m.Apply(s.manualFlush(w)))
	require.Zero(t, seg(t, m, 2).Holds, "an exclusive operation on its vchannel aborts the transaction")
	require.Len(t, m.Ready(), 1)
}

func TestApplyTxnHoldsExpire(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	s.create(v, 0, 1)
	s.insert(v, 0, 1, 1, 10, 7) // keepalive 10 s
	s.now = t0.Add(8 * time.Second)
	s.insert(v, 0, 1, 1, 10, 7) // refreshes it
	applyAll(t, m, s.msgs)
	s.now = t0.Add(18 * time.Second)
	require.NoError(t, m.Apply(s.timeTick()))
	require.Equal(t, 1, seg(t, m, 1).Holds, "refreshed at 8 s: alive through 18 s")
	s.now = t0.Add(18*time.Second + time.Millisecond)
	require.NoError(t, m.Apply(s.timeTick()))
	require.Zero(t, seg(t, m, 1).Holds, "expired")
}

func TestApplyExclusivePChannelAbortsEveryTxn(t *testing.T) {
	s := newStream(t)
	v, w := s.vs[0], s.vs[2]
	m := newManager(t, noClock(shard.Config{}))
	s.create(v, 0, 1)
	s.create(w, 0, 2)
	s.insert(v, 0, 1, 1, 10, 7)
	s.insert(w, 0, 2, 1, 10, 8)
	s.flushAll()
	applyAll(t, m, s.msgs)
	require.Len(t, m.Ready(), 2)
}

func TestLiveTxnHoldsDoNotExpireByApply(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Stamp(1, 1, 1, 7, t0))
	s.now = t0.Add(time.Hour)
	require.NoError(t, m.Apply(s.timeTick()))
	require.Equal(t, 1, seg(t, m, 1).Holds, "the live side's holds end with TxnEnded only")
	m.TxnEnded(7)
	require.Zero(t, seg(t, m, 1).Holds)
}

func TestFlushOutDropsHolds(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	m := newManager(t, noClock(shard.Config{}))
	require.NoError(t, m.Create(v, 0, 1, t0))
	require.NoError(t, m.Create(v, 1, 2, t0))
	require.NoError(t, m.Stamp(1, 1, 1, 7, t0))
	require.NoError(t, m.Stamp(2, 1, 1, 7, t0))
	require.NoError(t, m.FlushLanded(shard.Flush{VChannel: v, Segments: []int64{1}, Reason: shard.ReasonManual}, 9))
	require.Zero(t, seg(t, m, 1).Holds)
	require.Equal(t, 1, seg(t, m, 2).Holds)
	require.NoError(t, m.MarkFlushed(1))
	m.Forget(1)
	m.TxnEnded(7)
	require.Zero(t, seg(t, m, 2).Holds)
}

func TestReplayFromCheckpointRestoresHolds(t *testing.T) {
	s := newStream(t)
	v := s.vs[0]
	s.create(v, 0, 1)
	s.insert(v, 0, 1, 1, 10, 7) // txn 7 stays open
	s.insert(v, 0, 1, 1, 10, 0)
	cut := s.insert(v, 0, 1, 1, 10, 0)
	a := newManager(t, noClock(shard.Config{}))
	applyAll(t, a, s.msgs)

	b := newManager(t, noClock(shard.Config{}))
	require.NoError(t, b.Restore(a.Segments(), cut.ID()))
	require.Zero(t, seg(t, b, 1).Holds)
	// The replay starts at the checkpoint's LastConfirmed, txn 7's insert.
	applyAll(t, b, s.msgs[1:])
	require.Equal(t, a.Segments(), b.Segments())
	require.Equal(t, 1, seg(t, b, 1).Holds)
	b.SealAll(shard.ReasonFlushAll)
	require.Empty(t, b.Ready())
	b.TxnEnded(7)
	require.Len(t, b.Ready(), 1)
}
