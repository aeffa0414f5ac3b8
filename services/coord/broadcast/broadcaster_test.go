package broadcast_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord/broadcast"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

func TestBroadcastAppendsEveryTargetOnce(t *testing.T) {
	e := newEnv(t)
	// Every append finds its task persisted (PENDING) first.
	var mu sync.Mutex
	var seen []broadcast.State
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, e.store.state(m.Header().Broadcast.ID))
		return nil
	})
	b := e.start(e.config())
	req := e.createCollection("db", "c1", 1, e.v1, e.v2)
	res, err := b.Broadcast(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, uint64(101), res.ID)

	targets := []string{e.v1.String(), e.v2.String(), e.cchn.String()}
	landed := e.app.Landed()
	require.Len(t, landed, 3)
	require.Len(t, e.app.Calls(), 3, "no retries")
	require.ElementsMatch(t, targets, []string{landed[0].target, landed[1].target, landed[2].target})
	wantKeys, err := messages.ResourceKeys(messages.TypeCreateCollection, req.Scope)
	require.NoError(t, err)
	for _, l := range landed {
		h := l.msg.Header()
		require.NotNil(t, h.Broadcast, "replica to %s has no broadcast header", l.target)
		require.Equal(t, res.ID, h.Broadcast.ID)
		require.Equal(t, []streamwal.VChannel{e.v1, e.v2, e.cchn}, h.Broadcast.VChannels)
		require.Equal(t, wantKeys, h.Broadcast.Keys)
		require.Equal(t, messages.BroadcastMsgID(res.ID, messages.Header{PChannel: h.PChannel, VChannel: h.VChannel}), h.MsgID)
		require.Equal(t, l.target, h.VChannel.String())
		require.Equal(t, req.Payload, l.msg.Payload())
		require.Equal(t, messages.TypeCreateCollection, l.msg.Type())
		require.Equal(t, l.res, res.Appended[l.target], "the result names where %s landed", l.target)
	}
	require.Len(t, res.Appended, 3)
	mu.Lock()
	require.Equal(t, []broadcast.State{broadcast.Pending, broadcast.Pending, broadcast.Pending}, seen)
	mu.Unlock()

	task := e.store.get(res.ID)
	require.NotNil(t, task)
	require.Equal(t, broadcast.Tombstone, task.State)
	require.Equal(t, res.Appended, task.Appended)
	for _, name := range targets {
		require.True(t, task.Acked[name], "%s acknowledged", name)
	}
	require.False(t, task.Finished.IsZero())
	require.Equal(t, messages.TypeCreateCollection.Name, task.Type)
	require.Equal(t, []uint64{res.ID}, e.cbs.Ran())
	require.False(t, b.KeysHeld(res.ID))
	require.Zero(t, b.Stuck())

	// The keys are free: a conflicting broadcast proceeds.
	res2, err := b.Broadcast(context.Background(), e.createCollection("db", "c1", 1, e.v1, e.v2))
	require.NoError(t, err)
	require.Equal(t, uint64(102), res2.ID)
	require.Len(t, e.app.landedOf(res2.ID), 3)
}

func TestBroadcastRefusesBadRequestsWithoutATask(t *testing.T) {
	e := newEnv(t)
	b := e.start(e.config())
	ctx := context.Background()
	_, err := b.Broadcast(ctx, broadcast.Request{})
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "no type")
	req := e.createCollection("db", "c1", 1, e.v1)
	req.Targets.CChannel = streamwal.VChannel{}
	_, err = b.Broadcast(ctx, req)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "CreateCollection needs the CChannel")
	req = e.createCollection("db", "c1", 1, e.v1)
	req.AppendFirst = e.v3
	_, err = b.Broadcast(ctx, req)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "append-first must be a target")
	req = e.createCollection("db", "", 1, e.v1)
	_, err = b.Broadcast(ctx, req)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "a collection key needs a collection name")
	require.Zero(t, e.ids())
	require.Empty(t, e.store.ids())
	require.Empty(t, e.app.Calls())
}

func TestBroadcastNewIDFailureCreatesNothing(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.NewID = func(ctx context.Context) (uint64, error) {
		return 0, streamwal.Errorf(streamwal.CodeUnavailable, "no oracle")
	}
	b := e.start(cfg)
	_, err := b.Broadcast(context.Background(), e.createDatabase("db"))
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.Empty(t, e.store.ids())
	require.Empty(t, e.app.Calls())
}

func TestBroadcastClusterBarrierReachesEveryPChannel(t *testing.T) {
	e := newEnv(t)
	b := e.start(e.config())
	req := broadcast.Request{
		Type:    messages.TypeAlterWAL,
		Targets: messages.Targets{PChannels: []streamwal.PChannel{e.p0, e.p1, e.p2}},
		Payload: mustBody(t, messages.TypeAlterWAL, messages.AlterWALBody{Settings: map[string]string{"k": "v"}}),
	}
	res, err := b.Broadcast(context.Background(), req)
	require.NoError(t, err)
	require.Len(t, res.Appended, 3)
	for _, l := range e.app.landedOf(res.ID) {
		h := l.msg.Header()
		require.True(t, h.VChannel.IsZero(), "a PChannel-level replica")
		require.Equal(t, l.target, h.PChannel.String())
		require.Equal(t, messages.BroadcastMsgID(res.ID, messages.Header{PChannel: h.PChannel}), h.MsgID)
		require.Equal(t, l.res, res.Appended[l.target])
	}
	require.Len(t, e.app.landedOf(res.ID), 3)
	require.Equal(t, broadcast.Tombstone, e.store.state(res.ID))
}

