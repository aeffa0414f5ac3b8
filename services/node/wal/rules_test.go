package wal_test

// One test per rule of the WAL (issue 4, "Tests for every lock and
// transaction rule"): transactions, locks, lifecycle, bad input, fencing
// and close, recovery, and the sync loop. Every refusal is checked twice:
// its typed error (the package sentinel and the streamwal code, with
// errors.Is), and that it wrote nothing (the stream's tail is unchanged,
// and the next append lands right after it).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/lifecycle"
	"github.com/streamwal/streamwal/services/node/txn"
	"github.com/streamwal/streamwal/services/node/wal"
	"github.com/streamwal/streamwal/services/read"
)

// ---------------------------------------------------------------------
// Helpers (prefixed "rule" so as not to collide with other test files).

// ruleShort is the keepalive of transactions a test lets expire: short,
// yet long enough for a body appended right after the BeginTxn to land
// before it runs out, even under the race detector.
const ruleShort = 100 * time.Millisecond

// ruleTail is the MessageID of the last message in the PChannel's stream,
// read from the server (not from any WAL).
func ruleTail(t *testing.T, e *env) messages.MessageID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := njs.New(e.nc)
	require.NoError(t, err)
	s, err := js.Stream(ctx, e.codec.Cluster().StreamName(e.p))
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	return messages.MessageID(info.State.LastSeq)
}

// ruleRefused checks that err matches every target with errors.Is and that
// nothing was written since before (the stream's tail). When w is set and
// probe is a live VChannel, it also appends a plain insert on probe and
// checks that it lands at before+1, so that the WAL's own idea of the tail
// agrees. It returns the stream's tail afterwards.
func ruleRefused(t *testing.T, e *env, w *wal.WAL, probe streamwal.VChannel, before messages.MessageID, err error, targets ...error) messages.MessageID {
	t.Helper()
	require.Error(t, err, "the append must be refused")
	for _, target := range targets {
		require.ErrorIs(t, err, target, "error %v", err)
	}
	require.Equal(t, before, ruleTail(t, e), "a refused append wrote something (error %v)", err)
	if w == nil || probe.IsZero() {
		return before
	}
	m, err := w.Append(context.Background(), e.insert(probe, "probe"))
	require.NoError(t, err)
	require.Equal(t, before+1, m.ID(), "the append after a refusal must land right after the previous tail")
	return m.ID()
}

// ruleAppend appends m and requires it to land.
func ruleAppend(t *testing.T, w *wal.WAL, m *messages.MutableMessage) *messages.ImmutableMessage {
	t.Helper()
	im, err := w.Append(context.Background(), m)
	require.NoError(t, err)
	return im
}

// ruleBody appends a transaction body (an Insert carrying tc) on v.
func ruleBody(t *testing.T, e *env, w *wal.WAL, v streamwal.VChannel, tc messages.TxnContext, payload string) *messages.ImmutableMessage {
	t.Helper()
	return ruleAppend(t, w, e.insert(v, payload, messages.WithTxn(tc)))
}

// ruleBegin opens a transaction on v.
func ruleBegin(t *testing.T, w *wal.WAL, v streamwal.VChannel, keepalive time.Duration) messages.TxnContext {
	t.Helper()
	tc, err := w.BeginTxn(context.Background(), v, keepalive)
	require.NoError(t, err)
	return tc
}

// ruleRaw reads the stream itself (no read pipeline) from id from through
// id to, both inclusive.
func ruleRaw(t *testing.T, e *env, from, to messages.MessageID) []*messages.ImmutableMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc, err := e.backend.Read(ctx, e.p, jetstream.ReadOptions{Start: jetstream.From(from)})
	require.NoError(t, err)
	defer func() { _ = sc.Close() }()
	var out []*messages.ImmutableMessage
	for from <= to {
		m, err := sc.Next(ctx)
		require.NoError(t, err, "raw read until %d", to)
		out = append(out, m)
		if m.ID() >= to {
			break
		}
	}
	return out
}

// rulePayloads returns the payloads of msgs.
func rulePayloads(msgs []*messages.ImmutableMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Payload())
	}
	return out
}

// ruleTxns returns the assembled Txn messages among msgs, by TxnID.
func ruleTxns(msgs []*messages.ImmutableMessage) map[messages.TxnID]*messages.ImmutableMessage {
	out := map[messages.TxnID]*messages.ImmutableMessage{}
	for _, m := range msgs {
		if m.Type() == messages.TypeTxn {
			out[m.Txn().ID] = m
		}
	}
	return out
}

// ruleIncreasing requires TimeTicks strictly increasing along msgs.
func ruleIncreasing(t *testing.T, msgs []*messages.ImmutableMessage) {
	t.Helper()
	for i := 1; i < len(msgs); i++ {
		require.Greater(t, msgs[i].TimeTick(), msgs[i-1].TimeTick(), "message %d (id %d) after id %d", i, msgs[i].ID(), msgs[i-1].ID())
	}
}

// ruleDeadline is the last TimeTick at which a transaction last active at
// tt with keepalive ka is alive (the rule of package txn and package read).
func ruleDeadline(tt messages.TimeTick, ka time.Duration) messages.TimeTick {
	return tt + messages.TimeTick(ka.Milliseconds())<<messages.LogicalBits
}

// ruleWaitPast waits until the clock's TimeTick is past deadline.
func ruleWaitPast(t *testing.T, deadline messages.TimeTick) {
	t.Helper()
	require.Eventually(t, func() bool { return messages.TimeTickAt(time.Now()) > deadline },
		5*time.Second, time.Millisecond, "the clock did not pass %s", deadline)
}

// ruleOpenWith opens a WAL with cfg and closes it at the end of the test.
func ruleOpenWith(t *testing.T, cfg wal.Config) *wal.WAL {
	t.Helper()
	w, err := wal.Open(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	return w
}

// ruleBigCodec builds messages over the backend's payload limit: same
// cluster and registry as the env's codec, a larger limit.
func ruleBigCodec(t *testing.T, e *env) *messages.Codec {
	t.Helper()
	c, err := messages.NewCodec(e.codec.Cluster(), e.codec.Registry(), messages.WithMaxPayload(8<<20))
	require.NoError(t, err)
	return c
}

// ruleDDL builds a partition DDL (CreatePartition or DropPartition).
func ruleDDL(t *testing.T, e *env, typ *messages.Type, v streamwal.VChannel, pid int64) *messages.MutableMessage {
	t.Helper()
	m, err := e.codec.NewBody(typ, v, messages.PartitionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: v.String(), CollectionID: v.CollectionID()},
		PartitionID:   pid,
	})
	require.NoError(t, err)
	return m
}

// ruleDropCollection builds v's DropCollection.
func ruleDropCollection(t *testing.T, e *env, v streamwal.VChannel) *messages.MutableMessage {
	t.Helper()
	m, err := e.codec.NewBody(messages.TypeDropCollection, v, messages.DropCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: v.String(), CollectionID: v.CollectionID()},
	})
	require.NoError(t, err)
	return m
}

// ruleManualFlush builds v's ManualFlush (exclusive on v).
func ruleManualFlush(t *testing.T, e *env, v streamwal.VChannel) *messages.MutableMessage {
	t.Helper()
	m, err := e.codec.NewBody(messages.TypeManualFlush, v, messages.ManualFlushBody{CollectionID: v.CollectionID()})
	require.NoError(t, err)
	return m
}

// ruleFlushAll builds a FlushAll replica for the env's PChannel (exclusive
// on the whole PChannel).
func ruleFlushAll(t *testing.T, e *env) *messages.MutableMessage {
	t.Helper()
	m, err := e.codec.NewPChannelBody(messages.TypeFlushAll, e.p, messages.FlushAllBody{})
	require.NoError(t, err)
	return m
}

// ruleTxnCode requires err to be a typed transaction error: one of the
// TXN_* codes.
func ruleTxnCode(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	switch streamwal.CodeOf(err) {
	case streamwal.CodeTxnNotFound, streamwal.CodeTxnExpired, streamwal.CodeTxnInvalidState:
	default:
		t.Fatalf("want a TXN_* error, got %v", err)
	}
}

// ---------------------------------------------------------------------
// 1. Transactions.

