package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// snap is a round through message n: consumed n, TimeTick 1000+n, replay
// from n-1, one VChannel whose schema version is n, and segment metadata
// naming n.
func snap(n uint64) Snapshot {
	return Snapshot{
		Checkpoint: Checkpoint{
			TimeTick:  messages.TimeTick(1000 + n),
			MessageID: messages.MessageID(max(n, 1) - 1),
			Consumed:  messages.MessageID(n),
			Digest:    fmt.Sprintf("d%d", n),
			Reached:   messages.MessageID(n + 2),
		},
		VChannels: []VChannelMeta{{VChannel: "pchan-3_42v0", CollectionID: 42, State: StateNormal,
			Partitions: []int64{1, 2}, SchemaVersion: n}},
		Segments: json.RawMessage(fmt.Sprintf(`[{"id":%d}]`, n)),
	}
}

// owner returns a persister of term that loaded and claimed.
func owner(t testing.TB, s Store, p streamwal.PChannel, term uint64) *Persister {
	t.Helper()
	o := NewPersister(s, p, term, fmt.Sprintf("node%d", term))
	_, _, err := o.Load(testCtx(t))
	require.NoError(t, err)
	require.NoError(t, o.Claim(testCtx(t)))
	return o
}

// raw returns the stored bytes and revision of key (nil, 0 if absent).
func raw(t testing.TB, s Store, key string) ([]byte, uint64) {
	t.Helper()
	v, rev, err := s.Get(testCtx(t), key)
	if errors.Is(err, ErrNotFound) {
		return nil, 0
	}
	require.NoError(t, err)
	return v, rev
}

// keysOf returns p's three keys in round order.
func keysOf(p streamwal.PChannel) []string {
	return []string{streamwal.VChannelMetaKey(p), streamwal.SegmentMetaKey(p), streamwal.CheckpointKey(p)}
}

// storedState is every key's bytes and revision.
type storedState map[string]struct {
	v   string
	rev uint64
}

// state captures p's stored keys.
func state(t testing.TB, s Store, p streamwal.PChannel) storedState {
	t.Helper()
	out := storedState{}
	for _, k := range keysOf(p) {
		v, rev := raw(t, s, k)
		out[k] = struct {
			v   string
			rev uint64
		}{string(v), rev}
	}
	return out
}

// termOf decodes the term of a stored value.
func termOf(t testing.TB, s Store, key string) uint64 {
	t.Helper()
	v, _ := raw(t, s, key)
	term, err := storedTerm(key, v)
	require.NoError(t, err)
	return term
}

// load reads p's snapshot as a fresh owner of term would (without
// claiming).
func load(t testing.TB, s Store, p streamwal.PChannel, term uint64) (Snapshot, bool) {
	t.Helper()
	got, found, err := NewPersister(s, p, term, "reader").Load(testCtx(t))
	require.NoError(t, err)
	return got, found
}

func TestLoadFreshPChannel(t *testing.T) {
	for name, s := range map[string]Store{"memory": NewMemory(), "kv": natsStore(t)} {
		t.Run(name, func(t *testing.T) {
			p := pch(t, 3)
			o := NewPersister(s, p, 1, "n1")
			got, found, err := o.Load(testCtx(t))
			require.NoError(t, err)
			require.False(t, found)
			require.Zero(t, got.Checkpoint)
			require.Empty(t, got.VChannels)
			require.Nil(t, got.Segments)
			require.Zero(t, o.Last())

			require.NoError(t, o.Claim(testCtx(t)))
			for _, k := range keysOf(p) {
				require.EqualValues(t, 1, termOf(t, s, k), k)
			}
			got, found = load(t, s, p, 2)
			require.False(t, found, "a claim alone covers no message")
			require.EqualValues(t, 1, got.Checkpoint.Term)
			require.Equal(t, "n1", got.Checkpoint.Node)
			require.Zero(t, got.Checkpoint.Consumed, "nothing consumed: replay from the start")
			require.Zero(t, got.Checkpoint.MessageID)
			require.Empty(t, got.VChannels)
			require.Nil(t, got.Segments)
		})
	}
}

