package wal_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/jetstream/faulty"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
	"github.com/streamwal/streamwal/services/node/wal"
)

// errStoreDown is the failure a switched-off store or object store
// injects.
var errStoreDown = errors.New("injected: storage down")

// switchedStore is a recovery.Faulty around a Memory store whose writes
// fail while it is down.
type switchedStore struct {
	mem    *recovery.Memory
	faulty *recovery.Faulty
	down   atomic.Bool
	// failed counts the writes refused.
	failed atomic.Int64
}

// newSwitchedStore returns a store that is up.
func newSwitchedStore() *switchedStore {
	s := &switchedStore{mem: recovery.NewMemory()}
	s.faulty = &recovery.Faulty{Store: s.mem, Fail: func(op, key string) error {
		if op != recovery.OpGet && s.down.Load() {
			s.failed.Add(1)
			return errStoreDown
		}
		return nil
	}}
	return s
}

// flakyTiers is the env's tiers with a WriteSegment that fails while
// down; tried counts the attempts made while down.
type flakyTiers struct {
	wal.Tiers
	down  atomic.Bool
	tried atomic.Int64
}

func (f *flakyTiers) WriteSegment(ctx context.Context, m jetstream.SegmentManifest, msgs jetstream.Messages) error {
	if f.down.Load() {
		f.tried.Add(1)
		return errStoreDown
	}
	return f.Tiers.WriteSegment(ctx, m, msgs)
}