func TestBroadcastClusterBarrierExcludesEverything(t *testing.T) {
	e := newEnv(t)
	g := newGate()
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error {
		if m.Header().Broadcast.ID == 101 {
			return g.wait(ctx)
		}
		return nil
	})
	b := e.start(e.config())
	barrier := e.goBroadcast(context.Background(), broadcast.Request{
		Type:    messages.TypeAlterWAL,
		Targets: messages.Targets{PChannels: []streamwal.PChannel{e.p0, e.p1}},
		Payload: mustBody(t, messages.TypeAlterWAL, messages.AlterWALBody{}),
	})
	require.Eventually(t, func() bool { return g.arrivals.Load() == 2 }, waitFor, tick)
	db := e.goBroadcast(context.Background(), e.createDatabase("db"))
	require.Eventually(t, func() bool { return b.KeysWaiting() == 1 }, waitFor, tick, "an ordinary broadcast waits for the barrier")
	require.Empty(t, e.app.landedOf(102))
	g.release()
	require.NoError(t, recv(t, barrier).err)
	o := recv(t, db)
	require.NoError(t, o.err)
	require.Equal(t, uint64(102), o.res.ID)
}

func TestConflictingBroadcastsNeverHoldKeysTogether(t *testing.T) {
	e := newEnv(t)
	g := newGate()
	var mu sync.Mutex
	var firstAtSecond []broadcast.State // the first's stored state at each append of the second
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error {
		switch m.Header().Broadcast.ID {
		case 101:
			return g.wait(ctx)
		case 102:
			mu.Lock()
			firstAtSecond = append(firstAtSecond, e.store.state(101))
			mu.Unlock()
		}
		return nil
	})
	b := e.start(e.config())
	first := e.goBroadcast(context.Background(), e.createCollection("db", "c1", 1, e.v1, e.v2))
	require.Eventually(t, func() bool { return g.arrivals.Load() == 3 }, waitFor, tick)
	second := e.goBroadcast(context.Background(), e.createCollection("db", "c1", 1, e.v1, e.v2))
	require.Eventually(t, func() bool { return b.KeysWaiting() == 1 }, waitFor, tick)
	require.True(t, b.KeysHeld(101))
	require.False(t, b.KeysHeld(102))
	require.True(t, pending(first) && pending(second))
	for _, c := range e.app.Calls() {
		require.NotEqual(t, uint64(102), c.id, "the second appended while the first held the keys")
	}
	require.Equal(t, []uint64{101}, e.store.ids(), "the second is not persisted before it has its keys")

	g.release()
	require.NoError(t, recv(t, first).err)
	require.NoError(t, recv(t, second).err)
	// Every replica of the second landed after every replica of the
	// first, and only once the first was a tombstone.
	landed := e.app.Landed()
	require.Len(t, landed, 6)
	for i, l := range landed {
		require.Equal(t, uint64(101+i/3), l.id, "landing %d", i)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []broadcast.State{broadcast.Tombstone, broadcast.Tombstone, broadcast.Tombstone}, firstAtSecond)
	require.Equal(t, []uint64{101, 102}, e.cbs.Ran())
}

func TestNonConflictingBroadcastsRunConcurrently(t *testing.T) {
	e := newEnv(t)
	g := newGate()
	var mu sync.Mutex
	arrived := map[uint64]bool{}
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error {
		mu.Lock()
		arrived[m.Header().Broadcast.ID] = true
		mu.Unlock()
		return g.wait(ctx)
	})
	b := e.start(e.config())
	a := e.goBroadcast(context.Background(), e.createCollection("db", "c1", 1, e.v1, e.v2))
	c := e.goBroadcast(context.Background(), e.createCollection("db", "c2", 2, e.v3))
	d := e.goBroadcast(context.Background(), e.createDatabase("other"))
	// All three wait at the appender at the same time.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(arrived) == 3
	}, waitFor, tick)
	require.Zero(t, b.KeysWaiting())
	g.release()
	for _, ch := range []<-chan outcome{a, c, d} {
		require.NoError(t, recv(t, ch).err)
	}
	require.ElementsMatch(t, []uint64{101, 102, 103}, e.cbs.Ran())
}

func TestAppendFirstLandsAndIsPersistedBeforeTheOthers(t *testing.T) {
	e := newEnv(t)
	type seen struct {
		target string
		task   *broadcast.Task
	}
	var mu sync.Mutex
	var calls []seen
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, seen{target, e.store.get(m.Header().Broadcast.ID)})
		return nil
	})
	b := e.start(e.config())
	req := e.createCollection("db", "c1", 1, e.v1, e.v2, e.v3)
	req.AppendFirst = e.v2
	res, err := b.Broadcast(context.Background(), req)
	require.NoError(t, err)
	require.Len(t, res.Appended, 4)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 4)
	require.Equal(t, e.v2.String(), calls[0].target)
	require.NotNil(t, calls[0].task, "the task is persisted before the first append")
	require.Equal(t, broadcast.Pending, calls[0].task.State)
	require.Equal(t, e.v2.String(), calls[0].task.AppendFirst)
	require.Empty(t, calls[0].task.Appended)
	for _, c := range calls[1:] {
		require.NotEqual(t, e.v2.String(), c.target)
		require.Contains(t, c.task.Appended, e.v2.String(), "%s appended before the append-first target was persisted", c.target)
	}
	require.Equal(t, e.v2.String(), e.app.Landed()[0].target)
}

func TestRetriableAppendFailuresAreRetried(t *testing.T) {
	e := newEnv(t)
	unavailable := streamwal.Errorf(streamwal.CodeUnavailable, "owner moving")
	e.app.failNext(e.v1.String(), unavailable, unavailable, unavailable)
	e.app.failNext(e.cchn.String(),
		streamwal.Errorf(streamwal.CodeFenced, "old owner"),
		streamwal.Errorf(streamwal.CodeNotOwned, "not here"),
		streamwal.Errorf(streamwal.CodeClosed, "closing"))
	// v2's first append lands but its answer is lost: the retry gets the
	// stored message's result from the WAL's deduplication.
	e.app.loseReply(e.v2.String(), streamwal.Errorf(streamwal.CodeUnknownOutcome, "reply lost"))
	b := e.start(e.config())
	res, err := b.Broadcast(context.Background(), e.createCollection("db", "c1", 1, e.v1, e.v2))
	require.NoError(t, err)
	require.Equal(t, 4, e.app.callsTo(res.ID, e.v1.String()))
	require.Equal(t, 2, e.app.callsTo(res.ID, e.v2.String()))
	require.Equal(t, 4, e.app.callsTo(res.ID, e.cchn.String()))
	landed := e.app.landedOf(res.ID)
	require.Len(t, landed, 3, "each target landed once")
	for _, l := range landed {
		require.Equal(t, l.res, res.Appended[l.target])
	}
	require.Equal(t, broadcast.Tombstone, e.store.state(res.ID))
	require.Zero(t, b.Stuck())
}