func TestPersistRoundTrip(t *testing.T) {
	s, p := NewMemory(), pch(t, 3)
	o := owner(t, s, p, 4)
	in := snap(10)
	in.Checkpoint.Truncated = 5
	in.Checkpoint.Replication = json.RawMessage(`{"role": "primary"}`)
	require.NoError(t, o.Persist(testCtx(t), in))

	last := o.Last()
	require.EqualValues(t, 4, last.Term)
	require.Equal(t, "node4", last.Node)
	require.False(t, last.Written.IsZero())

	got, found := load(t, s, p, 5)
	require.True(t, found)
	require.Equal(t, last.Consumed, got.Checkpoint.Consumed)
	require.Equal(t, in.Checkpoint.TimeTick, got.Checkpoint.TimeTick)
	require.Equal(t, in.Checkpoint.MessageID, got.Checkpoint.MessageID)
	require.Equal(t, in.Checkpoint.Digest, got.Checkpoint.Digest)
	require.Equal(t, in.Checkpoint.Reached, got.Checkpoint.Reached)
	require.Equal(t, in.Checkpoint.Truncated, got.Checkpoint.Truncated)
	require.JSONEq(t, `{"role":"primary"}`, string(got.Checkpoint.Replication))
	require.True(t, last.Written.Equal(got.Checkpoint.Written))
	require.Equal(t, in.VChannels, got.VChannels)
	require.JSONEq(t, string(in.Segments), string(got.Segments))
	require.Equal(t, in.Checkpoint.TimeTick, got.VChannelsThrough)
	require.Equal(t, in.Checkpoint.TimeTick, got.SegmentsThrough)

	// The stored values are plain JSON with snake_case names.
	v, _ := raw(t, s, streamwal.CheckpointKey(p))
	var fields map[string]any
	require.NoError(t, json.Unmarshal(v, &fields))
	for _, f := range []string{"term", "node", "timetick", "message_id", "consumed", "digest", "reached", "truncated", "replication", "written"} {
		require.Contains(t, fields, f)
	}
	v, _ = raw(t, s, streamwal.VChannelMetaKey(p))
	require.JSONEq(t, `{"term":4,"timetick":1010,"vchannels":[{"vchannel":"pchan-3_42v0","collection_id":42,"state":"normal","partitions":[1,2],"schema_version":10}]}`, string(v))
	v, _ = raw(t, s, streamwal.SegmentMetaKey(p))
	require.JSONEq(t, `{"term":4,"timetick":1010,"segments":[{"id":10}]}`, string(v))
}

// failOn returns a Faulty whose puts of key fail with err while armed.
func failOn(s Store, key string, err error) (*Faulty, *atomic.Bool) {
	var armed atomic.Bool
	armed.Store(true)
	return &Faulty{Store: s, Fail: func(op, k string) error {
		if op == OpPut && k == key && armed.Load() {
			return err
		}
		return nil
	}}, &armed
}

func TestRoundWritesMetadataBeforeCheckpoint(t *testing.T) {
	mem, p := NewMemory(), pch(t, 3)
	boom := errors.New("connection lost")
	f, armed := failOn(mem, streamwal.CheckpointKey(p), boom)
	o := owner(t, mem, p, 1)
	require.NoError(t, o.Persist(testCtx(t), snap(10)))
	before, _ := raw(t, mem, streamwal.CheckpointKey(p))

	o2 := NewPersister(f, p, 2, "n2")
	_, _, err := o2.Load(testCtx(t))
	require.NoError(t, err)
	armed.Store(false)
	require.NoError(t, o2.Claim(testCtx(t)))
	claimed, _ := raw(t, mem, streamwal.CheckpointKey(p))
	armed.Store(true)

	err = o2.Persist(testCtx(t), snap(20))
	require.ErrorIs(t, err, boom)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.True(t, streamwal.IsRetriable(err))

	after, _ := raw(t, mem, streamwal.CheckpointKey(p))
	require.Equal(t, string(claimed), string(after), "the checkpoint stays")
	require.NotEqual(t, string(before), string(after))
	got, found := load(t, mem, p, 3)
	require.True(t, found)
	require.EqualValues(t, 10, got.Checkpoint.Consumed)
	require.EqualValues(t, 20, got.VChannels[0].SchemaVersion, "the metadata landed")
	require.JSONEq(t, `[{"id":20}]`, string(got.Segments))
	require.Equal(t, snap(20).Checkpoint.TimeTick, got.VChannelsThrough, "metadata ahead of the checkpoint")
	require.Equal(t, snap(20).Checkpoint.TimeTick, got.SegmentsThrough)
	require.Equal(t, snap(10).Checkpoint.TimeTick, got.Checkpoint.TimeTick)

	// The retry lands the checkpoint.
	armed.Store(false)
	require.NoError(t, o2.Persist(testCtx(t), snap(20)))
	got, _ = load(t, mem, p, 3)
	require.EqualValues(t, 20, got.Checkpoint.Consumed)
}