// openWith opens a WAL with cfg and closes it at the end of the test.
func openWith(t *testing.T, cfg wal.Config) *wal.WAL {
	t.Helper()
	w, err := wal.Open(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	return w
}

// storedCheckpoint reads the checkpoint stored for p (zero if none).
func storedCheckpoint(t *testing.T, s recovery.Store, p streamwal.PChannel) recovery.Checkpoint {
	t.Helper()
	raw, _, err := s.Get(context.Background(), streamwal.CheckpointKey(p))
	if errors.Is(err, recovery.ErrNotFound) {
		return recovery.Checkpoint{}
	}
	require.NoError(t, err)
	var c recovery.Checkpoint
	require.NoError(t, json.Unmarshal(raw, &c))
	return c
}

// streamLast is the MessageID of the stream's last message.
func (e *storageEnv) streamLast() messages.MessageID {
	e.t.Helper()
	s, err := e.js.State(context.Background(), e.p)
	require.NoError(e.t, err)
	return s.Last
}

// segmentOf returns segment id of st.
func segmentOf(st wal.StorageState, id int64) (shard.Segment, bool) {
	for _, s := range st.Segments {
		if s.ID == id {
			return s, true
		}
	}
	return shard.Segment{}, false
}

// TestFlushedOutSegmentIsStoredAfterReopen: a segment whose Flush the
// ledger consumed, but whose upload to the object store had not happened
// when the WAL closed (the object store was down, or the node crashed
// between the two), is persisted as sealed and flushed-out. The next
// owner must still store it and mark it flushed: until then it holds the
// truncation point back for good.
func TestFlushedOutSegmentIsStoredAfterReopen(t *testing.T) {
	e := newStorageEnv(t, nil)
	e.shard = shard.Config{Jitter: -1}
	ctx := context.Background()
	v := e.vchannel(1)
	tiers := &flakyTiers{Tiers: e.js}
	tiers.down.Store(true)
	cfg := e.storageConfig(1)
	cfg.Storage.Tiers = tiers
	w1 := openWith(t, cfg)
	e.createCollection(w1, v)
	var seg int64
	for i := range 10 {
		m, err := w1.Append(ctx, e.insert(v, fmt.Sprint("row ", i)))
		require.NoError(t, err)
		seg = m.Header().DML.SegmentID
	}
	_, err := w1.Append(ctx, ruleManualFlush(t, e.env, v))
	require.NoError(t, err)
	waitFor(t, "the flush consumed and its upload tried", func() bool {
		st, _ := w1.StorageState()
		s, ok := segmentOf(st, seg)
		return ok && s.FlushedAt != 0 && tiers.tried.Load() > 0
	})
	require.NoError(t, w1.Close())
	st1, _ := w1.StorageState()
	s1, _ := segmentOf(st1, seg)
	require.Equal(t, shard.Sealed, s1.State)
	require.GreaterOrEqual(t, st1.Persisted.Consumed, s1.FlushedAt, "the final round persisted the flush-out")

	tiers.down.Store(false)
	cfg = e.storageConfig(2)
	cfg.Storage.Tiers = tiers
	w2 := openWith(t, cfg)
	waitForWithin(t, 5*time.Second, fmt.Sprintf("segment %d stored and marked flushed by the next owner", seg), func() bool {
		st, _ := w2.StorageState()
		s, ok := segmentOf(st, seg)
		return ok && s.State == shard.Flushed
	})
	manifests, err := e.js.Segments(ctx, v)
	require.NoError(t, err)
	require.Len(t, manifests, 1)
	require.Equal(t, seg, manifests[0].Segment)
	require.Equal(t, 10, manifests[0].Count)
}

// waitForWithin waits until cond holds, for at most d.
func waitForWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAppendTxnFillingASegment: a whole transaction whose inserts fill
// their growing segment part-way through lands like any other: the
// segment that an earlier insert of the transaction filled takes the rest
// of its inserts, or a new one does; it is never refused as an internal
// error, and every row lands in exactly one segment.
func TestAppendTxnFillingASegment(t *testing.T) {
	e := newStorageEnv(t, nil)
	e.shard = shard.Config{Jitter: -1, MaxRows: 2}
	ctx := context.Background()
	v := e.vchannel(1)
	w := e.openStorage(1)
	e.createCollection(w, v)
	one := messages.WithDML(0, 1)
	out, err := w.AppendTxn(ctx, v, 0, e.insert(v, "a", one), e.insert(v, "b", one), e.insert(v, "c", one))
	require.NoError(t, err, "a whole transaction whose second insert fills the segment")
	require.Len(t, out, 5)
	waitFor(t, "the transaction consumed", func() bool {
		st, _ := w.StorageState()
		return st.Consumed.Consumed >= out[4].ID()
	})
	st, _ := w.StorageState()
	var rows uint64
	for _, s := range st.Segments {
		rows += s.Rows
	}
	require.Equal(t, uint64(3), rows)
	seg := out[1].Header().DML.SegmentID
	require.NotZero(t, seg)
	for _, m := range out[1:4] {
		require.Equal(t, seg, m.Header().DML.SegmentID, "the transaction's inserts share the segment its first opened")
	}
	// The segment is full: the next insert opens another one.
	m, err := w.Append(ctx, e.insert(v, "d", one))
	require.NoError(t, err)
	require.NotEqual(t, seg, m.Header().DML.SegmentID)
}

// recordingStore is a store that records every checkpoint write that
// took effect, in the order they did.
type recordingStore struct {
	recovery.Store
	key string

	mu     sync.Mutex
	writes []recovery.Checkpoint
}

func (r *recordingStore) Put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	r.mu.Lock() // one write at a time, so that the record is in store order
	defer r.mu.Unlock()
	next, err := r.Store.Put(ctx, key, value, rev)
	if err == nil && key == r.key {
		var c recovery.Checkpoint
		if json.Unmarshal(value, &c) == nil {
			r.writes = append(r.writes, c)
		}
	}
	return next, err
}

// checkpoints returns the checkpoint writes so far.
func (r *recordingStore) checkpoints() []recovery.Checkpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.writes)
}

// requireMonotone requires a sequence of checkpoints (as written, or as
// sampled) to never move backwards, in term, Consumed or TimeTick.
func requireMonotone(t *testing.T, what string, cps []recovery.Checkpoint) {
	t.Helper()
	for i := 1; i < len(cps); i++ {
		a, b := cps[i-1], cps[i]
		require.GreaterOrEqual(t, b.Term, a.Term, "%s %d: term", what, i)
		require.GreaterOrEqual(t, b.Consumed, a.Consumed, "%s %d: consumed", what, i)
		require.GreaterOrEqual(t, b.TimeTick, a.TimeTick, "%s %d: timetick", what, i)
	}
}

