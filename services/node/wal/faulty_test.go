package wal_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream/faulty"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/wal"
)

// The faulty backend offers what recovery storage needs of its tiers.
var _ wal.Tiers = (*faulty.Backend)(nil)

// faultyEnv is an env whose WALs write through a faulty backend around
// the env's; it passes every operation until a test sets an injector.
type faultyEnv struct {
	*env
	fb *faulty.Backend
}

// newFaultyEnv starts a server for t.
func newFaultyEnv(t *testing.T) *faultyEnv {
	e := newEnv(t)
	return &faultyEnv{env: e, fb: faulty.New(e.backend, nil)}
}

// faultyConfig is the WAL configuration of term, through the faulty
// backend.
func (e *faultyEnv) faultyConfig(term uint64) wal.Config {
	c := e.config(term)
	c.Backend = e.fb
	return c
}

// createCollectionMsg builds v's CreateCollection.
func (e *faultyEnv) createCollectionMsg(v streamwal.VChannel) *messages.MutableMessage {
	e.t.Helper()
	m, err := e.codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: v.String(), CollectionID: v.CollectionID()},
		VChannels:     []string{v.String()},
	})
	require.NoError(e.t, err)
	return m
}

// heldFault injects a fault into the first append that match accepts and
// holds its result back until release. The WAL hands an append to its
// writer under its mutex and takes a result there at once for a refusal
// before queueing; holding the result until that mutex is free again
// makes the WAL learn it as the outcome of an append in flight, as it
// learns an unknown outcome or a fence from a real writer.
type heldFault struct {
	gate    chan struct{}
	reached chan struct{}
	open    sync.Once
}

// newHeldFault returns the fault and its injector; the gate opens at the
// end of the test at the latest.
func newHeldFault(t *testing.T, match func(faulty.Call) bool, f faulty.Fault) (*heldFault, faulty.Injector) {
	h := &heldFault{gate: make(chan struct{}), reached: make(chan struct{})}
	t.Cleanup(h.openGate)
	f.Hold = h.gate
	inj := faulty.Once(faulty.When(match, f))
	return h, faulty.InjectorFunc(func(c faulty.Call) faulty.Fault {
		got := inj.Inject(c)
		if got.Hold != nil {
			close(h.reached)
		}
		return got
	})
}

// openGate lets the held result through.
func (h *heldFault) openGate() { h.open.Do(func() { close(h.gate) }) }

// release waits until the held append was handed to the writer and the
// WAL's mutex is free again (Err takes it), then lets its result through.
func (h *heldFault) release(t *testing.T, w *wal.WAL) {
	t.Helper()
	select {
	case <-h.reached:
	case <-time.After(20 * time.Second):
		t.Fatal("the append to fault never reached the writer")
	}
	require.NoError(t, w.Err(), "the WAL serves while the append is in flight")
	h.openGate()
}

// appendsOf matches appends with a message of type typ.
func appendsOf(typ *messages.Type) func(faulty.Call) bool {
	return func(c faulty.Call) bool { return c.Op == faulty.OpAppend && c.HasType(typ) }
}

// appendAsync appends m on another goroutine and returns where its error
// arrives.
func appendAsync(w *wal.WAL, m *messages.MutableMessage) <-chan error {
	errs := make(chan error, 1)
	go func() {
		_, err := w.Append(context.Background(), m)
		errs <- err
	}()
	return errs
}