func TestPermanentRefusalMakesTheTaskStuck(t *testing.T) {
	e := newEnv(t)
	e.app.failNext(e.v2.String(), streamwal.Errorf(streamwal.CodeLifecycle, "collection dropped"))
	b := e.start(e.config())
	_, err := b.Broadcast(context.Background(), e.createCollection("db", "c1", 1, e.v1, e.v2))
	require.ErrorIs(t, err, streamwal.ErrUnrecoverable)
	require.Equal(t, int64(1), b.Stuck())
	task := e.store.get(101)
	require.NotNil(t, task)
	require.Equal(t, broadcast.Stuck, task.State)
	require.Contains(t, task.Error, "collection dropped")
	require.Equal(t, 1, e.app.callsTo(101, e.v2.String()), "a permanent refusal is not retried")
	require.Empty(t, e.cbs.Ran(), "no callback for a stuck task")
	require.True(t, b.KeysHeld(101), "a stuck task keeps its keys")

	// A conflicting broadcast waits until its context ends.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conflicting := e.goBroadcast(ctx, e.createCollection("db", "c1", 1, e.v1))
	require.Eventually(t, func() bool { return b.KeysWaiting() == 1 }, waitFor, tick)
	cancel()
	o := recv(t, conflicting)
	require.ErrorIs(t, o.err, streamwal.ErrResourceBusy)
	require.Zero(t, b.KeysWaiting())
	require.Equal(t, []uint64{101}, e.store.ids(), "the one that gave up left no task")

	// Others go on.
	res, err := b.Broadcast(context.Background(), e.createCollection("db", "c2", 2, e.v3))
	require.NoError(t, err)
	require.Equal(t, broadcast.Tombstone, e.store.state(res.ID))
	require.True(t, b.KeysHeld(101))
}

func TestAckSyncUpWaitsForEveryAcknowledgement(t *testing.T) {
	e := newEnv(t)
	b := e.start(e.config())
	ctx := context.Background()
	call := e.goBroadcast(ctx, e.truncate("db", "c1", 1, e.v1, e.v2))
	const id = 101
	require.Eventually(t, func() bool {
		task := e.store.get(id)
		return task != nil && len(task.Appended) == 3
	}, waitFor, tick, "every replica lands and is recorded")

	require.ErrorIs(t, b.Ack(ctx, 999, e.v1.String()), streamwal.ErrInvalidArgument, "unknown broadcast")
	require.ErrorIs(t, b.Ack(ctx, id, e.v3.String()), streamwal.ErrInvalidArgument, "not a target")
	require.ErrorIs(t, b.Ack(ctx, id, "nonsense"), streamwal.ErrInvalidArgument, "not a target")

	require.NoError(t, b.Ack(ctx, id, e.v1.String()))
	require.NoError(t, b.Ack(ctx, id, e.cchn.String()))
	require.NoError(t, b.Ack(ctx, id, e.cchn.String()), "a repeated acknowledgement is harmless")
	task := e.store.get(id)
	require.True(t, task.Acked[e.v1.String()] && task.Acked[e.cchn.String()], "acknowledgements are persisted")
	require.False(t, task.Acked[e.v2.String()])
	require.Equal(t, broadcast.Pending, task.State)
	require.Empty(t, e.cbs.Ran(), "no callback before every target is acknowledged")
	require.True(t, pending(call))

	go func() { _ = b.Ack(ctx, id, e.v2.String()) }()
	o := recv(t, call)
	require.NoError(t, o.err)
	require.Equal(t, uint64(id), o.res.ID)
	require.Len(t, o.res.Appended, 3)
	require.Equal(t, []uint64{id}, e.cbs.Ran())
	require.Equal(t, broadcast.Tombstone, e.store.state(id))
	require.NoError(t, b.Ack(ctx, id, e.v2.String()), "acknowledging a finished broadcast is a no-op")
	require.Len(t, e.app.landedOf(id), 3)
}

func TestCallbacksAreRetriedUntilTheySucceed(t *testing.T) {
	e := newEnv(t)
	e.cbs.fail = 3
	b := e.start(e.config())
	res, err := b.Broadcast(context.Background(), e.createDatabase("db"))
	require.NoError(t, err)
	require.Equal(t, 4, e.cbs.Tries(res.ID))
	require.Equal(t, []uint64{res.ID}, e.cbs.Ran())
	require.Equal(t, broadcast.Tombstone, e.store.state(res.ID))
}

func TestCallbacksSeeTheAcknowledgedTask(t *testing.T) {
	e := newEnv(t)
	var got *broadcast.Task
	e.cbs.seen = func(task *broadcast.Task) {
		c := *task
		got = &c
	}
	b := e.start(e.config())
	res, err := b.Broadcast(context.Background(), e.createCollection("db", "c1", 1, e.v1))
	require.NoError(t, err)
	e.cbs.mu.Lock()
	defer e.cbs.mu.Unlock()
	require.NotNil(t, got)
	require.Equal(t, res.ID, got.ID)
	require.Equal(t, broadcast.Pending, got.State, "the callback runs before the tombstone")
	require.Len(t, got.Appended, 2)
}