// A body, commit or rollback of a transaction the WAL never opened is
// TXN_NOT_FOUND (txn.ErrUnknown) and writes nothing.
func TestRuleTxnUnknown(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)
	tail := ruleTail(t, e)
	ghost := messages.TxnContext{ID: 123456789, Keepalive: time.Second}

	_, err := w.Append(ctx, e.insert(v, "body", messages.WithTxn(ghost)))
	tail = ruleRefused(t, e, w, v, tail, err, txn.ErrUnknown, streamwal.ErrTxnNotFound)
	_, err = w.CommitTxn(ctx, v, ghost)
	tail = ruleRefused(t, e, w, v, tail, err, txn.ErrUnknown, streamwal.ErrTxnNotFound)
	_, err = w.RollbackTxn(ctx, v, ghost)
	ruleRefused(t, e, w, v, tail, err, txn.ErrUnknown, streamwal.ErrTxnNotFound)
}

// A transaction belongs to its VChannel: a body, commit or rollback on
// another one (whose collection exists) is refused with ErrWrongVChannel,
// writes nothing, and leaves the transaction usable on its own VChannel.
func TestRuleTxnWrongVChannel(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v1, v2 := e.vchannel(1), e.vchannel(2)
	e.createCollection(w, v1)
	e.createCollection(w, v2)
	tc := ruleBegin(t, w, v1, 0)
	ruleBody(t, e, w, v1, tc, "b1")
	tail := ruleTail(t, e)

	_, err := w.Append(ctx, e.insert(v2, "stray", messages.WithTxn(tc)))
	tail = ruleRefused(t, e, w, v1, tail, err, txn.ErrWrongVChannel, streamwal.ErrInvalidArgument)
	_, err = w.CommitTxn(ctx, v2, tc)
	tail = ruleRefused(t, e, w, v1, tail, err, txn.ErrWrongVChannel, streamwal.ErrInvalidArgument)
	_, err = w.RollbackTxn(ctx, v2, tc)
	ruleRefused(t, e, w, v1, tail, err, txn.ErrWrongVChannel, streamwal.ErrInvalidArgument)

	// Still open on v1: it takes a body and commits with both.
	ruleBody(t, e, w, v1, tc, "b2")
	commit, err := w.CommitTxn(ctx, v1, tc)
	require.NoError(t, err)
	got := ruleTxns(e.readUntil(e.scan(v1, read.Earliest()), commit.ID()))
	require.Contains(t, got, tc.ID)
	require.Equal(t, []string{"b1", "b2"}, rulePayloads(got[tc.ID].TxnBody()))
}

// A second CommitTxn of a committed transaction is ErrCommitted
// (TXN_INVALID_STATE) and writes nothing.
func TestRuleTxnCommitTwice(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)
	tc := ruleBegin(t, w, v, 0)
	ruleBody(t, e, w, v, tc, "b")
	_, err := w.CommitTxn(ctx, v, tc)
	require.NoError(t, err)
	tail := ruleTail(t, e)

	_, err = w.CommitTxn(ctx, v, tc)
	tail = ruleRefused(t, e, w, v, tail, err, txn.ErrCommitted, streamwal.ErrTxnInvalidState)
	// Nor can it be rolled back any more.
	_, err = w.RollbackTxn(ctx, v, tc)
	ruleRefused(t, e, w, v, tail, err, txn.ErrCommitted, streamwal.ErrTxnInvalidState)
}

// A body after the commit is ErrCommitted and writes nothing.
func TestRuleTxnBodyAfterCommit(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)
	tc := ruleBegin(t, w, v, 0)
	ruleBody(t, e, w, v, tc, "b")
	_, err := w.CommitTxn(ctx, v, tc)
	require.NoError(t, err)
	tail := ruleTail(t, e)

	_, err = w.Append(ctx, e.insert(v, "late", messages.WithTxn(tc)))
	ruleRefused(t, e, w, v, tail, err, txn.ErrCommitted, streamwal.ErrTxnInvalidState)
}

// A body, commit or second rollback after the rollback is ErrRolledBack
// and writes nothing.
func TestRuleTxnBodyAfterRollback(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)
	tc := ruleBegin(t, w, v, 0)
	ruleBody(t, e, w, v, tc, "b")
	_, err := w.RollbackTxn(ctx, v, tc)
	require.NoError(t, err)
	tail := ruleTail(t, e)

	_, err = w.Append(ctx, e.insert(v, "late", messages.WithTxn(tc)))
	tail = ruleRefused(t, e, w, v, tail, err, txn.ErrRolledBack, streamwal.ErrTxnInvalidState)
	_, err = w.CommitTxn(ctx, v, tc)
	tail = ruleRefused(t, e, w, v, tail, err, txn.ErrRolledBack, streamwal.ErrTxnInvalidState)
	_, err = w.RollbackTxn(ctx, v, tc)
	ruleRefused(t, e, w, v, tail, err, txn.ErrRolledBack, streamwal.ErrTxnInvalidState)
}

// A transaction expires when a TimeTick passes its last activity plus its
// keepalive: once the clock is past the deadline and an append moved the
// TimeTicks there, its commit and its bodies are ErrExpired (TXN_EXPIRED)
// and write nothing. The WAL draws one TimeTick at a time here, so that
// TimeTicks follow the clock without a Sync.
func TestRuleTxnCommitAfterExpiry(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(1)
	cfg.TimeTickBatch = 1
	w := ruleOpenWith(t, cfg)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)
	// The shortest keepalive, idle since its BeginTxn (whose TimeTick is
	// its TxnID); and one with a body, whose keepalive leaves the body
	// time to land first.
	bare := ruleBegin(t, w, v, messages.MinKeepalive)
	require.Equal(t, messages.MinKeepalive, bare.Keepalive)
	busy := ruleBegin(t, w, v, ruleShort)
	body := ruleBody(t, e, w, v, busy, "b")

	ruleWaitPast(t, ruleDeadline(messages.TimeTick(bare.ID), bare.Keepalive))
	ruleWaitPast(t, ruleDeadline(body.TimeTick(), busy.Keepalive))
	moved := ruleAppend(t, w, e.insert(v, "moves the timeticks"))
	require.Greater(t, moved.TimeTick(), ruleDeadline(body.TimeTick(), busy.Keepalive))
	tail := moved.ID()

	for _, tc := range []messages.TxnContext{bare, busy} {
		_, err := w.CommitTxn(ctx, v, tc)
		tail = ruleRefused(t, e, w, v, tail, err, txn.ErrExpired, streamwal.ErrTxnExpired)
		_, err = w.Append(ctx, e.insert(v, "late", messages.WithTxn(tc)))
		tail = ruleRefused(t, e, w, v, tail, err, txn.ErrExpired, streamwal.ErrTxnExpired)
		_, err = w.RollbackTxn(ctx, v, tc)
		tail = ruleRefused(t, e, w, v, tail, err, txn.ErrExpired, streamwal.ErrTxnExpired)
	}
}

// With the default TimeTick batch, TimeTicks follow the clock once the
// sync loop ran (it drops the rest of the batch): after the deadline, one
// Sync (a persisted TimeTick, which also expires idle transactions) makes
// the commit ErrExpired.
func TestRuleTxnExpiresOnSync(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)
	tc := ruleBegin(t, w, v, ruleShort)
	body := ruleBody(t, e, w, v, tc, "b")

	ruleWaitPast(t, ruleDeadline(body.TimeTick(), tc.Keepalive))
	require.NoError(t, w.Sync(ctx))
	tail := ruleTail(t, e)
	_, err := w.CommitTxn(ctx, v, tc)
	ruleRefused(t, e, w, v, tail, err, txn.ErrExpired, streamwal.ErrTxnExpired)
}