// TestFaultyDDLOfUnknownOutcomeStopsTheWAL: a CreateCollection whose
// outcome the writer cannot tell leaves the lifecycle state uncertain
// (package doc, "Open and recovery"): its caller gets the unknown outcome,
// the WAL stops with streamwal.ErrUnrecoverable and takes no append
// (nothing lands), and a reopen under the next term learns the truth from
// the stream: the collection exists if the CreateCollection landed, and
// does not if it was lost.
func TestFaultyDDLOfUnknownOutcomeStopsTheWAL(t *testing.T) {
	for _, c := range []struct {
		name   string
		landed bool
	}{{"landed", true}, {"lost", false}} {
		t.Run(c.name, func(t *testing.T) {
			e := newFaultyEnv(t)
			ctx := context.Background()
			w1 := openWith(t, e.faultyConfig(1))
			v1, v2 := e.vchannel(1), e.vchannel(2)
			e.createCollection(w1, v1)

			held, inj := newHeldFault(t, appendsOf(messages.TypeCreateCollection),
				faulty.Fault{Err: faulty.UnknownOutcome(), After: c.landed})
			e.fb.SetInjector(inj)
			errs := appendAsync(w1, e.createCollectionMsg(v2))
			held.release(t, w1)
			err := <-errs
			require.ErrorIs(t, err, streamwal.ErrUnknownOutcome)
			require.ErrorIs(t, err, faulty.ErrInjected)
			require.ErrorIs(t, w1.Err(), streamwal.ErrUnrecoverable)
			// Done tells its owner (the node) to drop it and have it reopened.
			select {
			case <-w1.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("a WAL stopped for an unknown DDL outcome is never done")
			}

			tail := ruleTail(t, e.env)
			_, err = w1.Append(ctx, e.insert(v1, "after the stop"))
			ruleRefused(t, e.env, nil, streamwal.VChannel{}, tail, err, streamwal.ErrUnrecoverable)
			_, err = w1.BeginTxn(ctx, v1, 0)
			ruleRefused(t, e.env, nil, streamwal.VChannel{}, tail, err, streamwal.ErrUnrecoverable)
			require.ErrorIs(t, w1.Sync(ctx), streamwal.ErrUnrecoverable)
			require.NoError(t, w1.Close())

			e.fb.SetInjector(nil)
			w2 := openWith(t, e.faultyConfig(2))
			ruleAppend(t, w2, e.insert(v1, "v1 lives on"))
			_, err = w2.Append(ctx, e.insert(v2, "v2?"))
			if c.landed {
				require.NoError(t, err, "the CreateCollection landed: v2 exists")
				_, err = w2.Append(ctx, e.createCollectionMsg(v2))
				require.ErrorIs(t, err, streamwal.ErrCollectionExists)
			} else {
				require.ErrorIs(t, err, streamwal.ErrCollectionNotFound, "the CreateCollection was lost")
				e.createCollection(w2, v2)
				ruleAppend(t, w2, e.insert(v2, "v2 now"))
			}
		})
	}
}

// TestFaultyDMLOfUnknownOutcomeKeepsServing: an insert of unknown outcome
// changes no state the WAL keeps, so the WAL does not stop: the caller gets
// the unknown outcome, and the next append lands right after it (it did
// land).
func TestFaultyDMLOfUnknownOutcomeKeepsServing(t *testing.T) {
	e := newFaultyEnv(t)
	w := openWith(t, e.faultyConfig(1))
	v := e.vchannel(1)
	e.createCollection(w, v)
	tail := ruleTail(t, e.env)

	held, inj := newHeldFault(t, appendsOf(messages.TypeInsert), faulty.Fault{Err: faulty.UnknownOutcome(), After: true})
	e.fb.SetInjector(inj)
	errs := appendAsync(w, e.insert(v, "unknown"))
	held.release(t, w)
	require.ErrorIs(t, <-errs, streamwal.ErrUnknownOutcome)
	require.NoError(t, w.Err())
	m := ruleAppend(t, w, e.insert(v, "next"))
	require.Equal(t, tail+2, m.ID())
}

