package wal

import (
	"context"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// txnInterceptor runs transaction sessions: it assigns TxnIDs, checks
// every transaction message against its session, makes CommitTxn wait for
// the bodies in flight, expires idle sessions on TimeTicks, and ends the
// open sessions an exclusive operation covers.
type txnInterceptor struct{}

// admit makes a CommitTxn wait until its transaction's bodies resolved.
func (txnInterceptor) admit(ctx context.Context, w *WAL, op *appendOp) error {
	m := op.msgs[0]
	if op.whole || m.Type() != messages.TypeCommitTxn {
		return nil
	}
	tc := m.Txn()
	if tc == nil {
		return missingTxn(m)
	}
	w.mu.Lock()
	drained, err := w.txns.StartCommit(tc.ID, m.VChannel(), w.acks.Last())
	w.mu.Unlock()
	if err != nil {
		return err
	}
	op.txnID = tc.ID
	if drained == nil {
		return nil
	}
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
	case <-w.stop:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.txns.CancelCommit(tc.ID)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return w.stoppedLocked()
}

func (txnInterceptor) stamp(w *WAL, op *appendOp) error {
	if op.whole {
		return stampWhole(op)
	}
	m, tt := op.msgs[0], op.tts[0]
	t := m.Type()
	switch {
	case t == messages.TypeTimeTick:
		w.txns.Expire(tt)
		return nil
	case t == messages.TypeBeginTxn:
		return w.beginTxn(op, m, tt)
	case t == messages.TypeCommitTxn:
		_, err := w.txns.Commit(op.txnID, m.VChannel(), tt)
		return err
	case t == messages.TypeRollbackTxn:
		if m.Txn() == nil {
			return missingTxn(m)
		}
		return w.txns.Rollback(m.Txn().ID, m.VChannel(), tt)
	case m.Txn() != nil:
		return w.txnBody(op, m, tt)
	}
	return nil
}

// abortCovered ends the open transactions an exclusive append that landed
// (or may have) covers. It runs at finish, not at stamp: an exclusive
// append refused or abandoned aborts nothing, and its exclusive lock kept
// every transaction message it covers from being stamped meanwhile.
func (w *WAL) abortCovered(m *messages.MutableMessage) {
	t := m.Type()
	if t.Lock.Mode != messages.LockExclusive {
		return
	}
	v := m.VChannel()
	if t.Lock.Scope == messages.ScopePChannel {
		v = streamwal.VChannel{}
	}
	if ids := w.txns.Abort(v); len(ids) > 0 {
		w.log.Debug().Str("type", t.Name).Int("txns", len(ids)).Msg("exclusive append aborted open transactions")
	}
}

// beginTxn opens a session; its TxnID is the BeginTxn's TimeTick.
func (w *WAL) beginTxn(op *appendOp, m *messages.MutableMessage, tt messages.TimeTick) error {
	tc := messages.TxnContext{ID: messages.TxnID(tt), Keepalive: messages.DefaultKeepalive}
	if m.Txn() != nil {
		tc.Keepalive = m.Txn().Keepalive
	}
	if _, err := w.txns.Begin(tc.ID, m.VChannel(), tc.Keepalive, tt, w.maxAcked+1); err != nil {
		return err
	}
	op.txnID = tc.ID
	return m.SetTxn(&tc)
}

// txnBody counts a body in its session and gives it the session's context.
func (w *WAL) txnBody(op *appendOp, m *messages.MutableMessage, tt messages.TimeTick) error {
	id := m.Txn().ID
	s, err := w.txns.Body(id, m.VChannel(), tt)
	if err != nil {
		return err
	}
	op.txnID = id
	return m.SetTxn(&messages.TxnContext{ID: s.ID, Keepalive: s.Keepalive})
}

// stampWhole gives a whole transaction its TxnID (the BeginTxn's
// TimeTick) and keepalive. It needs no session: its messages land
// contiguously and together or not at all.
func stampWhole(op *appendOp) error {
	tc := messages.TxnContext{ID: messages.TxnID(op.tts[0]), Keepalive: op.msgs[0].Txn().Keepalive}
	for _, m := range op.msgs {
		if err := m.SetTxn(&tc); err != nil {
			return err
		}
	}
	return nil
}

func (txnInterceptor) finish(w *WAL, op *appendOp, index int) {
	m := op.msgs[0]
	if op.stamped > index && (op.outcome == landed || op.outcome == unknown) {
		w.abortCovered(m)
	}
	if op.txnID == 0 || op.whole {
		return
	}
	if op.stamped <= index {
		if m.Type() == messages.TypeCommitTxn {
			w.txns.CancelCommit(op.txnID)
		}
		return
	}
	switch m.Type() {
	case messages.TypeBeginTxn:
		w.txns.BeginDone(op.txnID, op.outcome == landed)
	case messages.TypeCommitTxn:
		if op.outcome != landed {
			w.txns.CommitFailed(op.txnID, op.err)
		}
	case messages.TypeRollbackTxn:
	default:
		if op.outcome == refused {
			w.txns.BodyRefused(op.txnID, op.tts[0])
			return
		}
		w.txns.BodyDone(op.txnID, op.outcome == landed)
	}
}

// missingTxn is the error of a transaction message without its context.
func missingTxn(m *messages.MutableMessage) error {
	return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s on %s carries no transaction context", m.Type(), m.VChannel())
}