// TestFencedOwnerNeverMovesCheckpoint: an owner of term 1 still open, with
// consumed messages it could not persist yet, while term 2 opens on the
// same store: its next rounds meet term 2's claim, stop it as fenced, and
// write nothing; the checkpoint stays term 2's.
func TestFencedOwnerNeverMovesCheckpoint(t *testing.T) {
	s := newSwitchedStore()
	rec := &recordingStore{Store: s.faulty}
	e := newStorageEnv(t, rec)
	rec.key = streamwal.CheckpointKey(e.p)
	ctx := context.Background()
	v := e.vchannel(1)
	w1 := e.openStorage(1)
	e.createCollection(w1, v)
	for i := range 5 {
		_, err := w1.Append(ctx, e.insert(v, fmt.Sprint(i), messages.WithDML(0, 1)))
		require.NoError(t, err)
	}
	last := e.streamLast()
	waitFor(t, "term 1 persisted what it appended", func() bool {
		st, _ := w1.StorageState()
		return st.Persisted.Consumed >= last
	})
	// Term 1's store goes down: what it consumes from now on stays dirty.
	s.down.Store(true)
	for i := range 20 {
		_, err := w1.Append(ctx, e.insert(v, fmt.Sprint("unpersisted ", i), messages.WithDML(0, 1)))
		require.NoError(t, err)
	}
	waitFor(t, "a round of term 1 failed", func() bool { return s.failed.Load() > 0 })

	// Term 2 opens on the store itself (healthy) and claims the keys.
	cfg := e.storageConfig(2)
	cfg.Storage.Store = &recordingStore{Store: s.mem}
	w2 := openWith(t, cfg)
	claimed := storedCheckpoint(t, s.mem, e.p)
	require.Equal(t, uint64(2), claimed.Term)
	before := len(rec.checkpoints())

	// Term 1's store comes back: its next round meets the claim.
	s.down.Store(false)
	waitFor(t, "term 1 stopped as fenced", func() bool { return errors.Is(w1.Err(), streamwal.ErrFenced) })
	require.NoError(t, w1.Close()) // its final round is fenced too
	require.Len(t, rec.checkpoints(), before, "term 1 wrote no checkpoint after term 2's claim")
	st1, _ := w1.StorageState()
	require.Equal(t, uint64(1), st1.Persisted.Term)
	require.Less(t, st1.Persisted.Consumed, w2.Barrier().ID())

	// Term 2 persists, and its checkpoint never goes back.
	m, err := w2.Append(ctx, e.insert(v, "term 2", messages.WithDML(0, 1)))
	require.NoError(t, err)
	waitFor(t, "term 2 persisted", func() bool {
		c := storedCheckpoint(t, s.mem, e.p)
		return c.Term == 2 && c.Consumed >= m.ID()
	})
	requireMonotone(t, "term 1's checkpoint writes", rec.checkpoints())
}

