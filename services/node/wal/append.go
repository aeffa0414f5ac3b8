package wal

import (
	"context"
	"errors"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// outcome is what became of an append.
type outcome uint8

const (
	// refused: never handed to the writer, or refused by it before sending.
	refused outcome = iota
	// landed: stored.
	landed
	// lost: sent or queued, and certainly not stored.
	lost
	// unknown: it may or may not be stored.
	unknown
)

// appendOp is one append going through the chain: one message, or the
// messages of a whole transaction that land as one atomic batch.
type appendOp struct {
	msgs     []*messages.MutableMessage
	whole    bool // begin, bodies and commit of one transaction
	internal bool // written by the WAL itself (TimeTick)

	// Filled in as the op moves through the chain.
	admitted int // interceptors whose admit succeeded
	stamped  int // interceptors whose stamp succeeded
	tts      []messages.TimeTick
	fut      *jetstream.AppendFuture
	outcome  outcome
	ids      []messages.MessageID
	err      error              // why it did not land
	acked    bool               // its TimeTicks were confirmed
	claimed  bool               // its message IDs are registered in flight
	tail     messages.MessageID // the largest MessageID acknowledged when it was stamped

	// Per-interceptor state.
	lockID  uint64
	txnID   messages.TxnID
	replica messages.TimeTick // the source TimeTick of a replica (0: not one)

	// Shard management: pre are the CreateSegments that open the segments
	// op's inserts go to, appended in the same atomic unit just before
	// op.msgs (so they land iff the inserts do), with their TimeTicks and
	// MessageIDs; created are those segments; segs the segment of each
	// message of op (0: none); frozen the messages as stored, once landed.
	pre     []*messages.MutableMessage
	preTTs  []messages.TimeTick
	preIDs  []messages.MessageID
	created []int64
	segs    []int64
	shares  []share
	frozen  []*messages.ImmutableMessage
}

// interceptor is one stage of the append chain. admit runs without the
// WAL's mutex and may wait; stamp runs under it, in chain order, and may
// refuse; finish runs under it, in reverse order, for every interceptor
// whose admit succeeded, once the op resolved (op.stamped says how far
// stamping got, op.outcome what became of the append).
type interceptor interface {
	admit(ctx context.Context, w *WAL, op *appendOp) error
	stamp(w *WAL, op *appendOp) error
	finish(w *WAL, op *appendOp, index int)
}

// run takes op through the chain and the writer, and returns the stored
// messages.
func (w *WAL) run(ctx context.Context, op *appendOp) ([]*messages.ImmutableMessage, error) {
	op, err := w.startOrWait(ctx, op)
	if err != nil {
		return nil, err
	}
	return w.wait(ctx, op)
}

// start admits and stamps op: once it returns nil, op is queued to the
// writer, ordered after every op started before it.
func (w *WAL) start(ctx context.Context, op *appendOp) error {
	if err := w.validate(op); err != nil {
		return err
	}
	for _, ic := range w.chain {
		if err := ic.admit(ctx, w, op); err != nil {
			w.resolve(op)
			return err
		}
		op.admitted++
	}
	if err := w.stamp(op); err != nil {
		op.err = err
		w.resolve(op)
		return err
	}
	return nil
}

// wait waits for a started op's outcome. If ctx ends first, the op is
// abandoned when the writer had not taken it yet (never written), or else
// resolved in the background when the writer is done with it.
func (w *WAL) wait(ctx context.Context, op *appendOp) ([]*messages.ImmutableMessage, error) {
	_, err := op.fut.Wait(ctx)
	select {
	case <-op.fut.Done():
		ids, err := op.fut.Result()
		op.settle(ids, err)
		w.resolve(op) // freezes what landed, for the ledger and for out below
		if err != nil {
			return nil, err
		}
	default:
		if !errors.Is(err, streamwal.ErrUnknownOutcome) {
			op.outcome, op.err = lost, err
			w.resolve(op)
			return nil, err
		}
		go func() {
			<-op.fut.Done()
			op.settle(op.fut.Result())
			w.resolve(op)
		}()
		return nil, err
	}
	out := make([]*messages.ImmutableMessage, len(op.msgs))
	for i, m := range op.msgs {
		id := op.ids[i]
		switch {
		case id > op.tail && op.frozen != nil:
			out[i] = op.frozen[i]
			continue
		case id > op.tail:
			out[i] = m.Freeze(id)
			continue
		}
		// At or below the tail when it was stamped: the stream deduplicated
		// it to a message stored before; return that one.
		if out[i], err = w.cfg.Backend.Get(ctx, w.cfg.PChannel, id); err != nil {
			return nil, streamwal.Errorf(streamwal.CodeUnknownOutcome, "%s deduplicated to %d, which cannot be read: %w", m.MsgID(), id, err)
		}
	}
	return out, nil
}

// settle records the writer's verdict.
func (op *appendOp) settle(ids []messages.MessageID, err error) {
	switch {
	case err == nil:
		op.outcome = landed
		op.preIDs, op.ids = ids[:len(op.pre)], ids[len(op.pre):]
	case errors.Is(err, streamwal.ErrUnknownOutcome):
		op.outcome, op.err = unknown, err
	default:
		op.outcome, op.err = lost, err
	}
}

// stamp orders op: TimeTicks, the interceptors' stamps, LastConfirmed and
// term, then the writer, all under the mutex.
func (w *WAL) stamp(op *appendOp) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.stoppedLocked(); err != nil {
		return err
	}
	// The segments op's inserts open are created first: their
	// CreateSegments land before op.msgs, so their TimeTicks come first.
	if err := w.planSegments(op); err != nil {
		return err
	}
	op.tts = make([]messages.TimeTick, len(op.msgs))
	for i, m := range op.msgs {
		tt, err := w.nextTimeTick()
		if err != nil {
			return err
		}
		op.tts[i] = tt
		m.SetTimeTick(tt)
	}
	if err := w.claimIDs(op); err != nil {
		return err
	}
	op.tail = w.maxAcked
	// LastConfirmed is taken before the interceptors stamp, so that a
	// CommitTxn's still counts its own transaction as open.
	lc := w.maxAcked + 1
	if oldest, ok := w.txns.Oldest(); ok {
		lc = min(lc, oldest)
	}
	for _, ic := range w.chain {
		if err := ic.stamp(w, op); err != nil {
			return err
		}
		op.stamped++
	}
	for _, m := range op.pre {
		m.SetLastConfirmed(lc)
		m.SetTerm(w.cfg.Term)
	}
	for _, m := range op.msgs {
		m.SetLastConfirmed(lc)
		m.SetTerm(w.cfg.Term)
	}
	if err := w.allocate(op); err != nil {
		return err
	}
	unit := op.msgs
	if len(op.pre) > 0 {
		unit = append(append(make([]*messages.MutableMessage, 0, len(op.pre)+len(op.msgs)), op.pre...), op.msgs...)
	}
	op.fut = w.w.AppendAsync(context.Background(), unit...)
	w.inflight.Add(1)
	select {
	case <-op.fut.Done():
		// Refused before it was queued (size, a stopped writer). An
		// unknown outcome, already known here if the writer was quick,
		// is no refusal: wait books it like any other.
		if _, err := op.fut.Result(); err != nil && !errors.Is(err, streamwal.ErrUnknownOutcome) {
			w.inflight.Done()
			w.confirm(op)
			return err
		}
	default:
	}
	return nil
}