func TestFailedMetadataWriteMovesNothing(t *testing.T) {
	for _, key := range []func(streamwal.PChannel) string{streamwal.VChannelMetaKey, streamwal.SegmentMetaKey} {
		mem, p := NewMemory(), pch(t, 3)
		boom := errors.New("boom")
		f, armed := failOn(mem, key(p), boom)
		armed.Store(false)
		o := owner(t, f, p, 1)
		require.NoError(t, o.Persist(testCtx(t), snap(10)))
		armed.Store(true)
		before := state(t, mem, p)

		s := snap(20)
		if key(p) == streamwal.SegmentMetaKey(p) {
			s.VChannels = snap(10).VChannels // unchanged: not rewritten
		}
		require.ErrorIs(t, o.Persist(testCtx(t), s), boom)
		require.Equal(t, before, state(t, mem, p), "nothing moved when %s failed", key(p))
		require.EqualValues(t, 10, o.Last().Consumed)

		armed.Store(false)
		require.NoError(t, o.Persist(testCtx(t), s))
		got, _ := load(t, mem, p, 2)
		require.EqualValues(t, 20, got.Checkpoint.Consumed)
		require.JSONEq(t, `[{"id":20}]`, string(got.Segments))
	}
}

func TestOlderTermFencedOnNATS(t *testing.T) {
	s, p := natsStore(t), pch(t, 3)
	ctx := testCtx(t)
	a := owner(t, s, p, 1)
	require.NoError(t, a.Persist(ctx, snap(10)))

	b := owner(t, s, p, 2)
	require.EqualValues(t, 10, b.Last().Consumed, "the claim keeps the checkpoint")
	require.EqualValues(t, 2, b.Last().Term)
	newer := state(t, s, p)
	for _, k := range keysOf(p) {
		require.EqualValues(t, 2, termOf(t, s, k), k)
	}

	unchanged := snap(30)
	unchanged.VChannels, unchanged.Segments = snap(10).VChannels, snap(10).Segments
	for name, round := range map[string]Snapshot{"changed metadata": snap(20), "unchanged metadata": unchanged} {
		err := a.Persist(ctx, round)
		require.ErrorIs(t, err, streamwal.ErrFenced, name)
		require.Equal(t, streamwal.CodeFenced, streamwal.CodeOf(err))
		require.Equal(t, newer, state(t, s, p), "%s: the newer owner's keys are untouched", name)
	}
	_, _, err := a.Load(ctx)
	require.ErrorIs(t, err, streamwal.ErrFenced, "fenced for good")
	require.ErrorIs(t, a.Claim(ctx), streamwal.ErrFenced)

	require.NoError(t, b.Persist(ctx, snap(40)))
	got, _ := load(t, s, p, 3)
	require.EqualValues(t, 40, got.Checkpoint.Consumed)
	require.EqualValues(t, 2, got.Checkpoint.Term)
}

func TestLoadOfNewerTermIsFenced(t *testing.T) {
	s, p := NewMemory(), pch(t, 3)
	b := owner(t, s, p, 5)
	require.NoError(t, b.Persist(testCtx(t), snap(10)))
	before := state(t, s, p)

	a := NewPersister(s, p, 4, "old")
	_, _, err := a.Load(testCtx(t))
	require.ErrorIs(t, err, streamwal.ErrFenced)
	require.ErrorIs(t, a.Persist(testCtx(t), snap(20)), streamwal.ErrFenced)
	require.Equal(t, before, state(t, s, p))

	// Metadata of a newer term fences too (its checkpoint not yet written).
	s2 := NewMemory()
	_, err = s2.Put(testCtx(t), streamwal.SegmentMetaKey(p), []byte(`{"term":9,"segments":null}`), 0)
	require.NoError(t, err)
	_, _, err = NewPersister(s2, p, 4, "old").Load(testCtx(t))
	require.ErrorIs(t, err, streamwal.ErrFenced)
}