// TestCallbacksFollowCChannelAcknowledgements: B's CChannel replica lands
// before A's, so B's callback runs first although A is older.
func TestCallbacksFollowCChannelAcknowledgements(t *testing.T) {
	e := newEnv(t)
	g := newGate()
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error {
		if m.Header().Broadcast.ID == 101 {
			return g.wait(ctx)
		}
		return nil
	})
	b := e.start(e.config())
	a := e.goBroadcast(context.Background(), e.createDatabase("db1"))
	require.Eventually(t, func() bool { return g.arrivals.Load() == 1 }, waitFor, tick)
	res, err := b.Broadcast(context.Background(), e.createDatabase("db2"))
	require.NoError(t, err)
	require.Equal(t, uint64(102), res.ID)
	require.Equal(t, []uint64{102}, e.cbs.Ran())
	g.release()
	require.NoError(t, recv(t, a).err)
	require.Equal(t, []uint64{102, 101}, e.cbs.Ran())
}

// TestCallbackWaitsForEarlierCChannelAcknowledgement: A's CChannel is
// acknowledged before B's, so B's callback waits for A's, which waits for
// A's other target; and a later CChannel acknowledgement of an older task
// comes after.
func TestCallbackWaitsForEarlierCChannelAcknowledgement(t *testing.T) {
	e := newEnv(t)
	b := e.start(e.config())
	ctx := context.Background()
	landed := func(id uint64, n int) func() bool {
		return func() bool {
			task := e.store.get(id)
			return task != nil && len(task.Appended) == n
		}
	}
	a := e.goBroadcast(ctx, e.truncate("db", "c1", 1, e.v1))
	require.Eventually(t, landed(101, 2), waitFor, tick)
	require.NoError(t, b.Ack(ctx, 101, e.cchn.String()))
	bb := e.goBroadcast(ctx, e.truncate("db", "c2", 2, e.v3))
	require.Eventually(t, landed(102, 2), waitFor, tick)
	c := e.goBroadcast(ctx, e.truncate("db", "c3", 3, e.v2))
	require.Eventually(t, landed(103, 2), waitFor, tick)
	// CChannel acknowledgements: 101, 103, 102. 102 and 103 are fully
	// acknowledged, 101 is not.
	require.NoError(t, b.Ack(ctx, 103, e.cchn.String()))
	require.NoError(t, b.Ack(ctx, 103, e.v2.String()))
	require.NoError(t, b.Ack(ctx, 102, e.cchn.String()))
	require.NoError(t, b.Ack(ctx, 102, e.v3.String()))
	require.Eventually(t, func() bool {
		t2, t3 := e.store.get(102), e.store.get(103)
		return len(t2.Acked) == 2 && len(t3.Acked) == 2
	}, waitFor, tick)
	require.Empty(t, e.cbs.Ran(), "the head of the queue is not fully acknowledged")
	require.True(t, pending(a) && pending(bb) && pending(c))
	require.NoError(t, b.Ack(ctx, 101, e.v1.String()))
	for _, ch := range []<-chan outcome{a, bb, c} {
		require.NoError(t, recv(t, ch).err)
	}
	require.Equal(t, []uint64{101, 103, 102}, e.cbs.Ran())
}

func TestIdempotencyKeyReturnsTheOriginalResult(t *testing.T) {
	e := newEnv(t)
	b := e.start(e.config())
	ctx := context.Background()
	req := e.createDatabase("db")
	req.IdempotencyKey = "db:create"
	first, err := b.Broadcast(ctx, req)
	require.NoError(t, err)
	again, err := b.Broadcast(ctx, req)
	require.NoError(t, err)
	require.Equal(t, first, again)
	require.Equal(t, uint64(1), e.ids(), "no new task")
	require.Len(t, e.app.Landed(), 1)
	require.Equal(t, []uint64{first.ID}, e.cbs.Ran())

	// The key is scoped by the type.
	other := broadcast.Request{Type: messages.TypeDropDatabase, Targets: req.Targets, Scope: req.Scope,
		Payload: req.Payload, IdempotencyKey: req.IdempotencyKey}
	dropped, err := b.Broadcast(ctx, other)
	require.NoError(t, err)
	require.NotEqual(t, first.ID, dropped.ID)
	// Without a key, a repeat is a new task.
	req.IdempotencyKey = ""
	plain, err := b.Broadcast(ctx, req)
	require.NoError(t, err)
	require.NotEqual(t, first.ID, plain.ID)
	require.Equal(t, uint64(3), e.ids())
}

func TestIdempotencyKeyWaitsForTheRunningOriginal(t *testing.T) {
	e := newEnv(t)
	g := newGate()
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error {
		return g.wait(ctx)
	})
	b := e.start(e.config())
	req := e.createCollection("db", "c1", 1, e.v1)
	req.IdempotencyKey = "coll:c1"
	first := e.goBroadcast(context.Background(), req)
	require.Eventually(t, func() bool { return g.arrivals.Load() == 2 }, waitFor, tick)

	// A retry whose context ends returns while the original runs on.
	ctx, cancel := context.WithCancel(context.Background())
	impatient := e.goBroadcast(ctx, req)
	cancel()
	o := recv(t, impatient)
	require.ErrorIs(t, o.err, streamwal.ErrUnavailable)
	require.Equal(t, uint64(101), o.res.ID, "it names the running task")

	second := e.goBroadcast(context.Background(), req)
	require.Zero(t, b.KeysWaiting(), "the retry does not queue for keys")
	require.True(t, pending(first) && pending(second))
	g.release()
	o1, o2 := recv(t, first), recv(t, second)
	require.NoError(t, o1.err)
	require.NoError(t, o2.err)
	require.Equal(t, o1.res, o2.res)
	require.Equal(t, uint64(1), e.ids())
	require.Len(t, e.app.Landed(), 2)
	require.Equal(t, []uint64{101}, e.cbs.Ran())
}