// claimIDs registers op's caller message IDs as in flight. An append one
// of whose IDs is in flight already (a client's retry of a request the
// WAL is still at work on) is refused with an idInFlight, which start's
// callers wait out.
func (w *WAL) claimIDs(op *appendOp) error {
	for i, m := range op.msgs {
		id := m.MsgID()
		if id == "" {
			continue
		}
		if done, ok := w.msgIDs[id]; ok {
			for _, prev := range op.msgs[:i] {
				if mine, ok := w.msgIDs[prev.MsgID()]; ok {
					close(mine)
					delete(w.msgIDs, prev.MsgID())
				}
			}
			return &idInFlight{id: id, done: done}
		}
		w.msgIDs[id] = make(chan struct{})
	}
	op.claimed = true
	return nil
}

// releaseIDs forgets op's message IDs once it resolved, and lets the
// appends waiting for them go.
func (w *WAL) releaseIDs(op *appendOp) {
	if !op.claimed {
		return
	}
	for _, m := range op.msgs {
		if done, ok := w.msgIDs[m.MsgID()]; ok {
			close(done)
			delete(w.msgIDs, m.MsgID())
		}
	}
	op.claimed = false
}

// idInFlight refuses to start an append one of whose message IDs is in
// flight in another append; done is closed once that one resolved.
type idInFlight struct {
	id   string
	done <-chan struct{}
}