// A reader never sees a rolled-back or an expired transaction; it sees a
// committed one as one Txn message, at its CommitTxn's MessageID and
// TimeTick, with its bodies in order.
func TestRuleTxnVisibility(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(1)
	cfg.TimeTickBatch = 1
	w := ruleOpenWith(t, cfg)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)

	expiring := ruleBegin(t, w, v, ruleShort)
	last := ruleBody(t, e, w, v, expiring, "expired-1")

	rolled := ruleBegin(t, w, v, 0)
	ruleBody(t, e, w, v, rolled, "rolled-1")
	ruleBody(t, e, w, v, rolled, "rolled-2")
	_, err := w.RollbackTxn(ctx, v, rolled)
	require.NoError(t, err)

	kept := ruleBegin(t, w, v, 0)
	var want []string
	for i := range 5 {
		p := fmt.Sprintf("kept-%d", i)
		ruleBody(t, e, w, v, kept, p)
		want = append(want, p)
		ruleAppend(t, w, e.insert(v, fmt.Sprintf("plain-%d", i)))
	}
	commit, err := w.CommitTxn(ctx, v, kept)
	require.NoError(t, err)

	ruleWaitPast(t, ruleDeadline(last.TimeTick(), expiring.Keepalive))
	ruleAppend(t, w, e.insert(v, "after"))
	_, err = w.CommitTxn(ctx, v, expiring)
	require.ErrorIs(t, err, txn.ErrExpired)
	end := ruleAppend(t, w, e.insert(v, "end"))

	for _, s := range []*read.Scanner{e.scan(v, read.Earliest()), e.scan(streamwal.VChannel{}, read.Earliest())} {
		got := e.readUntil(s, end.ID())
		ruleIncreasing(t, got)
		txns := ruleTxns(got)
		require.Len(t, txns, 1, "only the committed transaction is delivered")
		tx := txns[kept.ID]
		require.NotNil(t, tx)
		require.Equal(t, commit.ID(), tx.ID())
		require.Equal(t, commit.TimeTick(), tx.TimeTick())
		require.Equal(t, want, rulePayloads(tx.TxnBody()))
		for _, m := range got {
			require.NotContains(t, string(m.Payload()), "expired", "an expired transaction's body was delivered")
			require.NotContains(t, string(m.Payload()), "rolled", "a rolled-back transaction's body was delivered")
			require.NotContains(t, string(m.Payload()), "kept", "a committed body was delivered outside its Txn")
		}
	}
}

// CommitTxn waits for the bodies in flight: with 32 bodies appended
// concurrently and a commit issued once all of them are started, every
// body either lands inside the transaction or is refused with
// ErrCommitted (writing nothing), and the Txn read back holds exactly the
// bodies that were acknowledged, in MessageID order.
func TestRuleCommitWaitsForInflightBodies(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)
	const bodies = 32

	var commits []*messages.ImmutableMessage
	var acked [][]messages.MessageID
	var tcs []messages.TxnContext
	for round := range 5 {
		tc := ruleBegin(t, w, v, 0)
		beginTail := ruleTail(t, e)
		var (
			mu       sync.Mutex
			landed   []messages.MessageID
			refusals int
			started  sync.WaitGroup
			wg       sync.WaitGroup
		)
		started.Add(bodies)
		for i := range bodies {
			m := e.insert(v, fmt.Sprintf("r%d-b%d", round, i), messages.WithTxn(tc))
			wg.Go(func() {
				started.Done()
				im, err := w.Append(ctx, m)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if !errors.Is(err, txn.ErrCommitted) || !errors.Is(err, streamwal.ErrTxnInvalidState) {
						t.Errorf("body refused with %v, want ErrCommitted", err)
					}
					refusals++
					return
				}
				if im.Txn().ID != tc.ID {
					t.Errorf("body landed in txn %d, want %d", im.Txn().ID, tc.ID)
				}
				landed = append(landed, im.ID())
			})
		}
		started.Wait()
		commit, err := w.CommitTxn(ctx, v, tc)
		require.NoError(t, err)
		wg.Wait()
		slices.Sort(landed)
		require.Equal(t, bodies, len(landed)+refusals)
		t.Logf("round %d: %d bodies in the txn, %d refused", round, len(landed), refusals)
		for _, id := range landed {
			require.Less(t, id, commit.ID(), "a body acknowledged as part of the txn landed after its commit")
		}
		// Between the BeginTxn and the CommitTxn the stream holds exactly
		// the bodies acknowledged: refused ones wrote nothing.
		require.Equal(t, beginTail+messages.MessageID(len(landed))+1, commit.ID())
		raw := ruleRaw(t, e, beginTail+1, commit.ID()-1)
		var rawIDs []messages.MessageID
		for _, m := range raw {
			require.Equal(t, messages.TypeInsert, m.Type())
			require.Equal(t, tc.ID, m.Txn().ID)
			rawIDs = append(rawIDs, m.ID())
		}
		require.Equal(t, landed, rawIDs)
		commits, acked, tcs = append(commits, commit), append(acked, landed), append(tcs, tc)
	}

	got := ruleTxns(e.readUntil(e.scan(v, read.Earliest()), commits[len(commits)-1].ID()))
	for i, tc := range tcs {
		tx := got[tc.ID]
		require.NotNil(t, tx, "txn %d", i)
		var ids []messages.MessageID
		for _, b := range tx.TxnBody() {
			ids = append(ids, b.ID())
		}
		if len(acked[i]) == 0 {
			require.Empty(t, ids)
			continue
		}
		require.Equal(t, acked[i], ids, "txn %d holds exactly the acknowledged bodies", i)
	}
}

// AppendTxn lands begin, bodies and commit contiguously (consecutive
// MessageIDs) under one TxnID (the BeginTxn's TimeTick) and reads back as
// one Txn.
func TestRuleAppendTxnAtomic(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v, 7)
	tail := ruleTail(t, e)
	out, err := w.AppendTxn(ctx, v, 0,
		e.insert(v, "a"), e.insert(v, "b", messages.WithDML(7, 1)), e.insert(v, "c"))
	require.NoError(t, err)
	require.Len(t, out, 5)
	require.Equal(t, messages.TypeBeginTxn, out[0].Type())
	require.Equal(t, messages.TypeCommitTxn, out[4].Type())
	id := out[0].Txn().ID
	require.Equal(t, messages.TxnID(out[0].TimeTick()), id)
	require.Equal(t, messages.DefaultKeepalive, out[0].Txn().Keepalive)
	for i, m := range out {
		require.Equal(t, tail+1+messages.MessageID(i), m.ID(), "message %d is not contiguous", i)
		require.Equal(t, id, m.Txn().ID)
		if i > 0 {
			require.Greater(t, m.TimeTick(), out[i-1].TimeTick())
		}
	}
	raw := ruleRaw(t, e, tail+1, out[4].ID())
	require.Len(t, raw, 5)
	for i, m := range raw {
		require.Equal(t, out[i].Type(), m.Type())
		require.Equal(t, out[i].TimeTick(), m.TimeTick())
	}

	got := e.readUntil(e.scan(v, read.Earliest()), out[4].ID())
	tx := got[len(got)-1]
	require.Equal(t, messages.TypeTxn, tx.Type())
	require.Equal(t, out[4].ID(), tx.ID())
	require.Equal(t, []string{"a", "b", "c"}, rulePayloads(tx.TxnBody()))
	// The next append follows right after.
	next := ruleAppend(t, w, e.insert(v, "next"))
	require.Equal(t, out[4].ID()+1, next.ID())
}

// AppendTxn takes only body types of its own VChannel (and PChannel), and
// a valid keepalive: anything else is an invalid argument that writes
// nothing.
func TestRuleAppendTxnInvalid(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v1, v2 := e.vchannel(1), e.vchannel(2)
	e.createCollection(w, v1, 7)
	e.createCollection(w, v2)
	other, err := streamwal.NewPChannel("p", 1)
	require.NoError(t, err)
	ov, err := other.VChannel(1, 0)
	require.NoError(t, err)
	otherInsert, err := e.codec.New(messages.TypeInsert, ov, []byte("x"))
	require.NoError(t, err)
	nested, err := e.codec.NewBody(messages.TypeCommitTxn, v1, messages.CommitTxnBody{},
		messages.WithTxn(messages.TxnContext{ID: 1, Keepalive: time.Second}))
	require.NoError(t, err)
	tail := ruleTail(t, e)

	for _, c := range []struct {
		name string
		body []*messages.MutableMessage
	}{
		{"a non-body type (ManualFlush)", []*messages.MutableMessage{e.insert(v1, "a"), ruleManualFlush(t, e, v1)}},
		{"a DDL (CreatePartition)", []*messages.MutableMessage{ruleDDL(t, e, messages.TypeCreatePartition, v1, 8)}},
		{"a transaction control (CommitTxn)", []*messages.MutableMessage{e.insert(v1, "a"), nested}},
		{"a body of another VChannel", []*messages.MutableMessage{e.insert(v1, "a"), e.insert(v2, "b")}},
		{"a body of another PChannel", []*messages.MutableMessage{e.insert(v1, "a"), otherInsert}},
		{"a nil body", []*messages.MutableMessage{e.insert(v1, "a"), nil}},
	} {
		_, err := w.AppendTxn(ctx, v1, 0, c.body...)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, c.name)
		tail = ruleRefused(t, e, w, v1, tail, err, streamwal.ErrInvalidArgument)
	}
	// A keepalive below the minimum.
	_, err = w.AppendTxn(ctx, v1, time.Microsecond, e.insert(v1, "a"))
	tail = ruleRefused(t, e, w, v1, tail, err, streamwal.ErrInvalidArgument)
	// A body into a partition that does not exist: the whole batch is
	// refused by the lifecycle rules.
	_, err = w.AppendTxn(ctx, v1, 0, e.insert(v1, "a"), e.insert(v1, "b", messages.WithDML(9, 1)))
	ruleRefused(t, e, w, v1, tail, err, lifecycle.ErrPartitionNotFound, streamwal.ErrLifecycle)
}