func TestCheckpointNeverGoesBackwards(t *testing.T) {
	s, p := NewMemory(), pch(t, 3)
	ctx := testCtx(t)
	o := owner(t, s, p, 1)
	require.NoError(t, o.Persist(ctx, snap(10)))
	before := state(t, s, p)

	lowerConsumed := snap(20)
	lowerConsumed.Checkpoint.Consumed = 9
	lowerTick := snap(20)
	lowerTick.Checkpoint.TimeTick = snap(9).Checkpoint.TimeTick
	for name, round := range map[string]Snapshot{"consumed": lowerConsumed, "timetick": lowerTick, "both": snap(5)} {
		err := o.Persist(ctx, round)
		require.ErrorIs(t, err, ErrBackwards, name)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, name)
		require.Equal(t, before, state(t, s, p), "%s: nothing written", name)
	}
	require.NoError(t, o.Persist(ctx, snap(10)), "the same point again")

	// Reached and Truncated keep their maximum.
	up := snap(11)
	up.Checkpoint.Truncated = 7
	require.NoError(t, o.Persist(ctx, up))
	down := snap(12)
	down.Checkpoint.Reached, down.Checkpoint.Truncated = 1, 0
	require.NoError(t, o.Persist(ctx, down))
	require.EqualValues(t, 13, o.Last().Reached)
	require.EqualValues(t, 7, o.Last().Truncated)

	// A new owner may not go below what it loaded.
	n := owner(t, s, p, 2)
	require.ErrorIs(t, n.Persist(ctx, snap(11)), ErrBackwards)
	require.NoError(t, n.Persist(ctx, snap(13)))
}

func TestUnknownOutcomeThenRetry(t *testing.T) {
	for _, key := range []func(streamwal.PChannel) string{streamwal.VChannelMetaKey, streamwal.SegmentMetaKey, streamwal.CheckpointKey} {
		mem, p := NewMemory(), pch(t, 3)
		ctx := testCtx(t)
		lost := errors.New("reply lost")
		var armed atomic.Bool
		f := &Faulty{Store: mem, After: func(op, k string) error {
			if op == OpPut && k == key(p) && armed.Load() {
				return lost
			}
			return nil
		}}
		o := owner(t, f, p, 1)
		require.NoError(t, o.Persist(ctx, snap(10)))

		armed.Store(true)
		err := o.Persist(ctx, snap(20))
		require.ErrorIs(t, err, lost, key(p))
		require.True(t, streamwal.IsRetriable(err))
		armed.Store(false)

		// A lower round than the one attempted is refused: it may have landed.
		require.ErrorIs(t, o.Persist(ctx, snap(15)), ErrBackwards, key(p))
		require.NoError(t, o.Persist(ctx, snap(20)), "%s: the retry adopts or overwrites", key(p))
		got, _ := load(t, mem, p, 2)
		require.EqualValues(t, 20, got.Checkpoint.Consumed)
		require.EqualValues(t, 20, got.VChannels[0].SchemaVersion)
		require.JSONEq(t, `[{"id":20}]`, string(got.Segments))
		require.NoError(t, o.Persist(ctx, snap(30)), "%s: later rounds go on", key(p))
	}
}

func TestUnknownOutcomeAdoptsOwnWrite(t *testing.T) {
	mem, p := NewMemory(), pch(t, 3)
	ctx := testCtx(t)
	lost := errors.New("reply lost")
	var puts atomic.Int32
	f := &Faulty{Store: mem, After: func(op, k string) error {
		if op == OpPut && k == streamwal.CheckpointKey(p) && puts.Add(1) == 1 {
			return lost
		}
		return nil
	}}
	o := NewPersister(f, p, 1, "n1")
	_, _, err := o.Load(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, o.Claim(ctx), lost)
	_, rev := raw(t, mem, streamwal.CheckpointKey(p))
	require.NoError(t, o.Claim(ctx), "the claim is retried")
	require.NoError(t, o.Persist(ctx, snap(10)))
	_, rev2 := raw(t, mem, streamwal.CheckpointKey(p))
	require.Greater(t, rev2, rev)
	require.EqualValues(t, 10, o.Last().Consumed)
}