// Error implements error.
func (e *idInFlight) Error() string {
	return "an append with message id " + e.id + " is in flight"
}

// startOrWait starts op; while one of its message IDs is in flight in
// another append, it waits for that one to resolve and starts a fresh op
// of the same messages: the stream's deduplication then returns what that
// one stored, or, if it did not land, this one lands. Waiting, rather
// than refusing, keeps a client that retries a slow request from sending
// it again and again while the first attempt is at work. It returns the
// op that started.
func (w *WAL) startOrWait(ctx context.Context, op *appendOp) (*appendOp, error) {
	for {
		err := w.start(ctx, op)
		var busy *idInFlight
		if !errors.As(err, &busy) {
			return op, err
		}
		select {
		case <-busy.done:
		case <-ctx.Done():
			return op, streamwal.Errorf(streamwal.CodeUnavailable, "an append with message id %q is in flight and did not resolve in time: %w", busy.id, ctx.Err())
		}
		op = &appendOp{msgs: op.msgs, whole: op.whole, internal: op.internal}
	}
}

// nextTimeTick draws a TimeTick above the floor.
func (w *WAL) nextTimeTick() (messages.TimeTick, error) {
	tt, err := w.alloc.Next(w.alive)
	if err == nil && tt <= w.floor {
		// A stale batch, or an oracle behind the stream: draw anew once.
		w.alloc.Reset()
		tt, err = w.alloc.Next(w.alive)
	}
	if errors.Is(err, streamwal.ErrFenced) {
		// The oracle knows of a newer owner: stop as on a fenced write.
		w.failLocked(oracleFenced(w.cfg, err))
		return 0, w.stopped
	}
	if err != nil {
		return 0, streamwal.Errorf(streamwal.CodeUnavailable, "allocate a timetick for %s: %w", w.cfg.PChannel, err)
	}
	if tt <= w.floor {
		return 0, streamwal.Errorf(streamwal.CodeUnavailable, "timestamp oracle is behind %s: %s after %s", w.cfg.PChannel, tt, w.floor)
	}
	w.floor = tt
	return tt, nil
}

// oracleFenced is the error of a WAL whose TimeTick the oracle refused
// because the PChannel is assigned under a later term.
func oracleFenced(cfg Config, err error) error {
	return streamwal.Errorf(streamwal.CodeFenced, "%s under term %d: the timestamp oracle refuses a superseded owner: %w", cfg.PChannel, cfg.Term, err)
}

// allocate registers op's TimeTicks with the ack manager; on a refusal
// it confirms those registered and returns it.
func (w *WAL) allocate(op *appendOp) error {
	all := op.tts
	if len(op.preTTs) > 0 { // rare: a segment opens; the common op copies nothing
		all = append(append([]messages.TimeTick(nil), op.preTTs...), op.tts...)
	}
	for i, tt := range all {
		if err := w.acks.Allocate(tt); err != nil {
			for _, done := range all[:i] {
				_ = w.acks.Confirm(done)
			}
			op.acked = true
			return err
		}
	}
	return nil
}

// confirm marks op's TimeTicks confirmed in the ack manager.
func (w *WAL) confirm(op *appendOp) {
	for _, tt := range op.preTTs {
		_ = w.acks.Confirm(tt)
	}
	for _, tt := range op.tts {
		_ = w.acks.Confirm(tt)
	}
	op.acked = true
}

// resolve runs the interceptors' finish in reverse order and books the
// outcome.
func (w *WAL) resolve(op *appendOp) {
	w.mu.Lock()
	queued := op.fut != nil && !op.acked
	if queued {
		w.confirm(op)
	}
	w.releaseIDs(op)
	if op.outcome == landed {
		w.noteLanded(op)
	}
	for i := op.admitted - 1; i >= 0; i-- {
		w.chain[i].finish(w, op, i)
	}
	w.mu.Unlock()
	if op.outcome == landed {
		w.feedLedger(op)
	}
	if queued {
		w.inflight.Done() // after the ledger has it: the final round covers it
	}
}