// The TxnID the WAL gives a transaction is its BeginTxn's TimeTick, for
// BeginTxn and for a BeginTxn appended as a message; a keepalive below the
// minimum is an invalid argument.
func TestRuleTxnIDIsBeginTimeTick(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)

	tc := ruleBegin(t, w, v, 3*time.Second)
	require.Equal(t, 3*time.Second, tc.Keepalive)
	tail := ruleTail(t, e)
	raw := ruleRaw(t, e, tail, tail)
	require.Equal(t, messages.TypeBeginTxn, raw[0].Type())
	require.Equal(t, messages.TxnID(raw[0].TimeTick()), tc.ID)
	require.Equal(t, tc, *raw[0].Txn())

	// A BeginTxn built by the caller with a made-up ID gets the WAL's.
	m, err := e.codec.NewBody(messages.TypeBeginTxn, v, messages.BeginTxnBody{},
		messages.WithTxn(messages.TxnContext{ID: 77, Keepalive: time.Second}))
	require.NoError(t, err)
	im := ruleAppend(t, w, m)
	require.Equal(t, messages.TxnID(im.TimeTick()), im.Txn().ID)
	require.NotEqual(t, messages.TxnID(77), im.Txn().ID)
	require.Equal(t, time.Second, im.Txn().Keepalive)
	require.NotEqual(t, tc.ID, im.Txn().ID)

	// Default keepalive.
	require.Equal(t, messages.DefaultKeepalive, ruleBegin(t, w, v, 0).Keepalive)
	// Below the minimum.
	tail = ruleTail(t, e)
	_, err = w.BeginTxn(ctx, v, time.Microsecond)
	ruleRefused(t, e, w, v, tail, err, streamwal.ErrInvalidArgument)
}

// A body the writer refuses (over the size limit) is an invalid argument
// that writes nothing and does not end its transaction: the transaction
// commits with its other bodies.
func TestRuleRefusedBodyKeepsTxn(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)
	big := ruleBigCodec(t, e)
	tc := ruleBegin(t, w, v, 0)
	ruleBody(t, e, w, v, tc, "b1")
	tail := ruleTail(t, e)

	huge, err := big.New(messages.TypeInsert, v, []byte(strings.Repeat("x", 2<<20)), messages.WithTxn(tc))
	require.NoError(t, err)
	_, err = w.Append(ctx, huge)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Equal(t, tail, ruleTail(t, e))

	ruleBody(t, e, w, v, tc, "b2")
	commit, err := w.CommitTxn(ctx, v, tc)
	require.NoError(t, err)
	require.Equal(t, tail+2, commit.ID())
	tx := ruleTxns(e.readUntil(e.scan(v, read.Earliest()), commit.ID()))[tc.ID]
	require.NotNil(t, tx)
	require.Equal(t, []string{"b1", "b2"}, rulePayloads(tx.TxnBody()))
}

// ---------------------------------------------------------------------
// 2. Locks.

// An exclusive VChannel append (ManualFlush, or a DDL such as
// CreatePartition) fails every open transaction on its VChannel (a later
// body or commit is ErrAborted and writes nothing) but none on another
// VChannel; a transaction begun after it is unaffected.
func TestRuleExclusiveVChannelAbortsItsTxns(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(t *testing.T, e *env, v streamwal.VChannel) *messages.MutableMessage
	}{
		{"ManualFlush", ruleManualFlush},
		{"CreatePartition", func(t *testing.T, e *env, v streamwal.VChannel) *messages.MutableMessage {
			return ruleDDL(t, e, messages.TypeCreatePartition, v, 5)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			w := e.open(1)
			ctx := context.Background()
			v1, v2 := e.vchannel(1), e.vchannel(2)
			e.createCollection(w, v1)
			e.createCollection(w, v2)
			a := ruleBegin(t, w, v1, 0)
			ruleBody(t, e, w, v1, a, "a1")
			b := ruleBegin(t, w, v1, 0) // no body yet
			c := ruleBegin(t, w, v2, 0)
			ruleBody(t, e, w, v2, c, "c1")

			ruleAppend(t, w, tc.make(t, e, v1))
			tail := ruleTail(t, e)

			_, err := w.Append(ctx, e.insert(v1, "a2", messages.WithTxn(a)))
			tail = ruleRefused(t, e, w, v1, tail, err, txn.ErrAborted, streamwal.ErrTxnInvalidState)
			_, err = w.CommitTxn(ctx, v1, a)
			tail = ruleRefused(t, e, w, v1, tail, err, txn.ErrAborted, streamwal.ErrTxnInvalidState)
			_, err = w.CommitTxn(ctx, v1, b)
			tail = ruleRefused(t, e, w, v1, tail, err, txn.ErrAborted, streamwal.ErrTxnInvalidState)
			_, err = w.RollbackTxn(ctx, v1, b)
			ruleRefused(t, e, w, v1, tail, err, txn.ErrAborted, streamwal.ErrTxnInvalidState)

			// v2's transaction goes on; one begun on v1 afterwards works.
			ruleBody(t, e, w, v2, c, "c2")
			cc, err := w.CommitTxn(ctx, v2, c)
			require.NoError(t, err)
			d := ruleBegin(t, w, v1, 0)
			ruleBody(t, e, w, v1, d, "d1")
			dc, err := w.CommitTxn(ctx, v1, d)
			require.NoError(t, err)

			got := ruleTxns(e.readUntil(e.scan(streamwal.VChannel{}, read.Earliest()), dc.ID()))
			require.Len(t, got, 2)
			require.Equal(t, []string{"c1", "c2"}, rulePayloads(got[c.ID].TxnBody()))
			require.Equal(t, cc.ID(), got[c.ID].ID())
			require.Equal(t, []string{"d1"}, rulePayloads(got[d.ID].TxnBody()))
		})
	}
}

// A PChannel-exclusive append (FlushAll) fails every open transaction of
// the PChannel, on every VChannel.
func TestRuleExclusivePChannelAbortsAllTxns(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v1, v2 := e.vchannel(1), e.vchannel(2)
	e.createCollection(w, v1)
	e.createCollection(w, v2)
	a := ruleBegin(t, w, v1, 0)
	ruleBody(t, e, w, v1, a, "a1")
	b := ruleBegin(t, w, v2, 0)
	ruleBody(t, e, w, v2, b, "b1")

	fa := ruleAppend(t, w, ruleFlushAll(t, e))
	require.True(t, fa.VChannel().IsZero())
	tail := fa.ID()

	_, err := w.Append(ctx, e.insert(v1, "a2", messages.WithTxn(a)))
	tail = ruleRefused(t, e, w, v1, tail, err, txn.ErrAborted, streamwal.ErrTxnInvalidState)
	_, err = w.CommitTxn(ctx, v1, a)
	tail = ruleRefused(t, e, w, v1, tail, err, txn.ErrAborted, streamwal.ErrTxnInvalidState)
	_, err = w.Append(ctx, e.insert(v2, "b2", messages.WithTxn(b)))
	tail = ruleRefused(t, e, w, v2, tail, err, txn.ErrAborted, streamwal.ErrTxnInvalidState)
	_, err = w.CommitTxn(ctx, v2, b)
	ruleRefused(t, e, w, v2, tail, err, txn.ErrAborted, streamwal.ErrTxnInvalidState)
}