// TestCheckpointMonotoneAcrossTakeover: while 16 goroutines append to
// term 1 and a sampler reads the stored checkpoint, term 2 opens on the
// same store and 16 goroutines go on appending there. Neither the
// checkpoint writes that took effect nor the samples ever move backwards,
// and once term 2's claim is stored no checkpoint of term 1 is.
func TestCheckpointMonotoneAcrossTakeover(t *testing.T) {
	mem := recovery.NewMemory()
	rec := &recordingStore{Store: mem}
	e := newStorageEnv(t, rec)
	rec.key = streamwal.CheckpointKey(e.p)
	ctx := context.Background()
	vs := []streamwal.VChannel{e.vchannel(1), e.vchannel(2)}
	w1 := e.openStorage(1)
	for _, v := range vs {
		e.createCollection(w1, v)
	}

	stop := make(chan struct{})
	var samples []recovery.Checkpoint
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			raw, _, err := mem.Get(ctx, streamwal.CheckpointKey(e.p))
			if err != nil {
				continue
			}
			var c recovery.Checkpoint
			if json.Unmarshal(raw, &c) == nil {
				samples = append(samples, c)
			}
		}
	}()
	// appendAll runs 16 goroutines of n inserts each on w, until the first
	// refusal of each (a fenced WAL refuses everything).
	appendAll := func(w *wal.WAL, n int) {
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range n {
					if _, err := w.Append(ctx, e.insert(vs[g%2], fmt.Sprintf("t%d g%d i%d", w.Term(), g, i), messages.WithDML(0, 1))); err != nil {
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	done1 := make(chan struct{})
	go func() { defer close(done1); appendAll(w1, 60) }()
	waitFor(t, "term 1 claimed and persisted a round", func() bool { return len(rec.checkpoints()) >= 2 })

	cfg := e.storageConfig(2)
	w2 := openWith(t, cfg) // while term 1 still appends
	appendAll(w2, 30)
	<-done1
	require.NoError(t, w1.Close())
	last := e.streamLast()
	waitFor(t, "term 2 persisted everything", func() bool {
		st, _ := w2.StorageState()
		return st.Consumed.Consumed == e.streamLast() && st.Persisted.Consumed == st.Consumed.Consumed && st.Consumed.Consumed >= last
	})
	close(stop)
	<-sampled

	writes := rec.checkpoints()
	requireMonotone(t, "checkpoint write", writes)
	requireMonotone(t, "checkpoint sample", samples)
	require.Greater(t, len(samples), 10)
	claimedAt := slices.IndexFunc(writes, func(c recovery.Checkpoint) bool { return c.Term == 2 })
	require.GreaterOrEqual(t, claimedAt, 0)
	for _, c := range writes[claimedAt:] {
		require.Equal(t, uint64(2), c.Term, "a checkpoint of term 1 after term 2's claim")
	}
	require.Equal(t, uint64(2), storedCheckpoint(t, mem, e.p).Term)
}

// insertsIn counts the inserts of the stream from its first message
// through id.
func (e *storageEnv) insertsIn(through messages.MessageID) int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sc, err := e.backend.Read(ctx, e.p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	require.NoError(e.t, err)
	defer sc.Close()
	n := 0
	for m, err := range sc.All(ctx) {
		require.NoError(e.t, err)
		if m.ID() > through {
			break
		}
		if m.Type() == messages.TypeInsert {
			n++
		}
		if m.ID() == through {
			break
		}
	}
	return n
}

// rowsIn sums the rows of the segments of st.
func rowsIn(st wal.StorageState) uint64 {
	var n uint64
	for _, s := range st.Segments {
		n += s.Rows
	}
	return n
}

// TestLedgerConsumesEveryLandedMessageOnce: 32 goroutines append inserts
// (of one row each) concurrently, so appends resolve out of order. After a
// quiet period the ledger consumed through the stream's last message,
// every insert exactly once (the rows of the segments are the inserts
// acknowledged), and the stored checkpoint says so. A WAL closed while 32
// goroutines append (some of them learn an unknown outcome or a refusal)
// leaves a stream whose every insert the next owner counts exactly once.
func TestLedgerConsumesEveryLandedMessageOnce(t *testing.T) {
	e := newStorageEnv(t, nil)
	e.shard = shard.Config{Capacity: 8 << 10, Jitter: -1}
	ctx := context.Background()
	v := e.vchannel(1)
	w := e.openStorage(1)
	e.createCollection(w, v, 1, 2)
	var acked, failed atomic.Int64
	run := func(w *wal.WAL, n int) {
		var wg sync.WaitGroup
		for g := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range n {
					_, err := w.Append(ctx, e.insert(v, fmt.Sprintf("g%02d i%03d %050d", g, i, i), messages.WithDML(int64(g%3), 1)))
					if err != nil {
						failed.Add(1)
						return
					}
					acked.Add(1)
				}
			}()
		}
		wg.Wait()
	}
	run(w, 25)
	require.Zero(t, failed.Load())
	waitFor(t, "the ledger consumed and persisted through the stream's last message", func() bool {
		st, _ := w.StorageState()
		last := e.streamLast()
		return st.Consumed.Consumed == last && st.Persisted.Consumed == last
	})
	st, _ := w.StorageState()
	require.Equal(t, uint64(acked.Load()), rowsIn(st), "every acknowledged insert counted once")
	require.Equal(t, int(acked.Load()), e.insertsIn(st.Consumed.Consumed))
	stored := storedCheckpoint(t, e.store, e.p)
	require.Equal(t, st.Consumed.Consumed, stored.Consumed)

	// Close while appends are in flight.
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		run(w, 1000)
	}()
	waitFor(t, "more appends landed", func() bool { return acked.Load() >= 32*25+200 })
	require.NoError(t, w.Close())
	<-closed
	w2 := openWith(t, quietConfig(e, 2, e.store)) // appends nothing after its barrier
	st2, _ := w2.StorageState()
	require.Equal(t, w2.Barrier().ID(), st2.Consumed.Consumed)
	inStream := e.insertsIn(w2.Barrier().ID())
	require.GreaterOrEqual(t, inStream, int(acked.Load()), "every acknowledged insert is in the stream")
	require.Equal(t, uint64(inStream), rowsIn(st2), "every insert in the stream counted once by the next owner")
}