// TestFaultyFencedAppendStopsTheWAL: an append the writer answers as
// fenced stops the WAL, which answers streamwal.ErrFenced from then on
// (package doc) and lands nothing more, whether the writer refused the
// append when it was handed over or learned of the fence while it was
// on its way; the next owner serves.
func TestFaultyFencedAppendStopsTheWAL(t *testing.T) {
	for _, c := range []struct {
		name string
		held bool
	}{{"refused", false}, {"in-flight", true}} {
		t.Run(c.name, func(t *testing.T) {
			e := newFaultyEnv(t)
			ctx := context.Background()
			w1 := openWith(t, e.faultyConfig(1))
			v := e.vchannel(1)
			e.createCollection(w1, v)
			tail := ruleTail(t, e.env)

			var err error
			if c.held {
				held, inj := newHeldFault(t, appendsOf(messages.TypeInsert), faulty.Fault{Err: faulty.Fenced()})
				e.fb.SetInjector(inj)
				errs := appendAsync(w1, e.insert(v, "fenced"))
				held.release(t, w1)
				err = <-errs
			} else {
				e.fb.SetInjector(faulty.Once(faulty.AppendsOf(messages.TypeInsert, faulty.Fault{Err: faulty.Fenced()})))
				_, err = w1.Append(ctx, e.insert(v, "fenced"))
			}
			ruleRefused(t, e.env, nil, streamwal.VChannel{}, tail, err, streamwal.ErrFenced)
			require.ErrorIs(t, w1.Err(), streamwal.ErrFenced)
			select {
			case <-w1.Done():
			case <-time.After(20 * time.Second):
				t.Fatal("a fenced WAL did not stop")
			}
			_, err = w1.Append(ctx, e.insert(v, "stale"))
			ruleRefused(t, e.env, nil, streamwal.VChannel{}, tail, err, streamwal.ErrFenced)
			require.ErrorIs(t, w1.Sync(ctx), streamwal.ErrFenced)

			w2 := openWith(t, e.faultyConfig(2))
			m := ruleAppend(t, w2, e.insert(v, "term 2"))
			require.Equal(t, w2.Barrier().ID()+1, m.ID())
		})
	}
}

// opens matches the open of a writer.
func opens(c faulty.Call) bool { return c.Op == faulty.OpOpenWriter }

// TestFaultyOpenWithUnavailableBackend: an open whose barrier the backend
// could not land fails with the backend's streamwal.ErrUnavailable and
// leaves the stream as it was, so the same term opens once the backend is
// back; an open whose barrier landed but whose answer was lost fails
// alike, and a retry under the same term finds that barrier and serves
// right after it.
func TestFaultyOpenWithUnavailableBackend(t *testing.T) {
	e := newFaultyEnv(t)
	ctx := context.Background()
	e.fb.SetInjector(faulty.When(opens, faulty.Fault{Err: faulty.Unavailable()}))
	_, err := wal.Open(ctx, e.faultyConfig(1))
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	st, err := e.backend.State(ctx, e.p)
	require.NoError(t, err)
	require.Zero(t, st.Last, "no barrier landed")

	e.fb.SetInjector(faulty.When(opens, faulty.Fault{Err: faulty.Unavailable(), After: true}))
	_, err = wal.Open(ctx, e.faultyConfig(1))
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	landed := ruleTail(t, e.env)
	require.NotZero(t, landed, "the barrier landed")

	e.fb.SetInjector(nil)
	w := openWith(t, e.faultyConfig(1))
	require.Equal(t, landed, w.Barrier().ID(), "the retry found its barrier")
	v := e.vchannel(1)
	m := e.createCollection(w, v)
	require.Equal(t, landed+1, m.ID())
}

