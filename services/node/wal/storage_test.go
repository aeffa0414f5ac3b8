package wal_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
	"github.com/streamwal/streamwal/services/node/wal"
)

// storageEnv is an env whose backend archives and whose WALs run with
// recovery storage on a store shared by every WAL of the test.
type storageEnv struct {
	*env
	js    *jetstream.JetStream
	store recovery.Store
	shard shard.Config
	// retain is the WALs' retention (default: never truncate).
	retain time.Duration
}

// newStorageEnv starts a server for t.
func newStorageEnv(t *testing.T, store recovery.Store) *storageEnv {
	e := newEnv(t)
	js, err := jetstream.New(e.nc, e.codec, jetstream.Options{Archive: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.Close() })
	e.backend = js
	if store == nil {
		store = recovery.NewMemory()
	}
	return &storageEnv{env: e, js: js, store: store, retain: -1}
}

// storageConfig is the WAL configuration of term with recovery storage.
func (e *storageEnv) storageConfig(term uint64) wal.Config {
	c := e.config(term)
	c.Storage = &wal.Storage{Store: e.store, Tiers: e.js, Shard: e.shard, Retain: e.retain,
		TruncateInterval: 50 * time.Millisecond, Cadence: recovery.Cadence{Interval: 50 * time.Millisecond, Dirty: 100}}
	c.SyncInterval = 20 * time.Millisecond
	return c
}

// openStorage opens the WAL of term with recovery storage.
func (e *storageEnv) openStorage(term uint64) *wal.WAL {
	e.t.Helper()
	w, err := wal.Open(context.Background(), e.storageConfig(term))
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = w.Close() })
	return w
}

// waitFor waits until cond holds, for at most 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCheckpointShortensReplay: a WAL closed gracefully persists its
// checkpoint; the next owner replays only from there, with the
// collection and its segments restored.
func TestCheckpointShortensReplay(t *testing.T) {
	e := newStorageEnv(t, nil)
	ctx := context.Background()
	v := e.vchannel(1)
	w1 := e.openStorage(1)
	e.createCollection(w1, v, 7)
	var last *messages.ImmutableMessage
	for i := range 500 {
		m, err := w1.Append(ctx, e.insert(v, fmt.Sprint("row ", i), messages.WithDML(7, 1)))
		require.NoError(t, err)
		require.NotZero(t, m.Header().DML.SegmentID, "insert %d has no segment", i)
		last = m
	}
	require.NoError(t, w1.Close())
	st, _ := w1.StorageState()
	require.GreaterOrEqual(t, st.Persisted.Consumed, last.ID(), "the final round persisted what landed")

	w2 := e.openStorage(2)
	r := w2.Recovered()
	require.NotZero(t, r.From, "replay started from the checkpoint")
	require.Less(t, r.Replayed, 20, "replayed %d messages after a graceful close", r.Replayed)
	st2, ok := w2.StorageState()
	require.True(t, ok)
	require.Equal(t, st.VChannels, st2.VChannels)
	require.Len(t, st2.Segments, 1)
	require.Equal(t, uint64(500), st2.Segments[0].Rows)
	// The restored lifecycle still refuses a dropped partition and takes
	// inserts into the live one, into the same growing segment.
	m, err := w2.Append(ctx, e.insert(v, "after", messages.WithDML(7, 1)))
	require.NoError(t, err)
	require.Equal(t, st2.Segments[0].ID, m.Header().DML.SegmentID)
	_, err = w2.Append(ctx, e.insert(v, "nowhere", messages.WithDML(8, 1)))
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
}

// TestSegmentsFlushAndTruncation: with a small capacity, inserts fill
// segments that seal, flush to the object store and let truncation pass
// them; every insert is in exactly one segment, created before its first
// insert and flushed after its last; and the log stays readable from its
// first message.
func TestSegmentsFlushAndTruncation(t *testing.T) {
	e := newStorageEnv(t, nil)
	e.shard = shard.Config{Capacity: 4 << 10, Jitter: -1}
	e.retain = 0
	ctx := context.Background()
	v := e.vchannel(1)
	w := e.openStorage(1)
	e.createCollection(w, v)
	const n = 300
	var acked []*messages.ImmutableMessage
	for i := range n {
		m, err := w.Append(ctx, e.insert(v, fmt.Sprintf("row %04d %0100d", i, i)))
		require.NoError(t, err)
		acked = append(acked, m)
	}
	waitFor(t, "segments flushed and the stream truncated", func() bool {
		st, _ := w.StorageState()
		flushed := 0
		for _, s := range st.Segments {
			if s.State == shard.Flushed {
				flushed++
			}
		}
		s, err := e.js.State(ctx, e.p)
		return err == nil && flushed >= 5 && s.First > acked[n/2].ID()
	})
	manifests, err := e.js.Segments(ctx, v)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(manifests), 5)

	// Read everything from the first message: archive, then stream.
	sc, err := e.backend.Read(ctx, e.p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	require.NoError(t, err)
	defer sc.Close()
	created := map[int64]messages.MessageID{}
	flushedAt := map[int64]messages.MessageID{}
	inSegment := map[messages.MessageID]int64{}
	var prev messages.MessageID
	var prevTT messages.TimeTick
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for prev < acked[n-1].ID() {
		m, err := sc.Next(rctx)
		require.NoError(t, err)
		require.Greater(t, m.ID(), prev, "ids strictly increase")
		require.Greater(t, m.TimeTick(), prevTT, "timeticks strictly increase")
		prev, prevTT = m.ID(), m.TimeTick()
		switch m.Type() {
		case messages.TypeCreateSegment:
			var b messages.CreateSegmentBody
			require.NoError(t, m.Body(&b))
			created[b.SegmentID] = m.ID()
		case messages.TypeFlush:
			var b messages.FlushBody
			require.NoError(t, m.Body(&b))
			require.Equal(t, string(shard.ReasonCapacity), b.Reason)
			for _, id := range b.SegmentIDs {
				if _, dup := flushedAt[id]; !dup {
					flushedAt[id] = m.ID()
				}
			}
		case messages.TypeInsert:
			seg := m.Header().DML.SegmentID
			c, ok := created[seg]
			require.True(t, ok, "insert %d in segment %d, created before it", m.ID(), seg)
			require.Less(t, c, m.ID())
			_, after := flushedAt[seg]
			require.False(t, after, "insert %d after its segment %d flushed", m.ID(), seg)
			inSegment[m.ID()] = seg
		}
	}
	for _, a := range acked {
		require.Contains(t, inSegment, a.ID(), "acknowledged insert %d read back", a.ID())
	}
	require.Len(t, inSegment, n)
	// Each flushed manifest holds exactly the inserts of its segment.
	for _, mf := range manifests {
		_, msgs, err := e.js.ReadSegment(ctx, v, mf.Segment)
		require.NoError(t, err)
		for _, m := range msgs {
			require.Equal(t, mf.Segment, inSegment[m.ID()])
		}
		count := 0
		for _, seg := range inSegment {
			if seg == mf.Segment {
				count++
			}
		}
		require.Equal(t, count, len(msgs), "segment %d", mf.Segment)
	}
}