// An exclusive append that is refused changes nothing, so it aborts no
// transaction: here a CreatePartition refused by the lifecycle rules (the
// partition exists).
func TestRuleRefusedExclusiveAbortsNothing(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v, 5)
	a := ruleBegin(t, w, v, 0)
	ruleBody(t, e, w, v, a, "a1")
	tail := ruleTail(t, e)

	_, err := w.Append(ctx, ruleDDL(t, e, messages.TypeCreatePartition, v, 5))
	tail = ruleRefused(t, e, w, v, tail, err, lifecycle.ErrPartitionExists, streamwal.ErrLifecycle)
	_, err = w.Append(ctx, ruleDDL(t, e, messages.TypeDropPartition, v, 6))
	ruleRefused(t, e, w, v, tail, err, lifecycle.ErrPartitionNotFound, streamwal.ErrLifecycle)

	ruleBody(t, e, w, v, a, "a2")
	_, err = w.CommitTxn(ctx, v, a)
	require.NoError(t, err)
}

// The same for an exclusive append the writer refuses (a ManualFlush or a
// FlushAll whose payload is over the size limit): it is an invalid
// argument, writes nothing, and must leave the open transactions open.
func TestRuleOversizeExclusiveAbortsNothing(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)
	big := ruleBigCodec(t, e)
	pad := strings.Repeat(" ", 2<<20)
	flush, err := big.New(messages.TypeManualFlush, v, []byte(`{"collection_id":42}`+pad))
	require.NoError(t, err)
	flushAll, err := big.NewPChannel(messages.TypeFlushAll, e.p, []byte(`{}`+pad))
	require.NoError(t, err)

	a := ruleBegin(t, w, v, 0)
	ruleBody(t, e, w, v, a, "a1")
	tail := ruleTail(t, e)
	_, err = w.Append(ctx, flush)
	require.ErrorIs(t, err, messages.ErrPayloadTooLarge)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Equal(t, tail, ruleTail(t, e))
	_, err = w.Append(ctx, flushAll)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Equal(t, tail, ruleTail(t, e))

	ruleBody(t, e, w, v, a, "a2") // fails today with ErrAborted
	_, err = w.CommitTxn(ctx, v, a)
	require.NoError(t, err)
}

// An exclusive append (ManualFlush on one VChannel, or FlushAll on the
// whole PChannel) is ordered after every shared append acknowledged before
// it started and before every shared append started after it returned,
// while shared appends on two VChannels race with it; and across all of it
// the stream's TimeTicks strictly increase with MessageIDs.
func TestRuleExclusiveOrdering(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v, u := e.vchannel(42), e.vchannel(43)
	first := e.createCollection(w, v)
	e.createCollection(w, u)
	const n, rounds = 8, 16

	var seq sync.Mutex
	k := 0
	insert := func(name string, out chan<- *messages.ImmutableMessage) {
		seq.Lock()
		target := []streamwal.VChannel{v, u}[k%2]
		k++
		seq.Unlock()
		im, err := w.Append(ctx, e.insert(target, name))
		if err != nil {
			t.Errorf("insert %s: %v", name, err)
		}
		out <- im
	}
	for round := range rounds {
		// Phase 1: 2n inserts; the exclusive starts once n are
		// acknowledged, the others still racing.
		early := make(chan *messages.ImmutableMessage, 2*n)
		for i := range 2 * n {
			go insert(fmt.Sprintf("r%d-early-%d", round, i), early)
		}
		var before []*messages.ImmutableMessage
		for range n {
			before = append(before, <-early)
		}
		// Phase 2: the exclusive, with n more inserts racing it.
		racing := make(chan *messages.ImmutableMessage, n)
		exclusive := make(chan *messages.ImmutableMessage, 1)
		// ManualFlush takes v exclusively, FlushAll the whole PChannel.
		flush := ruleManualFlush(t, e, v)
		if round%2 == 1 {
			flush = ruleFlushAll(t, e)
		}
		go func() {
			im, err := w.Append(ctx, flush)
			if err != nil {
				t.Errorf("exclusive: %v", err)
			}
			exclusive <- im
		}()
		for i := range n {
			go insert(fmt.Sprintf("r%d-racing-%d", round, i), racing)
		}
		x := <-exclusive
		require.NotNil(t, x)
		// Phase 3: n inserts started after the exclusive returned.
		late := make(chan *messages.ImmutableMessage, n)
		for i := range n {
			go insert(fmt.Sprintf("r%d-late-%d", round, i), late)
		}
		for _, m := range before {
			require.NotNil(t, m)
			require.Less(t, m.ID(), x.ID(), "an insert acknowledged before the exclusive started landed after it")
			require.Less(t, m.TimeTick(), x.TimeTick())
		}
		for range n {
			m := <-late
			require.NotNil(t, m)
			require.Greater(t, m.ID(), x.ID(), "an insert started after the exclusive returned landed before it")
			require.Greater(t, m.TimeTick(), x.TimeTick())
		}
		for range n {
			require.NotNil(t, <-early)
			require.NotNil(t, <-racing)
		}
	}
	tail := ruleTail(t, e)
	raw := ruleRaw(t, e, first.ID(), tail)
	require.Len(t, raw, int(tail-first.ID()+1))
	ruleIncreasing(t, raw)
	require.Equal(t, 2+rounds*(4*n+1), len(raw))
}

// ---------------------------------------------------------------------
// 3. Lifecycle.

// Nothing of a collection before its CreateCollection or after its
// DropCollection; no DML into a partition never created or dropped; no
// transaction on a collection not created. Every refusal is a typed
// LIFECYCLE_VIOLATION and writes nothing.
func TestRuleLifecycle(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	probe := e.vchannel(1)
	e.createCollection(w, probe)
	v := e.vchannel(42)
	tail := ruleTail(t, e)

	// Before CreateCollection.
	_, err := w.Append(ctx, e.insert(v, "x"))
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrCollectionNotFound, streamwal.ErrLifecycle)
	_, err = w.BeginTxn(ctx, v, 0)
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrCollectionNotFound, streamwal.ErrLifecycle)
	_, err = w.AppendTxn(ctx, v, 0, e.insert(v, "x"))
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrCollectionNotFound, streamwal.ErrLifecycle)
	_, err = w.Append(ctx, ruleManualFlush(t, e, v))
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrCollectionNotFound, streamwal.ErrLifecycle)
	_, err = w.Append(ctx, ruleDDL(t, e, messages.TypeCreatePartition, v, 3))
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrCollectionNotFound, streamwal.ErrLifecycle)

	// Created with partition 1.
	e.createCollection(w, v, 1)
	tail = ruleTail(t, e)
	_, err = w.Append(ctx, e.insert(v, "p9", messages.WithDML(9, 1)))
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrPartitionNotFound, streamwal.ErrLifecycle)
	ruleAppend(t, w, e.insert(v, "p1", messages.WithDML(1, 1)))
	ruleAppend(t, w, e.insert(v, "p0", messages.WithDML(0, 1))) // no particular partition
	ruleAppend(t, w, ruleDDL(t, e, messages.TypeCreatePartition, v, 2))
	ruleAppend(t, w, e.insert(v, "p2", messages.WithDML(2, 1)))
	ruleAppend(t, w, ruleDDL(t, e, messages.TypeDropPartition, v, 2))
	tail = ruleTail(t, e)
	_, err = w.Append(ctx, e.insert(v, "p2", messages.WithDML(2, 1)))
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrPartitionDropped, streamwal.ErrLifecycle)
	_, err = w.Append(ctx, ruleDDL(t, e, messages.TypeCreatePartition, v, 2))
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrPartitionDropped, streamwal.ErrLifecycle)
	_, err = w.Append(ctx, ruleDDL(t, e, messages.TypeDropPartition, v, 2))
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrPartitionDropped, streamwal.ErrLifecycle)

	// A transaction body into a dropped partition is refused; the
	// transaction goes on.
	tc := ruleBegin(t, w, v, 0)
	tail = ruleTail(t, e)
	_, err = w.Append(ctx, e.insert(v, "p2", messages.WithDML(2, 1), messages.WithTxn(tc)))
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrPartitionDropped, streamwal.ErrLifecycle)
	ruleBody(t, e, w, v, tc, "ok")
	_, err = w.CommitTxn(ctx, v, tc)
	require.NoError(t, err)

	// A second CreateCollection.
	tail = ruleTail(t, e)
	m, err := e.codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: v.String(), CollectionID: v.CollectionID()},
		VChannels:     []string{v.String()},
	})
	require.NoError(t, err)
	_, err = w.Append(ctx, m)
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrCollectionExists, streamwal.ErrLifecycle)

	// Dropped: nothing of it passes any more.
	open := ruleBegin(t, w, v, 0)
	ruleAppend(t, w, ruleDropCollection(t, e, v))
	tail = ruleTail(t, e)
	_, err = w.Append(ctx, e.insert(v, "x"))
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrCollectionDropped, streamwal.ErrLifecycle)
	_, err = w.Append(ctx, e.insert(v, "x", messages.WithDML(1, 1)))
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrCollectionDropped, streamwal.ErrLifecycle)
	_, err = w.BeginTxn(ctx, v, 0)
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrCollectionDropped, streamwal.ErrLifecycle)
	// DropCollection is exclusive: it aborted the transaction left open.
	_, err = w.CommitTxn(ctx, v, open)
	tail = ruleRefused(t, e, w, probe, tail, err, txn.ErrAborted, streamwal.ErrTxnInvalidState)
	_, err = w.Append(ctx, m)
	tail = ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrCollectionDropped, streamwal.ErrLifecycle)
	_, err = w.Append(ctx, ruleDropCollection(t, e, v))
	ruleRefused(t, e, w, probe, tail, err, lifecycle.ErrCollectionDropped, streamwal.ErrLifecycle)
}