// TestReplayAtOrBelowCheckpointChangesNothing: two opens in a row, with
// nothing appended between them but their barriers, recover the same
// state but for the consumed position, which is each one's barrier: after
// a graceful close (the second replays what the first's checkpoint
// covers), and after a crash that left the metadata ahead of the
// checkpoint (both replay messages the metadata covers already).
func TestReplayAtOrBelowCheckpointChangesNothing(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprint("metadata ahead=", crash), func(t *testing.T) {
			p, err := streamwal.NewPChannel("p", 0)
			require.NoError(t, err)
			store := newCrashStore(p)
			e := newStorageEnv(t, store.faulty)
			e.shard = shard.Config{Capacity: 1 << 10, Jitter: -1}
			k := &workload{t: t, e: e, rng: rand.New(rand.NewPCG(7, 7)), next: 1}
			w1 := openWith(t, e.storageConfig(1))
			for range 40 {
				k.step(w1)
			}
			if crash {
				store.arm(crashCheckpoint, 0)
				for range 20 {
					k.step(w1)
				}
			}
			settleUploads(t, w1, "term 1")
			require.NoError(t, w1.Close())
			var arm *crashStore
			if crash {
				arm = store // the quiet owners crash too: both replay from term 1's checkpoint
				store.disarm()
			}
			w2, a := recoveredState(t, e, 2, store.faulty, arm)
			w3, b := recoveredState(t, e, 3, store.faulty, arm)
			require.Equal(t, w2.Barrier().ID()+1, w3.Barrier().ID())
			if crash {
				require.Equal(t, w2.Recovered().Checkpoint, w3.Recovered().Checkpoint, "both replay from term 1's checkpoint")
			} else {
				require.Equal(t, w2.Barrier().ID(), w3.Recovered().Checkpoint, "the second replays from the first's checkpoint")
			}
			require.Greater(t, w3.Recovered().Replayed, 0)
			require.Equal(t, a.VChannels, b.VChannels)
			sa, err := json.MarshalIndent(a.Segments, "", " ")
			require.NoError(t, err)
			sb, err := json.MarshalIndent(b.Segments, "", " ")
			require.NoError(t, err)
			require.Equal(t, string(sa), string(sb))
			require.Equal(t, k.rows, rowsIn(a))
			require.Equal(t, w2.Barrier().ID(), a.Consumed.Consumed)
			require.Equal(t, w3.Barrier().ID(), b.Consumed.Consumed)
		})
	}
}