func TestUnchangedMetadataIsNotRewritten(t *testing.T) {
	mem, p := NewMemory(), pch(t, 3)
	var mu sync.Mutex
	var puts []string
	f := &Faulty{Store: mem, Fail: func(op, k string) error {
		if op == OpPut {
			mu.Lock()
			puts = append(puts, k)
			mu.Unlock()
		}
		return nil
	}}
	o := owner(t, f, p, 1)
	require.NoError(t, o.Persist(testCtx(t), snap(10)))
	mu.Lock()
	puts = nil
	mu.Unlock()

	next := snap(11)
	next.VChannels = snap(10).VChannels
	next.Segments = json.RawMessage(` [ {"id": 10} ] `) // same JSON, other spacing
	require.NoError(t, o.Persist(testCtx(t), next))
	require.Equal(t, []string{streamwal.CheckpointKey(p)}, puts)

	got, _ := load(t, mem, p, 2)
	require.Equal(t, snap(10).Checkpoint.TimeTick, got.VChannelsThrough, "the stored metadata keeps its cut")
	require.Equal(t, next.Checkpoint.TimeTick, got.Checkpoint.TimeTick)
}

func TestClaimAfterOlderOwnerWrote(t *testing.T) {
	s, p := NewMemory(), pch(t, 3)
	ctx := testCtx(t)
	a := owner(t, s, p, 1)
	require.NoError(t, a.Persist(ctx, snap(10)))

	b := NewPersister(s, p, 2, "n2")
	_, _, err := b.Load(ctx)
	require.NoError(t, err)
	require.NoError(t, a.Persist(ctx, snap(20)), "the old owner is not fenced yet")
	require.NoError(t, b.Claim(ctx))
	require.EqualValues(t, 20, b.Last().Consumed, "the claim never moves the checkpoint back")
	require.EqualValues(t, 2, b.Last().Term)
	got, _ := load(t, s, p, 3)
	require.EqualValues(t, 20, got.VChannels[0].SchemaVersion)
	require.EqualValues(t, 2, got.Checkpoint.Term)
	require.ErrorIs(t, a.Persist(ctx, snap(30)), streamwal.ErrFenced)
}

func TestPersistWithoutClaimClaims(t *testing.T) {
	s, p := NewMemory(), pch(t, 3)
	ctx := testCtx(t)
	a := owner(t, s, p, 1)
	b := NewPersister(s, p, 2, "n2")
	_, _, err := b.Load(ctx)
	require.NoError(t, err)
	require.NoError(t, b.Persist(ctx, snap(5)))
	unchanged := snap(6)
	unchanged.VChannels, unchanged.Segments = snap(5).VChannels, snap(5).Segments
	require.ErrorIs(t, a.Persist(ctx, unchanged), streamwal.ErrFenced)
}

func TestPersistRefusesBadInput(t *testing.T) {
	s, p := NewMemory(), pch(t, 3)
	ctx := testCtx(t)
	o := NewPersister(s, p, 1, "n1")
	require.ErrorIs(t, o.Persist(ctx, snap(1)), streamwal.ErrInternal, "Persist before Load")
	require.ErrorIs(t, o.Claim(ctx), streamwal.ErrInternal, "Claim before Load")
	o = owner(t, s, p, 1)
	before := state(t, s, p)

	badSegments := snap(2)
	badSegments.Segments = json.RawMessage(`{"id":`)
	badState := snap(2)
	badState.VChannels[0].State = "gone"
	badReplication := snap(2)
	badReplication.Checkpoint.Replication = json.RawMessage(`nope`)
	for name, round := range map[string]Snapshot{"segments": badSegments, "state": badState, "replication": badReplication} {
		require.ErrorIs(t, o.Persist(ctx, round), streamwal.ErrInvalidArgument, name)
		require.Equal(t, before, state(t, s, p), name)
	}
	require.NoError(t, o.Persist(ctx, snap(2)))
}