// TestStuckHeadOfTheCallbackQueueLetsLaterCallbacksRun: A's CChannel is
// acknowledged first, so B's callback waits behind A's; when A then gets
// stuck, it leaves the queue and B's callback must run.
func TestStuckHeadOfTheCallbackQueueLetsLaterCallbacksRun(t *testing.T) {
	e := newEnv(t)
	g := newGate()
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error {
		if m.Header().Broadcast.ID == 101 && target == e.v1.String() {
			if err := g.wait(ctx); err != nil {
				return err
			}
			return streamwal.Errorf(streamwal.CodeLifecycle, "collection dropped meanwhile")
		}
		return nil
	})
	b := e.start(e.config())
	ctx := context.Background()
	a := e.goBroadcast(ctx, e.truncate("db", "c1", 1, e.v1))
	require.Eventually(t, func() bool {
		task := e.store.get(101)
		return task != nil && len(task.Appended) == 1 && g.arrivals.Load() == 1
	}, waitFor, tick)
	require.NoError(t, b.Ack(ctx, 101, e.cchn.String()))
	bb := e.goBroadcast(ctx, e.createDatabase("db2"))
	require.Eventually(t, func() bool {
		task := e.store.get(102)
		return task != nil && task.Acked[e.cchn.String()]
	}, waitFor, tick)
	require.Empty(t, e.cbs.Ran())
	g.release()
	require.ErrorIs(t, recv(t, a).err, streamwal.ErrUnrecoverable)
	require.NoError(t, recv(t, bb).err)
	require.Equal(t, []uint64{102}, e.cbs.Ran())
}

// TestCallbackTaskIsNotWrittenConcurrently: a callback may read the task
// it is given while a late or repeated acknowledgement arrives.
func TestCallbackTaskIsNotWrittenConcurrently(t *testing.T) {
	e := newEnv(t)
	inside, leave := make(chan struct{}), make(chan struct{})
	var sink atomic.Int64
	var once sync.Once
	cfg := e.config()
	cfg.Callbacks[messages.TypeTruncateCollection.Name] = func(ctx context.Context, task *broadcast.Task) error {
		once.Do(func() { close(inside) })
		for {
			select {
			case <-leave:
				return nil
			default:
			}
			acked := 0
			for _, ok := range task.Acked { // read the task as a callback may
				if ok {
					acked++
				}
			}
			sink.Store(int64(acked))
		}
	}
	b := e.start(cfg)
	ctx := context.Background()
	call := e.goBroadcast(ctx, e.truncate("db", "c1", 1, e.v1))
	require.Eventually(t, func() bool {
		task := e.store.get(101)
		return task != nil && len(task.Appended) == 2
	}, waitFor, tick)
	require.NoError(t, b.Ack(ctx, 101, e.v1.String()))
	require.NoError(t, b.Ack(ctx, 101, e.cchn.String()))
	<-inside
	require.NoError(t, b.Ack(ctx, 101, e.v1.String()), "a repeated acknowledgement while the callback runs")
	close(leave)
	require.NoError(t, recv(t, call).err)
}

// TestIdempotencyKeyWhileTheOriginalWaitsForKeys: a retry that arrives
// while the original still waits for its resource keys (the caller timed
// out and retried at once) must not become a second task.
func TestIdempotencyKeyWhileTheOriginalWaitsForKeys(t *testing.T) {
	e := newEnv(t)
	g := newGate()
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error {
		if m.Header().Broadcast.ID == 101 {
			return g.wait(ctx)
		}
		return nil
	})
	b := e.start(e.config())
	blocker := e.goBroadcast(context.Background(), e.createCollection("db", "c1", 1, e.v1))
	require.Eventually(t, func() bool { return g.arrivals.Load() == 2 }, waitFor, tick)
	req := e.createCollection("db", "c1", 1, e.v1)
	req.IdempotencyKey = "coll:c1:again"
	original := e.goBroadcast(context.Background(), req)
	require.Eventually(t, func() bool { return b.KeysWaiting() == 1 }, waitFor, tick)
	// The retry starts while the original waits for its keys; with the
	// bug it draws its own ID and queues behind the original long before
	// the blocker's release lets the original be persisted.
	retry := e.goBroadcast(context.Background(), req)
	g.release()
	require.NoError(t, recv(t, blocker).err)
	o1, o2 := recv(t, original), recv(t, retry)
	require.NoError(t, o1.err)
	require.NoError(t, o2.err)
	require.Equal(t, o1.res.ID, o2.res.ID, "one task for one idempotency key")
	require.Len(t, e.app.Landed(), 4)
}

func TestStoreFailureAtCreationCreatesNothing(t *testing.T) {
	e := newEnv(t)
	e.store.setFailSave(func(task *broadcast.Task) error {
		return streamwal.Errorf(streamwal.CodeUnavailable, "bucket down")
	})
	b := e.start(e.config())
	req := e.createCollection("db", "c1", 1, e.v1)
	req.IdempotencyKey = "k"
	_, err := b.Broadcast(context.Background(), req)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.Empty(t, e.app.Calls())
	require.Empty(t, e.store.ids())
	require.False(t, b.KeysHeld(101), "the keys are given back")

	e.store.setFailSave(nil)
	res, err := b.Broadcast(context.Background(), req)
	require.NoError(t, err, "the keys are free and the key is not taken by the failed attempt")
	require.Equal(t, uint64(102), res.ID)
}

// TestTransientStoreFailuresAreRetried: a save that fails once after the
// task was created (the bucket briefly unavailable) must not lose the
// task: not make it stuck, not hang its caller, not keep its keys.
func TestTransientStoreFailuresAreRetried(t *testing.T) {
	for _, tc := range []struct {
		name string
		when func(task *broadcast.Task) bool
	}{
		{"after an append", func(task *broadcast.Task) bool { return task.State == broadcast.Pending && len(task.Appended) == 1 }},
		{"the acknowledgements", func(task *broadcast.Task) bool { return task.State == broadcast.Pending && len(task.Acked) == 2 }},
		{"the tombstone", func(task *broadcast.Task) bool { return task.State == broadcast.Tombstone }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			var once sync.Once
			e.store.setFailSave(func(task *broadcast.Task) error {
				var err error
				if tc.when(task) {
					once.Do(func() { err = streamwal.Errorf(streamwal.CodeUnavailable, "bucket briefly down") })
				}
				return err
			})
			b := e.start(e.config())
			ctx, cancel := context.WithTimeout(context.Background(), waitFor/3)
			defer cancel()
			res, err := b.Broadcast(ctx, e.createCollection("db", "c1", 1, e.v1))
			require.NoError(t, err)
			require.Equal(t, broadcast.Tombstone, e.store.state(res.ID))
			require.Zero(t, b.Stuck())
			require.False(t, b.KeysHeld(res.ID))
		})
	}
}