// noteLanded advances what the WAL knows of the stream's tail (under
// w.mu).
func (w *WAL) noteLanded(op *appendOp) {
	last := op.ids[len(op.ids)-1]
	w.maxAcked = max(w.maxAcked, last)
	w.syncer.Landed(last, op.internal)
}

// feedLedger hands what a landed op stored to the ledger (outside w.mu).
func (w *WAL) feedLedger(op *appendOp) {
	if w.led == nil {
		return
	}
	w.freeze(op)
	stored := make([]*messages.ImmutableMessage, 0, len(op.pre)+len(op.msgs))
	for i, m := range op.pre {
		stored = append(stored, m.Freeze(op.preIDs[i]))
	}
	for i := range op.msgs {
		if op.ids[i] > op.tail { // else deduplicated to a message stored before
			stored = append(stored, w.asStored(op, i))
		}
	}
	w.lmu.Lock()
	defer w.lmu.Unlock()
	for _, m := range stored {
		w.led.landed(m)
	}
	w.kickStorage()
}

// freeze makes the messages of a landed op immutable, once, for the
// ledger and the caller (by the goroutine that resolves op).
func (w *WAL) freeze(op *appendOp) {
	if w.led == nil || op.outcome != landed || op.frozen != nil {
		return
	}
	op.frozen = make([]*messages.ImmutableMessage, len(op.msgs))
	for i, m := range op.msgs {
		op.frozen[i] = m.Freeze(op.ids[i])
	}
}

// asStored is message i of a landed op as a reader of the stream sees it:
// for the lifecycle DDL the ledger records by message ID, with the ID the
// writer gave it if the caller gave none (the caller's message is not
// changed: a retry of it must not carry an ID it never had).
func (w *WAL) asStored(op *appendOp, i int) *messages.ImmutableMessage {
	m := op.msgs[i]
	if m.MsgID() != "" || !changesLifecycle(m.Type()) {
		return op.frozen[i]
	}
	ids := op.fut.MsgIDs()
	if len(ids) != len(op.pre)+len(op.msgs) {
		return op.frozen[i]
	}
	c := m.Clone()
	if err := c.SetMsgID(ids[len(op.pre)+i]); err != nil {
		return op.frozen[i]
	}
	return c.Freeze(op.ids[i])
}

// validate refuses what may never be appended, before anything changes.
func (w *WAL) validate(op *appendOp) error {
	if len(op.msgs) == 0 {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "append of no message")
	}
	for i, m := range op.msgs {
		if m == nil || m.PChannel() != w.cfg.PChannel {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "message %d is not for %s", i, w.cfg.PChannel)
		}
		t := m.Type()
		switch {
		case t.Is(messages.FlagSynthetic) || t == messages.TypeRecoveryBarrier:
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s is never appended", t)
		case t.Is(messages.FlagSelfControlled) && !op.internal:
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s: %w", t, errAppendsOnly)
		case (op.whole || m.Txn() != nil || t.Is(messages.FlagTxnControl)) && m.MsgID() != "":
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s %d carries message id %q: %w", t, i, m.MsgID(), errTxnMsgID)
		}
	}
	if op.whole {
		return validateWhole(op.msgs)
	}
	return nil
}

// validateWhole checks a whole transaction: BeginTxn, bodies, CommitTxn,
// all on one VChannel.
func validateWhole(msgs []*messages.MutableMessage) error {
	if msgs[0].Txn() == nil {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "the BeginTxn of a whole transaction carries no transaction context")
	}
	v := msgs[0].VChannel()
	for i, m := range msgs {
		ok := m.VChannel() == v
		switch {
		case i == 0:
			ok = ok && m.Type() == messages.TypeBeginTxn
		case i == len(msgs)-1:
			ok = ok && m.Type() == messages.TypeCommitTxn
		default:
			ok = ok && m.Type().Is(messages.FlagTxnBody)
		}
		if !ok {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "message %d (%s on %s) cannot be part of a transaction on %s", i, m.Type(), m.VChannel(), v)
		}
	}
	return nil
}