// TestReplaySkipsDroppedAndUnknownCollections: a full replay (an empty
// store) over a stream with a collection dropped after its inserts opens,
// keeps the drop, and stores the dropped collection's segments; a replay
// that meets inserts of a collection and of segments whose creation it
// never saw (the stream was truncated, and this backend reads no archive)
// skips them, counts them in Recovered().Skipped, and opens.
func TestReplaySkipsDroppedAndUnknownCollections(t *testing.T) {
	e := newStorageEnv(t, nil)
	e.shard = shard.Config{Capacity: 2 << 10, Jitter: -1}
	e.retain = 0
	ctx := context.Background()
	gone, kept := e.vchannel(1), e.vchannel(2)
	var hold atomic.Uint64 // pins truncation once set
	cfg := e.storageConfig(1)
	cfg.Storage.Holds = func() messages.MessageID { return messages.MessageID(hold.Load()) }
	w1 := openWith(t, cfg)
	e.retain = -1 // the later owners do not truncate
	e.createCollection(w1, gone, 7)
	e.createCollection(w1, kept)
	var lastGone *messages.ImmutableMessage
	for i := range 150 {
		m, err := w1.Append(ctx, e.insert(gone, fmt.Sprintf("gone %03d %080d", i, i), messages.WithDML(7, 1)))
		require.NoError(t, err)
		lastGone = m
		_, err = w1.Append(ctx, e.insert(kept, fmt.Sprint("kept ", i), messages.WithDML(0, 1)))
		require.NoError(t, err)
	}
	_, err := w1.Append(ctx, ruleManualFlush(t, e.env, kept))
	require.NoError(t, err)
	// Truncation passes the collections' creation and the CreateSegment of
	// the growing segment of gone.
	waitFor(t, "the stream truncated past the creation of the open segments", func() bool {
		st, _ := w1.StorageState()
		s, err := e.js.State(ctx, e.p)
		if err != nil {
			return false
		}
		for _, seg := range st.Segments {
			if seg.VChannel == gone && seg.State == shard.Growing && seg.First > 0 && s.First >= seg.First {
				hold.Store(uint64(s.First)) // and no further: the drop and its Flush stay
				return true
			}
		}
		return false
	})
	_, err = w1.Append(ctx, ruleDropCollection(t, e.env, gone))
	require.NoError(t, err)
	settleUploads(t, w1, "term 1")
	require.NoError(t, w1.Close())

	// A full replay through the archive: nothing unknown.
	cfg = e.storageConfig(2)
	cfg.Storage.Store = recovery.NewMemory()
	w2 := openWith(t, cfg)
	require.Zero(t, w2.Recovered().From)
	_, err = w2.Append(ctx, e.insert(gone, "after the drop", messages.WithDML(7, 1)))
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
	_, err = w2.Append(ctx, e.insert(kept, "after the drop", messages.WithDML(0, 1)))
	require.NoError(t, err)
	settleUploads(t, w2, "a full replay")
	st2, _ := w2.StorageState()
	for _, s := range st2.Segments {
		if s.VChannel == gone {
			require.Equal(t, shard.Flushed, s.State, "segment %d of the dropped collection", s.ID)
			require.LessOrEqual(t, s.Last, lastGone.ID())
		}
	}
	require.NoError(t, w2.Close())

	// A full replay of what the stream alone still holds.
	bare, err := jetstream.New(e.nc, e.codec, jetstream.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bare.Close() })
	cfg = e.storageConfig(3)
	cfg.Backend = bare
	cfg.Storage.Store, cfg.Storage.Tiers = recovery.NewMemory(), bare
	w3 := openWith(t, cfg)
	r := w3.Recovered()
	require.Zero(t, r.From)
	require.Positive(t, r.Skipped, "inserts of segments created below the stream's first message")
	_, err = w3.Append(ctx, e.insert(gone, "after the drop", messages.WithDML(7, 1)))
	require.ErrorIs(t, err, streamwal.ErrLifecycle, "the drop was replayed")
	st3, _ := w3.StorageState()
	for _, s := range st3.Segments {
		require.NotEqual(t, gone, s.VChannel, "no segment of the dropped collection is known")
	}
}