func TestResumeCarriesOnFromWhatWasPersisted(t *testing.T) {
	e := newEnv(t)
	now := e.nowUTC()
	ccBody := mustBody(t, messages.TypeCreateCollection, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: "c1", CollectionID: 1},
		VChannels:     []string{e.v1.String(), e.v2.String()}})
	// PENDING: landed on v1 before the crash.
	e.store.put(t, broadcast.Task{ID: 10, State: broadcast.Pending, Type: messages.TypeCreateCollection.Name,
		Scope:     messages.KeyScope{DBName: "db", CollectionName: "c1"},
		VChannels: []string{e.v1.String(), e.v2.String()}, CChannel: e.cchn.String(), Payload: ccBody,
		Appended: map[string]wire.AppendResult{e.v1.String(): {ID: 7, TimeTick: 77}}, Created: now})
	// TOMBSTONE with an idempotency key.
	e.store.put(t, broadcast.Task{ID: 5, State: broadcast.Tombstone, Type: messages.TypeCreateDatabase.Name,
		Scope: messages.KeyScope{DBName: "db9"}, CChannel: e.cchn.String(), Payload: []byte(`{}`),
		IdemKey:  messages.TypeCreateDatabase.Name + "|k9",
		Appended: map[string]wire.AppendResult{e.cchn.String(): {ID: 3, TimeTick: 33}},
		Acked:    map[string]bool{e.cchn.String(): true}, Created: now, Finished: now})
	// STUCK: a target refused it for good.
	e.store.put(t, broadcast.Task{ID: 7, State: broadcast.Stuck, Type: messages.TypeCreateCollection.Name,
		Scope:     messages.KeyScope{DBName: "db", CollectionName: "c2"},
		VChannels: []string{e.v3.String()}, CChannel: e.cchn.String(),
		Payload: mustBody(t, messages.TypeCreateCollection, messages.CreateCollectionBody{
			CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: "c2", CollectionID: 2}}),
		Error: "refused", Created: now})

	b := e.start(e.config())
	require.Eventually(t, func() bool { return e.store.state(10) == broadcast.Tombstone }, waitFor, tick)
	require.Zero(t, e.app.callsTo(10, e.v1.String()), "the recorded target is not appended again")
	require.Equal(t, 1, e.app.callsTo(10, e.v2.String()))
	require.Equal(t, 1, e.app.callsTo(10, e.cchn.String()))
	for _, l := range e.app.landedOf(10) {
		require.Equal(t, messages.BroadcastMsgID(10, l.msg.Header()), l.msg.MsgID())
		require.Equal(t, uint64(10), l.msg.Header().Broadcast.ID)
	}
	task := e.store.get(10)
	require.Equal(t, wire.AppendResult{ID: 7, TimeTick: 77}, task.Appended[e.v1.String()])
	require.Len(t, task.Appended, 3)
	require.Equal(t, []uint64{10}, e.cbs.Ran())
	require.Eventually(t, func() bool { return !b.KeysHeld(10) }, waitFor, tick, "released after the tombstone is persisted")

	// The tombstone answers its idempotency key.
	req := e.createDatabase("db9")
	req.IdempotencyKey = "k9"
	res, err := b.Broadcast(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, broadcast.Result{ID: 5, Appended: map[string]wire.AppendResult{e.cchn.String(): {ID: 3, TimeTick: 33}}}, res)
	require.Zero(t, e.ids())
	require.Empty(t, e.app.landedOf(5))
	require.NoError(t, b.Ack(context.Background(), 5, e.cchn.String()), "a finished broadcast is acknowledged as a no-op")

	// The stuck task keeps its keys.
	require.Equal(t, int64(1), b.Stuck())
	require.True(t, b.KeysHeld(7))
	require.Equal(t, broadcast.Stuck, e.store.state(7))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conflicting := e.goBroadcast(ctx, e.createCollection("db", "c2", 2, e.v3))
	require.Eventually(t, func() bool { return b.KeysWaiting() == 1 }, waitFor, tick)
	cancel()
	require.ErrorIs(t, recv(t, conflicting).err, streamwal.ErrResourceBusy)
	require.Empty(t, e.app.landedOf(7))
}

// TestResumeRetakesKeysInIDOrder: two unfinished tasks on one collection
// resume one after the other, the older first.
func TestResumeRetakesKeysInIDOrder(t *testing.T) {
	e := newEnv(t)
	for _, id := range []uint64{12, 11} {
		e.store.put(t, broadcast.Task{ID: id, State: broadcast.Pending, Type: messages.TypeCreateCollection.Name,
			Scope:     messages.KeyScope{DBName: "db", CollectionName: "c1"},
			VChannels: []string{e.v1.String()}, CChannel: e.cchn.String(),
			Payload: mustBody(t, messages.TypeCreateCollection, messages.CreateCollectionBody{
				CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: "c1", CollectionID: 1}}),
			Created: e.nowUTC()})
	}
	var mu sync.Mutex
	var olderAtYounger []broadcast.State
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error {
		if m.Header().Broadcast.ID == 12 {
			mu.Lock()
			olderAtYounger = append(olderAtYounger, e.store.state(11))
			mu.Unlock()
		}
		return nil
	})
	e.start(e.config())
	require.Eventually(t, func() bool {
		return e.store.state(11) == broadcast.Tombstone && e.store.state(12) == broadcast.Tombstone
	}, waitFor, tick)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []broadcast.State{broadcast.Tombstone, broadcast.Tombstone}, olderAtYounger)
	require.Equal(t, []uint64{11, 12}, e.cbs.Ran())
}