func TestLoadCorrupt(t *testing.T) {
	p := pch(t, 3)
	for _, key := range keysOf(p) {
		s := NewMemory()
		_, err := s.Put(testCtx(t), key, []byte(`{"term":1,`), 0)
		require.NoError(t, err)
		_, _, err = NewPersister(s, p, 2, "n").Load(testCtx(t))
		require.ErrorIs(t, err, ErrCorrupt, key)
		require.ErrorIs(t, err, streamwal.ErrUnrecoverable, key)
	}
}

func TestLoadUnavailable(t *testing.T) {
	p := pch(t, 3)
	f := &Faulty{Store: NewMemory(), Fail: func(op, k string) error { return context.DeadlineExceeded }}
	_, _, err := NewPersister(f, p, 1, "n").Load(testCtx(t))
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestTwoTermsRace(t *testing.T) {
	for name, s := range map[string]Store{"memory": NewMemory(), "kv": natsStore(t)} {
		t.Run(name, func(t *testing.T) { testTwoTermsRace(t, s) })
	}
}

// testTwoTermsRace runs many goroutines persisting under term 1, then,
// while they go on, a term-2 owner loads, claims and persists from many
// goroutines too. The term-1 owner ends fenced, and the stored checkpoint
// is the newer owner's.
func testTwoTermsRace(t *testing.T, s Store) {
	const goroutines, newerRounds = 8, 20
	p := pch(t, 3)
	ctx := testCtx(t)
	a := owner(t, s, p, 1)

	var next atomic.Uint64
	started := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for {
				n := next.Add(1)
				err := a.Persist(ctx, snap(n))
				switch {
				case err == nil:
					if n >= goroutines {
						once.Do(func() { close(started) })
					}
				case errors.Is(err, streamwal.ErrFenced):
					once.Do(func() { close(started) })
					return
				case !errors.Is(err, ErrBackwards):
					t.Errorf("term 1: %v", err)
					return
				}
			}
		})
	}
	<-started

	b := owner(t, s, p, 2)
	var bNext atomic.Uint64
	for range goroutines {
		wg.Go(func() {
			for range newerRounds {
				err := b.Persist(ctx, snap(1<<40+bNext.Add(1)))
				if err != nil && !errors.Is(err, ErrBackwards) {
					t.Errorf("term 2: %v", err)
				}
			}
		})
	}
	wg.Wait()

	require.ErrorIs(t, a.Persist(ctx, snap(1<<50)), streamwal.ErrFenced)
	got, found := load(t, s, p, 3)
	require.True(t, found)
	require.EqualValues(t, 2, got.Checkpoint.Term)
	require.Equal(t, b.Last().Consumed, got.Checkpoint.Consumed)
	require.Greater(t, uint64(got.Checkpoint.Consumed), uint64(1<<40))
	for _, k := range keysOf(p) {
		require.EqualValues(t, 2, termOf(t, s, k), k)
	}
}

func TestConflictWithOlderTermValue(t *testing.T) {
	s, p := NewMemory(), pch(t, 3)
	ctx := testCtx(t)
	o := owner(t, s, p, 2)
	require.NoError(t, o.Persist(ctx, snap(10)))
	key := streamwal.CheckpointKey(p)

	// An older term's value written behind the persister's back (as by an
	// owner that never met the claim) is overwritten.
	_, rev := raw(t, s, key)
	_, err := s.Put(ctx, key, []byte(`{"term":1,"consumed":3,"timetick":1003}`), rev)
	require.NoError(t, err)
	require.NoError(t, o.Persist(ctx, snap(20)))
	got, _ := load(t, s, p, 3)
	require.EqualValues(t, 20, got.Checkpoint.Consumed)
	require.EqualValues(t, 2, got.Checkpoint.Term)

	// Unless it is ahead: the checkpoint never moves back.
	_, rev = raw(t, s, key)
	_, err = s.Put(ctx, key, []byte(`{"term":1,"consumed":90,"timetick":1090}`), rev)
	require.NoError(t, err)
	require.ErrorIs(t, o.Persist(ctx, snap(30)), ErrBackwards)
	got, _ = load(t, s, p, 3)
	require.EqualValues(t, 90, got.Checkpoint.Consumed)
}