// TestFaultyReplayWithUnavailableBackend: an open that cannot replay the
// stream (the read cannot start, or breaks off part-way) fails with the
// backend's error and takes no append; its barrier landed all the same,
// so the earlier owner is fenced, and the owner of the next term replays
// everything the earlier one wrote.
func TestFaultyReplayWithUnavailableBackend(t *testing.T) {
	for _, c := range []struct {
		name string
		inj  func() faulty.Injector
	}{
		{"read", func() faulty.Injector {
			return faulty.When(func(c faulty.Call) bool { return c.Op == faulty.OpRead }, faulty.Fault{Err: faulty.Unavailable()})
		}},
		{"next", func() faulty.Injector { return faulty.Nth(faulty.OpNext, 3, faulty.Fault{Err: faulty.Unavailable()}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newFaultyEnv(t)
			ctx := context.Background()
			w1 := openWith(t, e.faultyConfig(1))
			v := e.vchannel(1)
			e.createCollection(w1, v)
			ruleAppend(t, w1, e.insert(v, "term 1"))

			e.fb.SetInjector(c.inj())
			_, err := wal.Open(ctx, e.faultyConfig(2))
			require.ErrorIs(t, err, streamwal.ErrUnavailable)
			require.ErrorIs(t, err, faulty.ErrInjected)
			tail := ruleTail(t, e.env)
			_, err = w1.Append(ctx, e.insert(v, "stale"))
			ruleRefused(t, e.env, nil, streamwal.VChannel{}, tail, err, streamwal.ErrFenced)

			e.fb.SetInjector(nil)
			w3 := openWith(t, e.faultyConfig(3))
			require.Equal(t, tail, w3.Barrier().ID()-1, "the failed open's barrier is the last message before")
			m := ruleAppend(t, w3, e.insert(v, "term 3"))
			require.Equal(t, w3.Barrier().ID()+1, m.ID())
			_, err = w3.Append(ctx, e.createCollectionMsg(v))
			require.ErrorIs(t, err, streamwal.ErrCollectionExists, "the replay rebuilt the lifecycle")
		})
	}
}

// TestFaultyDeduplicatedAppendUnreadable: a retry of a stored message ID
// returns the message stored before, which the WAL reads back; when the
// backend cannot read it, the retry fails with streamwal.ErrUnknownOutcome
// (its caller cannot tell what was stored), lands nothing and leaves the
// WAL serving, and the next retry returns the stored message.
func TestFaultyDeduplicatedAppendUnreadable(t *testing.T) {
	e := newFaultyEnv(t)
	ctx := context.Background()
	w := openWith(t, e.faultyConfig(1))
	v := e.vchannel(1)
	e.createCollection(w, v)
	first := ruleAppend(t, w, e.insert(v, "once", messages.WithMsgID("m-1")))
	tail := ruleTail(t, e.env)

	sw := faulty.NewSwitch(faulty.Fault{Err: faulty.Unavailable()}, faulty.OpGet)
	e.fb.SetInjector(sw)
	sw.On()
	_, err := w.Append(ctx, e.insert(v, "once", messages.WithMsgID("m-1")))
	ruleRefused(t, e.env, nil, streamwal.VChannel{}, tail, err, streamwal.ErrUnknownOutcome, faulty.ErrInjected)
	require.NotZero(t, sw.Injected())
	require.NoError(t, w.Err())

	sw.Off()
	again := ruleAppend(t, w, e.insert(v, "once", messages.WithMsgID("m-1")))
	require.Equal(t, first.ID(), again.ID())
	require.Equal(t, "once", string(again.Payload()))
	require.Equal(t, tail, ruleTail(t, e.env))
}

// failing injects an unavailable backend into the operations match
// accepts while it is down, and counts them.
type failing struct {
	match func(faulty.Call) bool
	down  atomic.Bool
	tries atomic.Int64
}

// Inject implements faulty.Injector.
func (f *failing) Inject(c faulty.Call) faulty.Fault {
	if !f.down.Load() || !f.match(c) {
		return faulty.Fault{}
	}
	f.tries.Add(1)
	return faulty.Fault{Err: faulty.Unavailable()}
}

// TestFaultyLedgerWaitsOutAnUnreadableGap: an insert of unknown outcome
// that landed leaves a gap below what the WAL learned; the storage loop
// reads it from the stream once it waited long enough (package doc,
// "Recovery storage"). While the backend cannot read it, the ledger
// consumes nothing past the gap (an unreadable message is not a missing
// one); once it can, the ledger consumes through the stream's last
// message, every insert once, and persists that.
func TestFaultyLedgerWaitsOutAnUnreadableGap(t *testing.T) {
	e := newStorageEnv(t, nil)
	fb := faulty.New(e.js, nil)
	cfg := e.storageConfig(1)
	cfg.Backend = fb
	cfg.SyncInterval = time.Hour // no TimeTick lands of itself: the gap is where the test says
	w := openWith(t, cfg)
	v := e.vchannel(1)
	e.createCollection(w, v)
	ruleAppend(t, w, e.insert(v, "before", messages.WithDML(0, 1)))
	gap := e.streamLast() + 1

	held, unknown := newHeldFault(t, appendsOf(messages.TypeInsert), faulty.Fault{Err: faulty.UnknownOutcome(), After: true})
	get := &failing{match: func(c faulty.Call) bool { return c.Op == faulty.OpGet && c.ID == gap }}
	get.down.Store(true)
	fb.SetInjector(faulty.First(unknown, get))
	errs := appendAsync(w, e.insert(v, "unknown", messages.WithDML(0, 1)))
	held.release(t, w)
	require.ErrorIs(t, <-errs, streamwal.ErrUnknownOutcome)
	for i := range 3 {
		ruleAppend(t, w, e.insert(v, fmt.Sprint("after ", i), messages.WithDML(0, 1)))
	}

	waitFor(t, "the storage loop tried to read the gap twice", func() bool { return get.tries.Load() >= 2 })
	st, _ := w.StorageState()
	require.Equal(t, gap-1, st.Consumed.Consumed, "nothing consumed past the unreadable gap")

	get.down.Store(false)
	waitFor(t, "the ledger consumed and persisted through the stream's last message", func() bool {
		st, _ := w.StorageState()
		last := e.streamLast()
		return st.Consumed.Consumed == last && st.Persisted.Consumed == last
	})
	st, _ = w.StorageState()
	require.Equal(t, 5, e.insertsIn(st.Consumed.Consumed))
	require.Equal(t, uint64(5), rowsIn(st), "every insert consumed once, the unknown one too")
}

// TestFaultyTruncationRetriedUntilApplied: a truncation the backend
// cannot apply removes nothing and is not recorded as applied; the
// storage loop retries it, and once it is applied the point is persisted
// with the next checkpoint (package doc, "Truncation").
func TestFaultyTruncationRetriedUntilApplied(t *testing.T) {
	e := newStorageEnv(t, nil)
	e.retain = 0
	fb := faulty.New(e.js, nil)
	trunc := &failing{match: func(c faulty.Call) bool { return c.Op == faulty.OpTruncate }}
	trunc.down.Store(true)
	fb.SetInjector(trunc)
	cfg := e.storageConfig(1)
	cfg.Backend = fb
	w := openWith(t, cfg)
	v := e.vchannel(1)
	e.createCollection(w, v)
	first := func() messages.MessageID {
		st, err := e.js.State(context.Background(), e.p)
		require.NoError(t, err)
		return st.First
	}
	before := first()

	waitFor(t, "two truncations tried", func() bool { return trunc.tries.Load() >= 2 })
	require.Equal(t, before, first(), "a failed truncation removed nothing")
	waitFor(t, "a checkpoint persisted", func() bool {
		st, _ := w.StorageState()
		return st.Persisted.Consumed > 0
	})
	st, _ := w.StorageState()
	require.Zero(t, st.Persisted.Truncated, "a failed truncation is not recorded as applied")

	trunc.down.Store(false)
	waitFor(t, "the truncation applied and persisted", func() bool {
		st, _ := w.StorageState()
		return st.Persisted.Truncated > before && first() >= st.Persisted.Truncated
	})
}

// TestFaultyHistoryCheckWithUnavailableBackend: with recovery storage,
// Open checks that the stream holds the history the checkpoint records
// before its barrier lands (package doc, "History is never rewritten").
// A backend that cannot answer (its state, or the message last consumed)
// fails the open with streamwal.ErrUnavailable, never with
// streamwal.ErrHistoryLost: nothing lands and the checkpoint stays the
// earlier owner's, and the open succeeds from the checkpoint once the
// backend answers.
func TestFaultyHistoryCheckWithUnavailableBackend(t *testing.T) {
	e := newStorageEnv(t, nil)
	w1 := e.openStorage(1)
	v := e.vchannel(1)
	e.createCollection(w1, v)
	ruleAppend(t, w1, e.insert(v, "row", messages.WithDML(0, 1)))
	require.NoError(t, w1.Close())
	cp := storedCheckpoint(t, e.store, e.p)
	require.NotZero(t, cp.Digest, "a graceful close persisted the checkpoint")
	tail := e.streamLast()

	fb := faulty.New(e.js, nil)
	cfg := e.storageConfig(2)
	cfg.Backend, cfg.Storage.Tiers = fb, fb
	for _, op := range []faulty.Op{faulty.OpState, faulty.OpGet} {
		fb.SetInjector(faulty.When(func(c faulty.Call) bool { return c.Op == op }, faulty.Fault{Err: faulty.Unavailable()}))
		_, err := wal.Open(context.Background(), cfg)
		require.ErrorIs(t, err, streamwal.ErrUnavailable, "%s failing", op)
		require.NotErrorIs(t, err, streamwal.ErrHistoryLost, "%s failing", op)
		require.Equal(t, tail, e.streamLast(), "%s failing: no barrier landed", op)
		require.Equal(t, cp, storedCheckpoint(t, e.store, e.p), "%s failing: the checkpoint is not claimed", op)
	}

	fb.SetInjector(nil)
	w2 := openWith(t, cfg)
	require.Equal(t, cp.Consumed, w2.Recovered().Checkpoint, "replayed from the checkpoint")
	ruleAppend(t, w2, e.insert(v, "term 2", messages.WithDML(0, 1)))
}

// liveTicks subscribes to the env's live ticks; drain returns those
// published before it was called (a sentinel on the same connection
// marks the end).
func (e *faultyEnv) liveTicks() (drain func() []messages.LiveTick) {
	e.t.Helper()
	subject := e.codec.Cluster().LiveTickSubject(e.p)
	sub, err := e.nc.SubscribeSync(subject)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return func() []messages.LiveTick {
		e.t.Helper()
		require.NoError(e.t, e.nc.Publish(subject, []byte("sentinel")))
		var out []messages.LiveTick
		for {
			m, err := sub.NextMsg(10 * time.Second)
			require.NoError(e.t, err)
			if string(m.Data) == "sentinel" {
				return out
			}
			lt, err := e.codec.DecodeLiveTick(m)
			require.NoError(e.t, err)
			out = append(out, lt)
		}
	}
}

// TestFaultyIdleSyncWithoutFenceCheck: an idle WAL publishes a live tick
// only after it looked for a newer owner (package doc, "TimeTicks"; see
// Sync). When the backend cannot answer that look, the sync round fails
// with its error and publishes nothing, and the WAL, not known to be
// fenced, keeps serving; once the backend answers, the round publishes.
func TestFaultyIdleSyncWithoutFenceCheck(t *testing.T) {
	e := newFaultyEnv(t)
	ctx := context.Background()
	w := openWith(t, e.faultyConfig(1))
	v := e.vchannel(1)
	e.createCollection(w, v)
	require.NoError(t, w.Sync(ctx)) // persists a TimeTick: the WAL is idle at the tail from now on
	drain := e.liveTicks()

	sw := faulty.NewSwitch(faulty.Fault{Err: faulty.Unavailable()}, faulty.OpFenced)
	e.fb.SetInjector(sw)
	sw.On()
	err := w.Sync(ctx)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.Equal(t, int64(1), sw.Injected(), "the idle round looked for a newer owner")
	require.Empty(t, drain(), "no live tick without the look")
	require.NoError(t, w.Err())

	sw.Off()
	require.NoError(t, w.Sync(ctx))
	ticks := drain()
	require.Len(t, ticks, 1)
	require.Equal(t, w.Term(), ticks[0].Term)
	ruleAppend(t, w, e.insert(v, "still serving"))
}