// TestLedgerMessageIDsLiveAndReplayed: the VChannel metadata a ledger
// keeps does not depend on whether it consumed a message as it landed or
// in a replay. A DDL appended without a caller message ID gets one from
// the jetstream writer ("w<term>-..."): a replay reads it back, the live
// ledger never sees it, so the CreatedBy, DroppedBy and DDL IDs of the
// metadata differ between a checkpoint and a full replay.
func TestLedgerMessageIDsLiveAndReplayed(t *testing.T) {
	e := newStorageEnv(t, nil)
	v, gone := e.vchannel(1), e.vchannel(2)
	w1 := e.openStorage(1)
	e.createCollection(w1, v, 1)
	e.createCollection(w1, gone)
	ruleAppend(t, w1, ruleDDL(t, e.env, messages.TypeCreatePartition, v, 2))
	ruleAppend(t, w1, ruleDDL(t, e.env, messages.TypeDropPartition, v, 1))
	ruleAppend(t, w1, ruleDropCollection(t, e.env, gone))
	require.NoError(t, w1.Close())
	live, _ := w1.StorageState()

	cfg := e.storageConfig(2)
	cfg.Storage.Store = recovery.NewMemory()
	w2 := openWith(t, cfg)
	replayed, _ := w2.StorageState()
	require.Equal(t, replayed.VChannels, live.VChannels, "vchannel metadata consumed live and replayed")
}

// TestLedgerFillsGapOfUnlearnedAppend: appends that landed without the
// WAL learning of it leave gaps below what it learned; the storage loop
// reads them from the stream once it waited long enough, and the ledger
// consumes every message of the stream exactly once, in order.
func TestLedgerFillsGapOfUnlearnedAppend(t *testing.T) {
	e := newStorageEnv(t, nil)
	ctx := context.Background()
	v := e.vchannel(1)
	lies := map[string]bool{"lie 3": true, "lie 4": true, "lie 10": true}
	var lied atomic.Int64
	cfg := e.storageConfig(1)
	// The writer lands the lies but tells the WAL they failed, with an
	// error that is no unknown outcome: the WAL never learns that they
	// landed.
	cfg.Backend = faulty.New(e.js, faulty.When(func(c faulty.Call) bool {
		if c.Op != faulty.OpAppend {
			return false
		}
		last := c.Msgs[len(c.Msgs)-1]
		if last.Type() == messages.TypeInsert && lies[string(last.Payload())] {
			lied.Add(1)
			return true
		}
		return false
	}, faulty.Fault{Err: faulty.Unavailable(), After: true}))
	w := openWith(t, cfg)
	e.createCollection(w, v)
	acked := 0
	for i := range 20 {
		_, err := w.Append(ctx, e.insert(v, fmt.Sprint("lie ", i), messages.WithDML(0, 1)))
		if lies[fmt.Sprint("lie ", i)] {
			require.ErrorIs(t, err, faulty.ErrInjected)
			require.NotErrorIs(t, err, streamwal.ErrUnknownOutcome)
			continue
		}
		require.NoError(t, err)
		acked++
	}
	require.Equal(t, int64(len(lies)), lied.Load())
	waitFor(t, "the ledger consumed and persisted through the stream's last message", func() bool {
		st, _ := w.StorageState()
		last := e.streamLast()
		return st.Consumed.Consumed == last && st.Persisted.Consumed == last
	})
	st, _ := w.StorageState()
	inStream := e.insertsIn(st.Consumed.Consumed)
	require.Equal(t, acked+len(lies), inStream, "the unlearned inserts landed")
	require.Equal(t, uint64(inStream), rowsIn(st), "every insert in the stream consumed once, the unlearned ones too")
}