// ---------------------------------------------------------------------
// 4. Bad input.

// A message of another PChannel, a message only the WAL may write
// (TimeTick, RecoveryBarrier, CreateSegment, Flush) and a payload over the
// size limit are invalid arguments that write nothing; the WAL keeps
// serving.
func TestRuleBadInput(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)
	tail := ruleTail(t, e)

	other, err := streamwal.NewPChannel("p", 1)
	require.NoError(t, err)
	ov, err := other.VChannel(42, 0)
	require.NoError(t, err)
	foreign, err := e.codec.New(messages.TypeInsert, ov, []byte("x"))
	require.NoError(t, err)
	_, err = w.Append(ctx, foreign)
	tail = ruleRefused(t, e, w, v, tail, err, streamwal.ErrInvalidArgument)

	tick, err := e.codec.NewPChannelBody(messages.TypeTimeTick, e.p, messages.TimeTickBody{})
	require.NoError(t, err)
	tick.SetTimeTick(messages.TimeTickAt(time.Now().Add(time.Hour)))
	barrier, err := e.codec.NewPChannelBody(messages.TypeRecoveryBarrier, e.p, messages.RecoveryBarrierBody{Term: 9, Node: "intruder"})
	require.NoError(t, err)
	segment, err := e.codec.NewBody(messages.TypeCreateSegment, v, messages.CreateSegmentBody{CollectionID: 42, PartitionID: 1, SegmentID: 1})
	require.NoError(t, err)
	flush, err := e.codec.NewBody(messages.TypeFlush, v, messages.FlushBody{CollectionID: 42, SegmentIDs: []int64{1}})
	require.NoError(t, err)
	for _, m := range []*messages.MutableMessage{tick, barrier, segment, flush} {
		_, err = w.Append(ctx, m)
		tail = ruleRefused(t, e, w, v, tail, err, streamwal.ErrInvalidArgument)
	}
	_, err = w.Append(ctx, nil)
	tail = ruleRefused(t, e, w, v, tail, err, streamwal.ErrInvalidArgument)
	// A CommitTxn or RollbackTxn without its transaction context.
	bare, err := e.codec.NewBody(messages.TypeCommitTxn, v, messages.CommitTxnBody{})
	require.NoError(t, err)
	_, err = w.Append(ctx, bare)
	tail = ruleRefused(t, e, w, v, tail, err, streamwal.ErrInvalidArgument)
	bare, err = e.codec.NewBody(messages.TypeRollbackTxn, v, messages.RollbackTxnBody{})
	require.NoError(t, err)
	_, err = w.Append(ctx, bare)
	tail = ruleRefused(t, e, w, v, tail, err, streamwal.ErrInvalidArgument)

	huge, err := ruleBigCodec(t, e).New(messages.TypeInsert, v, []byte(strings.Repeat("x", 2<<20)))
	require.NoError(t, err)
	_, err = w.Append(ctx, huge)
	tail = ruleRefused(t, e, w, v, tail, err, messages.ErrPayloadTooLarge, streamwal.ErrInvalidArgument)
	// Inside a whole transaction too: nothing of it lands.
	_, err = w.AppendTxn(ctx, v, 0, e.insert(v, "small"), huge)
	tail = ruleRefused(t, e, w, v, tail, err, streamwal.ErrInvalidArgument)

	// The barrier it refused did not fence it; the tick did not move its
	// TimeTicks: it serves as before.
	require.NoError(t, w.Err())
	last := ruleAppend(t, w, e.insert(v, "still serving"))
	require.Equal(t, tail+1, last.ID())
	require.Less(t, last.TimeTick(), tick.TimeTick())
}

// ---------------------------------------------------------------------
// 5. Fencing and close.

// Opening term 2 while a term-1 WAL is open fences the term-1 WAL: its
// next append fails with ErrFenced and writes nothing, its Err says
// fenced, and it stops (Done). Opening term 1 again afterwards, or term 2
// from another node, is ErrFenced.
func TestRuleFencing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w1 := e.open(1)
	v := e.vchannel(42)
	e.createCollection(w1, v)
	ruleAppend(t, w1, e.insert(v, "term 1"))

	w2 := e.open(2)
	tail := ruleTail(t, e)
	require.Equal(t, w2.Barrier().ID(), tail)

	_, err := w1.Append(ctx, e.insert(v, "stale"))
	ruleRefused(t, e, nil, streamwal.VChannel{}, tail, err, streamwal.ErrFenced)
	// The append's refusal may reach the caller before the WAL records
	// its own failure: once it has stopped, its Err says fenced.
	select {
	case <-w1.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a fenced WAL did not stop")
	}
	require.ErrorIs(t, w1.Err(), streamwal.ErrFenced)
	_, err = w1.Append(ctx, e.insert(v, "stale again"))
	require.ErrorIs(t, err, streamwal.ErrFenced)
	_, err = w1.BeginTxn(ctx, v, 0)
	require.ErrorIs(t, err, streamwal.ErrFenced)
	require.Equal(t, tail, ruleTail(t, e))

	// Neither the old term nor, from another node, the current one.
	_, err = wal.Open(ctx, e.config(1))
	require.ErrorIs(t, err, streamwal.ErrFenced, "reopen under term 1")
	require.Equal(t, tail, ruleTail(t, e))
	other := e.config(2)
	other.Node = "n2"
	_, err = wal.Open(ctx, other)
	require.ErrorIs(t, err, streamwal.ErrFenced, "open under term 2 by another node")
	require.Equal(t, tail, ruleTail(t, e))

	// The term-2 WAL serves, right after its barrier.
	m := ruleAppend(t, w2, e.insert(v, "term 2"))
	require.Equal(t, tail+1, m.ID())
	require.Equal(t, uint64(2), m.Term())
}

// After Close every append is ErrClosed and writes nothing; Err says
// closed; Close is idempotent.
func TestRuleClosed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w := e.open(1)
	v := e.vchannel(42)
	e.createCollection(w, v)
	tc := ruleBegin(t, w, v, 0)
	require.NoError(t, w.Close())
	require.ErrorIs(t, w.Err(), streamwal.ErrClosed)
	<-w.Done()
	tail := ruleTail(t, e)

	_, err := w.Append(ctx, e.insert(v, "x"))
	tail = ruleRefused(t, e, nil, streamwal.VChannel{}, tail, err, streamwal.ErrClosed)
	_, err = w.BeginTxn(ctx, v, 0)
	tail = ruleRefused(t, e, nil, streamwal.VChannel{}, tail, err, streamwal.ErrClosed)
	_, err = w.AppendTxn(ctx, v, 0, e.insert(v, "x"))
	tail = ruleRefused(t, e, nil, streamwal.VChannel{}, tail, err, streamwal.ErrClosed)
	_, err = w.CommitTxn(ctx, v, tc)
	tail = ruleRefused(t, e, nil, streamwal.VChannel{}, tail, err, streamwal.ErrClosed)
	require.ErrorIs(t, w.Sync(ctx), streamwal.ErrClosed)
	require.Equal(t, tail, ruleTail(t, e))
	require.NoError(t, w.Close())
}