func TestResumeFailsWhenTheStoreCannotList(t *testing.T) {
	e := newEnv(t)
	e.store.listErr = streamwal.Errorf(streamwal.CodeUnavailable, "bucket down")
	b := broadcast.New(e.config())
	defer b.Close()
	require.ErrorIs(t, b.Resume(context.Background()), streamwal.ErrUnavailable)
}

// TestResumeSkipsUnreadableTasks: a task of an unknown type or with a bad
// target name cannot be resumed; it is left alone and the others go on,
// among them a cluster barrier.
func TestResumeSkipsUnreadableTasks(t *testing.T) {
	e := newEnv(t)
	now := e.nowUTC()
	e.store.put(t, broadcast.Task{ID: 1, State: broadcast.Pending, Type: "NoSuchType", CChannel: e.cchn.String(), Created: now})
	e.store.put(t, broadcast.Task{ID: 2, State: broadcast.Pending, Type: messages.TypeCreateDatabase.Name,
		Scope: messages.KeyScope{DBName: "db"}, CChannel: "not a channel", Created: now})
	e.store.put(t, broadcast.Task{ID: 3, State: broadcast.Pending, Type: messages.TypeAlterWAL.Name,
		PChannels: []string{e.p0.String(), e.p2.String()}, Payload: []byte(`{}`), Created: now})
	e.start(e.config())
	require.Eventually(t, func() bool { return e.store.state(3) == broadcast.Tombstone }, waitFor, tick)
	require.Len(t, e.app.landedOf(3), 2)
	require.Equal(t, broadcast.Pending, e.store.state(1))
	require.Equal(t, broadcast.Pending, e.store.state(2))
	require.Empty(t, e.app.landedOf(1))
	require.Empty(t, e.app.landedOf(2))
}

func TestResumeAckSyncUpKeepsPersistedAcknowledgements(t *testing.T) {
	e := newEnv(t)
	body := mustBody(t, messages.TypeTruncateCollection, messages.TruncateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: "c1", CollectionID: 1}})
	e.store.put(t, broadcast.Task{ID: 20, State: broadcast.Pending, Type: messages.TypeTruncateCollection.Name,
		Scope:     messages.KeyScope{DBName: "db", CollectionName: "c1"},
		VChannels: []string{e.v1.String()}, CChannel: e.cchn.String(), Payload: body,
		Appended: map[string]wire.AppendResult{e.v1.String(): {ID: 1}, e.cchn.String(): {ID: 2}},
		Acked:    map[string]bool{e.cchn.String(): true}, Created: e.nowUTC()})
	b := e.start(e.config())
	require.Empty(t, e.cbs.Ran())
	require.NoError(t, b.Ack(context.Background(), 20, e.v1.String()))
	require.Eventually(t, func() bool { return e.store.state(20) == broadcast.Tombstone }, waitFor, tick)
	require.Empty(t, e.app.Calls(), "nothing to append again")
	require.Equal(t, []uint64{20}, e.cbs.Ran())
}

func TestTombstonesAreCollected(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.MaxTombstones = 2
	cfg.GCInterval = 2 * tick
	b := e.start(cfg)
	ctx := context.Background()
	var ids []uint64
	for i, db := range []string{"d1", "d2", "d3", "d4", "d5"} {
		req := e.createDatabase(db)
		if i == 0 {
			req.IdempotencyKey = "first"
		}
		res, err := b.Broadcast(ctx, req)
		require.NoError(t, err)
		ids = append(ids, res.ID)
	}
	require.Eventually(t, func() bool { return slices.Equal(e.store.ids(), ids[3:]) }, waitFor, tick,
		"only the two newest tombstones remain")
	require.ErrorIs(t, b.Ack(ctx, ids[0], e.cchn.String()), streamwal.ErrInvalidArgument, "a collected task is forgotten")

	req := e.createDatabase("d1")
	req.IdempotencyKey = "first"
	res, err := b.Broadcast(ctx, req)
	require.NoError(t, err)
	require.NotEqual(t, ids[0], res.ID, "the key of a collected task makes a new task")
	require.Equal(t, uint64(6), e.ids())
}

func TestOldTombstonesAreCollected(t *testing.T) {
	e := newEnv(t)
	old := e.nowUTC().Add(-waitFor)
	e.store.put(t, broadcast.Task{ID: 5, State: broadcast.Tombstone, Type: messages.TypeCreateDatabase.Name,
		Scope: messages.KeyScope{DBName: "db9"}, CChannel: e.cchn.String(), IdemKey: messages.TypeCreateDatabase.Name + "|k",
		Appended: map[string]wire.AppendResult{e.cchn.String(): {ID: 3}}, Acked: map[string]bool{e.cchn.String(): true},
		Created: old, Finished: old})
	cfg := e.config()
	cfg.TombstoneAge = waitFor / 2
	cfg.GCInterval = 2 * tick
	b := e.start(cfg)
	res, err := b.Broadcast(context.Background(), e.createDatabase("db1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slices.Equal(e.store.ids(), []uint64{res.ID}) }, waitFor, tick,
		"the old tombstone goes, the young one stays")
}

func TestCloseStopsTasksBlockedInAppends(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	arrived := map[uint64]int{}
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error {
		mu.Lock()
		arrived[m.Header().Broadcast.ID]++
		mu.Unlock()
		<-ctx.Done()
		return streamwal.Errorf(streamwal.CodeUnavailable, "append: %v", ctx.Err())
	})
	b := e.start(e.config())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	arrivals := func(id uint64, n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return arrived[id] == n
		}
	}
	a := e.goBroadcast(ctx, e.createCollection("db", "c1", 1, e.v1, e.v2))
	require.Eventually(t, arrivals(101, 3), waitFor, tick)
	d := e.goBroadcast(ctx, e.createDatabase("db2"))
	require.Eventually(t, arrivals(102, 1), waitFor, tick)
	waiter := e.goBroadcast(ctx, e.createCollection("db", "c1", 1, e.v1))
	require.Eventually(t, func() bool { return b.KeysWaiting() == 1 }, waitFor, tick)

	b.Close()
	require.ErrorIs(t, recv(t, waiter).err, streamwal.ErrShuttingDown, "a broadcast waiting for keys gives up")
	cancel()
	for _, ch := range []<-chan outcome{a, d} {
		o := recv(t, ch)
		require.Error(t, o.err)
	}
	require.Equal(t, []uint64{101, 102}, e.store.ids(), "the waiter left no task")
	for _, id := range []uint64{101, 102} {
		require.Equal(t, broadcast.Pending, e.store.state(id), "left to the next coordinator")
	}
	require.Zero(t, b.Stuck(), "stopping is not a refusal")
	require.Empty(t, e.cbs.Ran())

	// The next coordinator completes them, each target once.
	e.app.setHook(nil)
	e.start(e.config())
	for _, id := range []uint64{101, 102} {
		require.Eventually(t, func() bool { return e.store.state(id) == broadcast.Tombstone }, waitFor, tick)
	}
	require.Len(t, e.app.landedOf(101), 3)
	require.Len(t, e.app.landedOf(102), 1)
	require.ElementsMatch(t, []uint64{101, 102}, e.cbs.Ran())
}