// TestHistoryLossIsRefusedUntilAccepted: a stream that holds less than
// the checkpoint says was handed out is refused with ErrHistoryLost; once
// an operator accepts the loss, the WAL continues above every MessageID
// handed out.
func TestHistoryLossIsRefusedUntilAccepted(t *testing.T) {
	e := newStorageEnv(t, nil)
	ctx := context.Background()
	v := e.vchannel(1)
	w1 := e.openStorage(1)
	e.createCollection(w1, v)
	for i := range 20 {
		_, err := w1.Append(ctx, e.insert(v, fmt.Sprint(i)))
		require.NoError(t, err)
	}
	require.NoError(t, w1.Close())
	st, _ := w1.StorageState()
	// Pretend the stream was longer than it is (its tail was cut): the
	// checkpoint says more was handed out.
	pers := recovery.NewPersister(e.store, e.p, 1, "n1")
	snap, found, err := pers.Load(ctx)
	require.NoError(t, err)
	require.True(t, found)
	snap.Checkpoint.Reached = st.Persisted.Consumed + 50
	require.NoError(t, pers.Persist(ctx, snap))

	_, err = wal.Open(ctx, e.storageConfig(2))
	require.ErrorIs(t, err, streamwal.ErrHistoryLost)
	s, err := e.js.State(ctx, e.p)
	require.NoError(t, err)
	require.Equal(t, st.Persisted.Consumed, s.Last, "a refused open writes nothing")

	require.NoError(t, recovery.WriteAcceptLoss(ctx, e.store, e.p, recovery.AcceptLoss{By: "test", At: time.Now()}))
	w3 := e.openStorage(3)
	require.Greater(t, w3.Barrier().ID(), st.Persisted.Consumed+50, "continues above every ID handed out")
	m, err := w3.Append(ctx, e.insert(v, "after the loss"))
	require.NoError(t, err)
	require.Greater(t, m.ID(), w3.Barrier().ID())
	_, found, err = recovery.ReadAcceptLoss(ctx, e.store, e.p)
	require.NoError(t, err)
	require.False(t, found, "the consent is used once")
}

// TestOpenTransactionHoldsItsSegmentAcrossOwners: a transaction still
// open when its WAL changes owner keeps its segment from being flushed
// until it ends, on the new owner too.
func TestOpenTransactionHoldsItsSegmentAcrossOwners(t *testing.T) {
	e := newStorageEnv(t, nil)
	e.shard = shard.Config{Capacity: 2 << 10, Jitter: -1}
	ctx := context.Background()
	v := e.vchannel(1)
	w1 := e.openStorage(1)
	e.createCollection(w1, v, 1, 2)
	tc, err := w1.BeginTxn(ctx, v, time.Minute)
	require.NoError(t, err)
	body, err := w1.Append(ctx, e.insert(v, fmt.Sprintf("%03000d", 1), messages.WithDML(1, 1), messages.WithTxn(tc)))
	require.NoError(t, err)
	held := body.Header().DML.SegmentID
	require.NoError(t, w1.Close())
	st1, _ := w1.StorageState()
	for _, s := range st1.Segments {
		require.NotEqual(t, shard.Flushed, s.State, "segment %d flushed by the first owner", s.ID)
	}

	w2 := e.openStorage(2)
	// Partition 2 fills a segment of its own, which the policies seal and
	// flush: they ran, and left the held one alone.
	other, err := w2.Append(ctx, e.insert(v, fmt.Sprintf("%03000d", 2), messages.WithDML(2, 1)))
	require.NoError(t, err)
	state := func(id int64) shard.State {
		st, _ := w2.StorageState()
		for _, s := range st.Segments {
			if s.ID == id {
				return s.State
			}
		}
		return 0
	}
	waitFor(t, "the other segment flushed", func() bool { return state(other.Header().DML.SegmentID) == shard.Flushed })
	require.NotEqual(t, shard.Flushed, state(held), "a segment an open transaction holds is not flushed")
	_, err = w2.CommitTxn(ctx, v, tc)
	require.NoError(t, err)
	waitFor(t, "the held segment flushed once its transaction ended", func() bool { return state(held) == shard.Flushed })
}