// ---------------------------------------------------------------------
// 6. Recovery.

// The lifecycle state of term 1 (collections created and dropped,
// partitions created and dropped) holds in term 2, rebuilt from the
// stream.
func TestRuleRecoveryLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w1 := e.open(1)
	v, gone, never := e.vchannel(1), e.vchannel(2), e.vchannel(3)
	e.createCollection(w1, v, 1, 2)
	ruleAppend(t, w1, ruleDDL(t, e, messages.TypeDropPartition, v, 2))
	ruleAppend(t, w1, ruleDDL(t, e, messages.TypeCreatePartition, v, 3))
	e.createCollection(w1, gone)
	ruleAppend(t, w1, ruleDropCollection(t, e, gone))
	require.NoError(t, w1.Close())

	w2 := e.open(2)
	tail := ruleTail(t, e)
	require.Equal(t, w2.Barrier().ID(), tail)
	_, err := w2.Append(ctx, e.insert(v, "x", messages.WithDML(2, 1)))
	tail = ruleRefused(t, e, w2, v, tail, err, lifecycle.ErrPartitionDropped, streamwal.ErrLifecycle)
	_, err = w2.Append(ctx, ruleDDL(t, e, messages.TypeCreatePartition, v, 2))
	tail = ruleRefused(t, e, w2, v, tail, err, lifecycle.ErrPartitionDropped, streamwal.ErrLifecycle)
	_, err = w2.Append(ctx, ruleDDL(t, e, messages.TypeCreatePartition, v, 3))
	tail = ruleRefused(t, e, w2, v, tail, err, lifecycle.ErrPartitionExists, streamwal.ErrLifecycle)
	_, err = w2.Append(ctx, e.insert(gone, "x"))
	tail = ruleRefused(t, e, w2, v, tail, err, lifecycle.ErrCollectionDropped, streamwal.ErrLifecycle)
	_, err = w2.Append(ctx, e.insert(never, "x"))
	tail = ruleRefused(t, e, w2, v, tail, err, lifecycle.ErrCollectionNotFound, streamwal.ErrLifecycle)
	m, err := e.codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: v.String(), CollectionID: v.CollectionID()},
		VChannels:     []string{v.String()},
	})
	require.NoError(t, err)
	_, err = w2.Append(ctx, m)
	ruleRefused(t, e, w2, v, tail, err, lifecycle.ErrCollectionExists, streamwal.ErrLifecycle)

	ruleAppend(t, w2, e.insert(v, "p1", messages.WithDML(1, 1)))
	ruleAppend(t, w2, e.insert(v, "p3", messages.WithDML(3, 1)))
}

// Transactions survive a change of owner: one begun in term 1 with a body
// takes another body and commits in term 2 and reads back as one Txn with
// both; one committed in term 1 (through CommitTxn or AppendTxn) cannot be
// committed again, one rolled back cannot be touched, one aborted by an
// exclusive append stays aborted, one whose keepalive ran out before the
// new barrier is expired. Run with the term-1 WAL closed first, and left
// open to be fenced.
func TestRuleRecoveryTxn(t *testing.T) {
	for _, closeFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("close=%v", closeFirst), func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			w1 := e.open(1)
			v, u := e.vchannel(1), e.vchannel(2)
			e.createCollection(w1, v)
			e.createCollection(w1, u)
			carried := ruleBegin(t, w1, v, 0)
			ruleBody(t, e, w1, v, carried, "term1")
			done := ruleBegin(t, w1, v, 0)
			ruleBody(t, e, w1, v, done, "done")
			_, err := w1.CommitTxn(ctx, v, done)
			require.NoError(t, err)
			rolled := ruleBegin(t, w1, v, 0)
			_, err = w1.RollbackTxn(ctx, v, rolled)
			require.NoError(t, err)
			aborted := ruleBegin(t, w1, u, 0)
			ruleBody(t, e, w1, u, aborted, "aborted")
			ruleAppend(t, w1, ruleManualFlush(t, e, u))
			whole, err := w1.AppendTxn(ctx, v, 0, e.insert(v, "whole"))
			require.NoError(t, err)
			wholeTC := *whole[0].Txn()
			expiring := ruleBegin(t, w1, v, ruleShort)
			last := ruleBody(t, e, w1, v, expiring, "expiring")
			ruleWaitPast(t, ruleDeadline(last.TimeTick(), expiring.Keepalive))
			if closeFirst {
				require.NoError(t, w1.Close())
			}

			w2 := e.open(2)
			tail := ruleTail(t, e)
			_, err = w2.CommitTxn(ctx, v, done)
			ruleTxnCode(t, err)
			tail = ruleRefused(t, e, w2, v, tail, err, txn.ErrCommitted, streamwal.ErrTxnInvalidState)
			_, err = w2.Append(ctx, e.insert(v, "late", messages.WithTxn(done)))
			tail = ruleRefused(t, e, w2, v, tail, err, txn.ErrCommitted, streamwal.ErrTxnInvalidState)
			_, err = w2.CommitTxn(ctx, v, rolled)
			tail = ruleRefused(t, e, w2, v, tail, err, txn.ErrRolledBack, streamwal.ErrTxnInvalidState)
			_, err = w2.Append(ctx, e.insert(u, "late", messages.WithTxn(aborted)))
			tail = ruleRefused(t, e, w2, v, tail, err, txn.ErrAborted, streamwal.ErrTxnInvalidState)
			_, err = w2.CommitTxn(ctx, u, aborted)
			tail = ruleRefused(t, e, w2, v, tail, err, txn.ErrAborted, streamwal.ErrTxnInvalidState)
			_, err = w2.CommitTxn(ctx, v, wholeTC)
			ruleTxnCode(t, err)
			tail = ruleRefused(t, e, w2, v, tail, err, txn.ErrCommitted, streamwal.ErrTxnInvalidState)
			// Its keepalive ran out before the new owner's barrier.
			_, err = w2.Append(ctx, e.insert(v, "expiring-late", messages.WithTxn(expiring)))
			tail = ruleRefused(t, e, w2, v, tail, err, txn.ErrExpired, streamwal.ErrTxnExpired)
			_, err = w2.CommitTxn(ctx, v, expiring)
			ruleRefused(t, e, w2, v, tail, err, txn.ErrExpired, streamwal.ErrTxnExpired)

			b := ruleBody(t, e, w2, v, carried, "term2")
			require.Equal(t, carried, *b.Txn())
			require.Equal(t, uint64(2), b.Term())
			commit, err := w2.CommitTxn(ctx, v, carried)
			require.NoError(t, err)

			got := e.readUntil(e.scan(v, read.Earliest()), commit.ID())
			ruleIncreasing(t, got)
			txns := ruleTxns(got)
			require.Len(t, txns, 3)
			require.Equal(t, []string{"done"}, rulePayloads(txns[done.ID].TxnBody()))
			require.Equal(t, []string{"whole"}, rulePayloads(txns[wholeTC.ID].TxnBody()))
			for _, m := range got {
				require.NotContains(t, string(m.Payload()), "expiring")
				require.NotContains(t, string(m.Payload()), "aborted")
				require.NotContains(t, string(m.Payload()), "late")
			}
			tx := txns[carried.ID]
			require.NotNil(t, tx)
			require.Equal(t, commit.ID(), tx.ID())
			require.Equal(t, []string{"term1", "term2"}, rulePayloads(tx.TxnBody()))
			require.Equal(t, uint64(1), tx.TxnBody()[0].Term())
			require.Equal(t, uint64(2), tx.TxnBody()[1].Term())
			// Its LastConfirmed reaches back to its BeginTxn in term 1.
			require.LessOrEqual(t, tx.LastConfirmed(), tx.TxnBegin().ID())
		})
	}
}

// ---------------------------------------------------------------------
// 7. Sync loop.

