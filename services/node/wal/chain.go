package wal

import (
	"context"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/lock"
)

// newChain returns the interceptors in chain order. The replicate stage
// comes first: a write the cluster's role refuses waits for no lock. The
// shard stage stamps after the lifecycle stage (it assigns only what may
// land), and the txn interceptor last, so that once it has counted a body
// in flight nothing after it refuses the append.
func newChain() []interceptor {
	return []interceptor{replicateInterceptor{}, lockInterceptor{}, lifecycleInterceptor{}, shardInterceptor{}, txnInterceptor{}}
}

// lockInterceptor takes the lock the message type declares.
type lockInterceptor struct{}

// request is the lock op needs: its type's declared lock; types that
// declare none take a shared lock on their VChannel (so that an exclusive
// operation there waits for them), or on the PChannel when they have no
// VChannel.
func (lockInterceptor) request(op *appendOp) lock.Request {
	m := op.msgs[0]
	l := m.Type().Lock
	if op.whole || l == messages.NoLock && !m.VChannel().IsZero() {
		l = messages.SharedVChannelLock
	}
	return lock.Request{Lock: l, VChannel: m.VChannel()}
}

func (li lockInterceptor) admit(ctx context.Context, w *WAL, op *appendOp) error {
	w.mu.Lock()
	w.lockSeq++
	req := li.request(op)
	req.ID = w.lockSeq
	ok, err := w.locks.Acquire(req)
	if err != nil {
		w.mu.Unlock()
		return err
	}
	var granted chan struct{}
	if !ok {
		granted = make(chan struct{})
		w.granted[req.ID] = granted
	}
	w.mu.Unlock()
	if granted != nil {
		if err := w.awaitLock(ctx, req.ID, granted); err != nil {
			return err
		}
	}
	op.lockID = req.ID
	return nil
}

// awaitLock waits for a queued lock request to be granted.
func (w *WAL) awaitLock(ctx context.Context, id uint64, granted chan struct{}) error {
	select {
	case <-granted:
		return nil
	case <-ctx.Done():
	case <-w.stop:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.locks.Held(id) {
		// Granted as the wait ended: give it back.
		w.wake(w.locks.Release(id))
	} else {
		delete(w.granted, id)
		w.wake(w.locks.Cancel(id))
	}
	if ctx.Err() != nil {
		return streamwal.Errorf(streamwal.CodeResourceBusy, "waited for a conflicting append's lock: %w", ctx.Err())
	}
	return w.stoppedLocked()
}

// wake signals the lock requests a release or cancel let through.
func (w *WAL) wake(ids []uint64, err error) {
	if err != nil {
		w.log.Error().Err(err).Msg("lock table")
		return
	}
	for _, id := range ids {
		if ch, ok := w.granted[id]; ok {
			close(ch)
			delete(w.granted, id)
		}
	}
}

func (lockInterceptor) stamp(*WAL, *appendOp) error { return nil }

func (lockInterceptor) finish(w *WAL, op *appendOp, _ int) {
	w.wake(w.locks.Release(op.lockID))
}

// lifecycleInterceptor enforces the collection and partition lifecycle.
type lifecycleInterceptor struct{}

func (lifecycleInterceptor) admit(context.Context, *WAL, *appendOp) error { return nil }

func (lifecycleInterceptor) stamp(w *WAL, op *appendOp) error {
	for _, m := range op.msgs {
		if err := w.life.Check(m); err != nil {
			return err
		}
	}
	return nil
}

func (lifecycleInterceptor) finish(w *WAL, op *appendOp, index int) {
	if op.stamped <= index {
		return
	}
	switch op.outcome {
	case landed:
		for i, m := range op.msgs {
			if !changesLifecycle(m.Type()) {
				continue
			}
			if err := w.life.Apply(m.Freeze(op.ids[i])); err != nil {
				w.failLocked(streamwal.Errorf(streamwal.CodeUnrecoverable, "%s landed at %d but cannot be applied: %w", m.Type(), op.ids[i], err))
			}
		}
	case unknown:
		for _, m := range op.msgs {
			if changesLifecycle(m.Type()) {
				w.failLocked(streamwal.Errorf(streamwal.CodeUnrecoverable, "outcome of %s on %s is unknown; reopen the wal to learn it", m.Type(), m.VChannel()))
			}
		}
	}
}

// changesLifecycle reports whether a landed message of t changes the
// lifecycle table.
func changesLifecycle(t *messages.Type) bool {
	switch t {
	case messages.TypeCreateCollection, messages.TypeDropCollection, messages.TypeCreatePartition, messages.TypeDropPartition:
		return true
	}
	return false
}