// TestCloseEndsWaitingCallers: a caller waiting for its persisted
// broadcast learns that this broadcaster stopped instead of waiting until
// its own context ends.
func TestCloseEndsWaitingCallers(t *testing.T) {
	e := newEnv(t)
	g := newGate()
	e.app.setHook(func(ctx context.Context, target string, m *messages.MutableMessage) error { return g.wait(ctx) })
	b := e.start(e.config())
	call := e.goBroadcast(context.Background(), e.createDatabase("db"))
	require.Eventually(t, func() bool { return g.arrivals.Load() == 1 }, waitFor, tick)
	b.Close()
	o := recv(t, call)
	require.Error(t, o.err)
	require.True(t, streamwal.IsRetriable(o.err) || streamwal.CodeOf(o.err) == streamwal.CodeShuttingDown, "%v", o.err)
}

// callbackHook records what the broadcaster tells of its callbacks.
type callbackHook struct {
	mu     sync.Mutex
	starts []telemetry.BroadcastCallbackEvent
	ends   []telemetry.BroadcastCallbackEndEvent
	ctxOK  []bool // whether each end came with the context its start returned
}

// callbackKey is the context key callbackHook marks its contexts with.
type callbackKey struct{}

func (h *callbackHook) OnBroadcastCallbackStart(ctx context.Context, e telemetry.BroadcastCallbackEvent) context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.starts = append(h.starts, e)
	return context.WithValue(ctx, callbackKey{}, e.ID)
}

func (h *callbackHook) OnBroadcastCallbackEnd(ctx context.Context, e telemetry.BroadcastCallbackEndEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ends = append(h.ends, e)
	id, _ := ctx.Value(callbackKey{}).(uint64)
	h.ctxOK = append(h.ctxOK, len(h.starts) > 0 && id == h.starts[len(h.starts)-1].ID)
}

// TestCallbackHooks: the hooks are told of a callback's start, with its
// broadcast's ID, type and trace context, and of its end, once, with the
// errors of the attempts that failed, under the context they returned.
func TestCallbackHooks(t *testing.T) {
	e := newEnv(t)
	e.cbs.fail = 2
	hook := &callbackHook{}
	cfg := e.config()
	cfg.Hooks = telemetry.Hooks{hook}
	b := e.start(cfg)
	req := e.createDatabase("db")
	req.TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	res, err := b.Broadcast(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, 3, e.cbs.Tries(res.ID))
	hook.mu.Lock()
	defer hook.mu.Unlock()
	require.Equal(t, []telemetry.BroadcastCallbackEvent{{ID: res.ID, Type: req.Type.Name, TraceParent: req.TraceParent}}, hook.starts)
	require.Len(t, hook.ends, 1)
	require.Len(t, hook.ends[0].Failures, 2, "the two attempts that failed")
	require.NoError(t, hook.ends[0].Err)
	require.Equal(t, []bool{true}, hook.ctxOK)
}

// TestSavesOfReplicasThatLandTogetherCoalesce: the task is persisted with
// every replica's result before that replica's append returns, but the
// replicas that land while a save is under way share the next save
// instead of one each. The first save after a replica landed is held in
// the store until all four landed: then one more save covers the rest.
func TestSavesOfReplicasThatLandTogetherCoalesce(t *testing.T) {
	e := newEnv(t)
	var held sync.Once
	e.store.failSave = func(task *broadcast.Task) error {
		if task.State == broadcast.Pending && len(task.Appended) > 0 {
			held.Do(func() {
				require.Eventually(t, func() bool { return len(e.app.Landed()) == 4 }, 10*time.Second, time.Millisecond)
			})
		}
		return nil
	}
	b := e.start(e.config())
	res, err := b.Broadcast(context.Background(), e.createCollection("db", "c1", 1, e.v1, e.v2, e.v3))
	require.NoError(t, err)
	require.Len(t, res.Appended, 4)

	e.store.mu.Lock()
	defer e.store.mu.Unlock()
	var appended []int
	for _, s := range e.store.saves {
		if s.State == broadcast.Pending && len(s.Appended) > 0 && len(s.Acked) < 4 {
			appended = append(appended, len(s.Appended))
		}
	}
	// Without coalescing there would be one per replica.
	require.Len(t, appended, 2, "saves of replicas' results: the held one, then one for the rest (%v)", appended)
	require.Equal(t, 4, appended[1])
	last := e.store.saves[len(e.store.saves)-1]
	require.Equal(t, broadcast.Tombstone, last.State)
	require.Equal(t, res.Appended, last.Appended)
}