// After an append, Sync appends a persisted TimeTick (a reader filtering
// on TimeTick sees it, right after the append); a second Sync with nothing
// appended writes nothing but publishes a live tick, which moves a live
// reader's watermark beyond the persisted TimeTick.
func TestRuleSyncTicks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w := e.open(1)
	v := e.vchannel(42)
	e.createCollection(w, v)
	ins := ruleAppend(t, w, e.insert(v, "x"))

	ticks := e.scan(v, read.Earliest(), messages.TypeTimeTick)
	whole := e.scan(streamwal.VChannel{}, read.Earliest(), messages.TypeTimeTick)
	require.NoError(t, w.Sync(ctx))
	tail := ruleTail(t, e)
	require.Equal(t, ins.ID()+1, tail)
	var tick *messages.ImmutableMessage
	for _, s := range []*read.Scanner{ticks, whole} {
		got := e.readUntil(s, tail)
		require.Len(t, got, 1, "only the TimeTick passes the filter")
		require.Equal(t, messages.TypeTimeTick, got[0].Type())
		require.Equal(t, tail, got[0].ID())
		require.Greater(t, got[0].TimeTick(), ins.TimeTick())
		require.True(t, got[0].VChannel().IsZero())
		require.GreaterOrEqual(t, s.Watermark(), got[0].TimeTick())
		tick = got[0]
	}

	// Nothing appended since: a live tick, no message.
	require.NoError(t, w.Sync(ctx))
	require.Equal(t, tail, ruleTail(t, e))
	for _, s := range []*read.Scanner{ticks, whole} {
		require.Eventually(t, func() bool { return s.Watermark() > tick.TimeTick() },
			10*time.Second, time.Millisecond, "the live tick did not move the watermark")
	}
	// And again: each live tick moves it further, still writing nothing.
	wm := ticks.Watermark()
	require.NoError(t, w.Sync(ctx))
	require.Eventually(t, func() bool { return ticks.Watermark() > wm }, 10*time.Second, time.Millisecond)
	require.Equal(t, tail, ruleTail(t, e))

	// The next append is above every tick, and makes the next Sync
	// persist one again.
	next := ruleAppend(t, w, e.insert(v, "y"))
	require.Equal(t, tail+1, next.ID())
	require.Greater(t, next.TimeTick(), ticks.Watermark())
	require.NoError(t, w.Sync(ctx))
	require.Equal(t, next.ID()+1, ruleTail(t, e))
	got := e.readUntil(ticks, next.ID()+1)
	require.Len(t, got, 1)
	require.Equal(t, messages.TypeTimeTick, got[0].Type())
}

// The sync loop runs by itself: with a short interval, an append is
// followed by a persisted TimeTick, and while nothing is appended a live
// reader's watermark keeps moving on live ticks, with nothing written.
func TestRuleSyncLoopRuns(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(1)
	cfg.SyncInterval = 5 * time.Millisecond
	w := ruleOpenWith(t, cfg)
	v := e.vchannel(42)
	e.createCollection(w, v)
	ins := ruleAppend(t, w, e.insert(v, "x"))

	ticks := e.scan(v, read.From(ins.ID()), messages.TypeTimeTick)
	got := e.readUntil(ticks, ins.ID()+1)
	require.Len(t, got, 1)
	require.Equal(t, messages.TypeTimeTick, got[0].Type())
	require.Equal(t, ins.ID()+1, got[0].ID())
	tail := ruleTail(t, e)
	require.Equal(t, got[0].ID(), tail, "one persisted TimeTick per append, not one per interval")

	mark := messages.TimeTickAt(time.Now())
	require.Eventually(t, func() bool { return ticks.Watermark() > mark }, 10*time.Second, time.Millisecond,
		"live ticks did not move the watermark past the clock")
	require.Equal(t, tail, ruleTail(t, e), "live ticks are not persisted")
}

// A WAL that a newer owner fenced must not tell readers that time moved
// on: it does not know it is fenced until it writes, but a live tick it
// publishes then (drawn from the oracle after the new owner drew its
// TimeTicks) promises readers that no later message has a smaller
// TimeTick, which the new owner's next appends break.
func TestRuleFencedOwnerPublishesNoLiveTick(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w1 := e.open(1)
	v := e.vchannel(42)
	e.createCollection(w1, v)
	require.NoError(t, w1.Sync(ctx)) // idle at the stream's tail
	w2 := e.open(2)
	a := ruleAppend(t, w2, e.insert(v, "a"))
	s := e.scan(v, read.Earliest())
	e.readUntil(s, a.ID())

	subject := e.codec.Cluster().LiveTickSubject(e.p)
	sub, err := e.nc.SubscribeSync(subject)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	_ = w1.Sync(ctx) // the stale owner's sync round
	// A sentinel on the same connection: every tick w1 published comes
	// before it.
	require.NoError(t, e.nc.Publish(subject, []byte("sentinel")))
	var stale []messages.LiveTick
	for {
		m, err := sub.NextMsg(10 * time.Second)
		require.NoError(t, err)
		if string(m.Data) == "sentinel" {
			break
		}
		if lt, err := e.codec.DecodeLiveTick(m); err == nil && lt.Term < w2.Term() {
			stale = append(stale, lt)
		}
	}
	for _, lt := range stale {
		require.Eventually(t, func() bool { return s.Watermark() >= lt.TimeTick }, 10*time.Second, time.Millisecond)
	}
	wm := s.Watermark()
	b := ruleAppend(t, w2, e.insert(v, "b"))
	got := e.readUntil(s, b.ID())
	require.Greater(t, got[len(got)-1].TimeTick(), wm,
		"a message read after the watermark reached %s has a smaller TimeTick (stale live ticks: %+v)", wm, stale)
	require.Empty(t, stale, "the fenced term-1 WAL published live ticks")
}

// A transaction message whose caller-set MsgID was already stored is
// deduplicated by the stream, so it is not written as part of the
// transaction: the WAL must then refuse it, never report it as one of the
// transaction's messages; and a whole transaction stays atomic and
// contiguous or is refused.
func TestRuleDuplicateMsgIDInTxn(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	e.createCollection(w, v)
	plain := ruleAppend(t, w, e.insert(v, "plain", messages.WithMsgID("dup-1")))

	tc := ruleBegin(t, w, v, 0)
	tail := ruleTail(t, e)
	body, err := w.Append(ctx, e.insert(v, "body", messages.WithMsgID("dup-1"), messages.WithTxn(tc)))
	if err == nil {
		raw := ruleRaw(t, e, body.ID(), body.ID())
		require.NotNil(t, raw[0].Txn(), "the WAL reported message %d as a body of txn %d; the stream holds %q there (plain insert %d)",
			body.ID(), tc.ID, raw[0].Payload(), plain.ID())
		require.Equal(t, tc.ID, raw[0].Txn().ID)
	} else {
		tail = ruleRefused(t, e, w, v, tail, err)
	}
	commit, err := w.CommitTxn(ctx, v, tc)
	if err == nil {
		tx := ruleTxns(e.readUntil(e.scan(v, read.After(plain.ID())), commit.ID()))[tc.ID]
		require.NotNil(t, tx)
		if body != nil {
			require.Len(t, tx.TxnBody(), 1, "the body the WAL acknowledged is not in the transaction read back")
		}
		tail = commit.ID()
	}

	out, err := w.AppendTxn(ctx, v, 0, e.insert(v, "a"), e.insert(v, "b", messages.WithMsgID("dup-1")))
	if err != nil {
		ruleRefused(t, e, w, v, tail, err)
		return
	}
	for i, m := range out {
		require.Equal(t, out[0].ID()+messages.MessageID(i), m.ID(), "AppendTxn message %d is not contiguous", i)
	}
}

// An append the stream deduplicates (a retry with the MsgID of a stored
// message, here the idempotent retry of a CreateCollection) returns the
// message as stored: its MessageID, TimeTick and LastConfirmed.
func TestRuleDuplicateReturnsStored(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	ctx := context.Background()
	v := e.vchannel(42)
	m, err := e.codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: v.String(), CollectionID: v.CollectionID()},
		VChannels:     []string{v.String()},
	}, messages.WithMsgID("create-42"))
	require.NoError(t, err)
	retry := m.Clone()
	first := ruleAppend(t, w, m)
	ruleAppend(t, w, e.insert(v, "between"))
	tail := ruleTail(t, e)

	again, err := w.Append(ctx, retry)
	require.NoError(t, err, "an idempotent retry of a CreateCollection")
	require.Equal(t, tail, ruleTail(t, e), "the retry wrote nothing")
	require.Equal(t, first.ID(), again.ID())
	require.LessOrEqual(t, again.LastConfirmed(), again.ID())
	require.Equal(t, first.TimeTick(), again.TimeTick(), "the retry must return the message as stored")
}
