package wal

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/lifecycle"
	"github.com/streamwal/streamwal/services/node/lock"
	"github.com/streamwal/streamwal/services/node/shard"
	"github.com/streamwal/streamwal/services/node/timetick"
	"github.com/streamwal/streamwal/services/node/txn"
)

// WAL is the write-ahead log of one PChannel under one term. It is safe
// for concurrent use.
type WAL struct {
	cfg   Config
	codec *messages.Codec
	w     jetstream.Writer
	log   zerolog.Logger
	chain []interceptor

	// mu orders appends: everything below is guarded by it.
	mu       sync.Mutex
	alloc    *timetick.Allocator
	acks     *timetick.AckManager
	floor    messages.TimeTick // every TimeTick handed out is above it
	maxAcked messages.MessageID
	locks    *lock.Table
	lockSeq  uint64
	granted  map[uint64]chan struct{}
	msgIDs   map[string]chan struct{} // caller message IDs in flight: closed once their append resolved
	txns     *txn.Table
	life     *lifecycle.Table
	// repl is what the log says of replication, replicas the replicas in
	// flight, topoChanged closed at the next change of the topology.
	repl        replication
	replicas    inflightReplicas
	topoChanged chan struct{}
	syncer      *timetick.Syncer
	stopped     error // set once the WAL takes no more appends
	recovery    Recovery
	// Recovery storage and shard management (nil when Config.Storage is):
	// the live shard manager, the transactions holding rows of its
	// segments, and the keeper of the storage loop. The ledger of what
	// landed has a mutex of its own (below).
	segs *shard.Manager
	held map[messages.TxnID]struct{}
	st   *keeper
	// replayHolds: the segments each transaction met in replay has rows
	// in (only while the WAL opens).
	replayHolds map[messages.TxnID]map[int64]struct{}

	// lmu guards the ledger (and keeper.persisted): appends feed it once
	// they resolved, outside mu, so that consuming what landed never
	// holds up the ordering of the appends that follow. When both are
	// held, mu is taken first.
	lmu sync.Mutex
	led *ledger

	// inflight counts the appends queued to the writer whose outcome has
	// not reached the ledger yet: the final round waits for it.
	inflight sync.WaitGroup
	// alive ends when Close starts, cutting short an oracle call.
	alive     context.Context
	kill      context.CancelFunc
	stop      chan struct{}
	broken    chan struct{} // closed when the WAL stops for a reason of its own (failLocked)
	loopDone  chan struct{}
	closeOnce sync.Once
}

// PChannel is the channel the WAL writes.
func (w *WAL) PChannel() streamwal.PChannel { return w.cfg.PChannel }

// Term is the ownership term the WAL opened under.
func (w *WAL) Term() uint64 { return w.cfg.Term }

// refusal is the first message of a request refused with an error worth a
// retry.
type refusal struct {
	index int
	err   error
}

// Recovery is what opening a WAL replayed.
type Recovery struct {
	// From is where the replay started (0: the first message, no
	// checkpoint); Checkpoint the consumed position it started from.
	From       messages.MessageID
	Checkpoint messages.MessageID
	// Replayed counts the messages read below the barrier; Txns the
	// transactions still open after them; Skipped the messages of dropped
	// or unknown collections, or of unknown segments, that changed
	// nothing.
	Replayed int
	Txns     int
	Skipped  int
	// Barrier is where the RecoveryBarrier landed.
	Barrier messages.MessageID
	// Took is how long the open took, barrier and replay included.
	Took time.Duration
}

// Recovered describes the replay the WAL ran when it opened.
func (w *WAL) Recovered() Recovery { return w.recovery }

// Barrier is the RecoveryBarrier the WAL appended when it opened.
func (w *WAL) Barrier() *messages.ImmutableMessage { return w.w.Barrier() }

// Err says why the WAL stopped taking appends: nil while it serves,
// streamwal.ErrClosed after Close, streamwal.ErrFenced when a newer owner
// took over, streamwal.ErrUnrecoverable when its state became uncertain.
func (w *WAL) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stoppedLocked()
}

// Done is closed when the WAL stopped serving (closed, fenced or broken).
func (w *WAL) Done() <-chan struct{} { return w.loopDone }

// stoppedLocked is Err under w.mu.
func (w *WAL) stoppedLocked() error {
	if w.stopped != nil {
		return w.stopped
	}
	return w.w.Err()
}

// Append appends one message and returns it as stored: its MessageID,
// TimeTick, LastConfirmedMessageID and, for transaction messages, its
// transaction context (a BeginTxn's carries the TxnID the WAL assigned).
// The message must not be used by the caller afterwards.
//
// BeginTxn opens a transaction on the message's VChannel, with the
// keepalive of the message's transaction context if it has one; body
// messages carry the context (messages.WithTxn); CommitTxn and
// RollbackTxn carry it too and close the transaction.
func (w *WAL) Append(ctx context.Context, m *messages.MutableMessage) (*messages.ImmutableMessage, error) {
	out, err := w.run(ctx, &appendOp{msgs: []*messages.MutableMessage{m}})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// AppendMany appends msgs as independent appends, in the order listed:
// each is admitted and ordered before the next one starts, and all are
// then in flight together; each resolves (releasing its lock) as soon as
// it lands, so a later message may wait for an earlier one's lock. It
// returns, per message, the stored message or why it was not appended.
func (w *WAL) AppendMany(ctx context.Context, msgs []*messages.MutableMessage) ([]*messages.ImmutableMessage, []error) {
	ops := make([]*appendOp, len(msgs))
	for i, m := range msgs {
		ops[i] = &appendOp{msgs: []*messages.MutableMessage{m}}
	}
	stored, errs := w.appendOps(ctx, ops, streamwal.IsRetriableWithID)
	out := make([]*messages.ImmutableMessage, len(msgs))
	for i, s := range stored {
		if s != nil {
			out[i] = s[0]
		}
	}
	return out, errs
}

// AppendUnits is AppendMany of units, each one message or (two or more)
// the messages of a whole transaction: a BeginTxn, its bodies and its
// CommitTxn, on one VChannel, which land together in one atomic batch, as
// AppendTxn's do, but as given (a replicator appends a transaction of its
// source whole this way). Unlike AppendMany, once a unit is refused for
// any reason but streamwal.ErrDuplicate (it landed before) no later one
// starts (each is refused as unavailable): what lands is a prefix of
// units, never one past a refusal. It returns, per
// unit, the stored messages or why the unit was not appended.
func (w *WAL) AppendUnits(ctx context.Context, units [][]*messages.MutableMessage) ([][]*messages.ImmutableMessage, []error) {
	ops := make([]*appendOp, len(units))
	for i, u := range units {
		ops[i] = &appendOp{msgs: u, whole: len(u) > 1}
	}
	return w.appendOps(ctx, ops, func(err error) bool { return !errors.Is(err, streamwal.ErrDuplicate) })
}

// appendOps runs ops as AppendMany describes; a refusal for which stops
// says true stops the ops after it.
func (w *WAL) appendOps(ctx context.Context, ops []*appendOp, stops func(error) bool) ([][]*messages.ImmutableMessage, []error) {
	out := make([][]*messages.ImmutableMessage, len(ops))
	errs := make([]error, len(ops))
	// One waiter settles the started appends in order (they land in
	// order), while this goroutine starts the next ones: a later message
	// waiting for an earlier one's lock is let through as soon as that one
	// is settled, and a thousand appends cost one goroutine, not a thousand
	// contending for the WAL's mutex when their batch lands.
	started := make(chan int, len(ops))
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		for i := range started {
			out[i], errs[i] = w.wait(ctx, ops[i])
		}
	}()
	// Once a message is refused with an error worth a retry, no later one
	// starts: a retry of the refused one must not land above a later one
	// of the same request (a caller's order, see client), so the later
	// ones are refused as retriable too. Final refusals (bad input, the
	// lifecycle) do not stop the request.
	var refused *refusal
	for i := range ops {
		if refused != nil {
			errs[i] = streamwal.Errorf(streamwal.CodeUnavailable, "not started: message %d of the request was refused: %w", refused.index, refused.err)
			continue
		}
		if ops[i], errs[i] = w.startOrWait(ctx, ops[i]); errs[i] == nil {
			started <- i
		} else if stops(errs[i]) {
			refused = &refusal{index: i, err: errs[i]}
		}
	}
	close(started)
	<-settled
	return out, errs
}

// AppendTxn lands a whole transaction on v in one atomic batch: a
// BeginTxn with keepalive (messages.DefaultKeepalive when zero), the body
// messages in order, and a CommitTxn. It returns every message as stored.
func (w *WAL) AppendTxn(ctx context.Context, v streamwal.VChannel, keepalive time.Duration, body ...*messages.MutableMessage) ([]*messages.ImmutableMessage, error) {
	if keepalive == 0 {
		keepalive = messages.DefaultKeepalive
	}
	ka := messages.WithTxn(messages.TxnContext{ID: 1, Keepalive: keepalive})
	begin, err := w.codec.NewBody(messages.TypeBeginTxn, v, messages.BeginTxnBody{}, ka)
	if err != nil {
		return nil, err
	}
	commit, err := w.codec.NewBody(messages.TypeCommitTxn, v, messages.CommitTxnBody{}, ka)
	if err != nil {
		return nil, err
	}
	msgs := append(append([]*messages.MutableMessage{begin}, body...), commit)
	return w.run(ctx, &appendOp{msgs: msgs, whole: true})
}

// BeginTxn opens a transaction on v and returns its context (TxnID and
// keepalive, messages.DefaultKeepalive when zero).
func (w *WAL) BeginTxn(ctx context.Context, v streamwal.VChannel, keepalive time.Duration) (messages.TxnContext, error) {
	if keepalive == 0 {
		keepalive = messages.DefaultKeepalive
	}
	m, err := w.codec.NewBody(messages.TypeBeginTxn, v, messages.BeginTxnBody{},
		messages.WithTxn(messages.TxnContext{ID: 1, Keepalive: keepalive}))
	if err != nil {
		return messages.TxnContext{}, err
	}
	im, err := w.Append(ctx, m)
	if err != nil {
		return messages.TxnContext{}, err
	}
	return *im.Txn(), nil
}

// CommitTxn commits transaction tc on v, once its bodies in flight landed.
func (w *WAL) CommitTxn(ctx context.Context, v streamwal.VChannel, tc messages.TxnContext) (*messages.ImmutableMessage, error) {
	return w.closeTxn(ctx, messages.TypeCommitTxn, messages.CommitTxnBody{}, v, tc)
}

// RollbackTxn rolls transaction tc on v back.
func (w *WAL) RollbackTxn(ctx context.Context, v streamwal.VChannel, tc messages.TxnContext) (*messages.ImmutableMessage, error) {
	return w.closeTxn(ctx, messages.TypeRollbackTxn, messages.RollbackTxnBody{}, v, tc)
}

// closeTxn appends a CommitTxn or RollbackTxn.
func (w *WAL) closeTxn(ctx context.Context, t *messages.Type, body any, v streamwal.VChannel, tc messages.TxnContext) (*messages.ImmutableMessage, error) {
	m, err := w.codec.NewBody(t, v, body, messages.WithTxn(tc))
	if err != nil {
		return nil, err
	}
	return w.Append(ctx, m)
}

// Close stops the WAL: it refuses new appends, lets those in flight
// resolve within a bounded time, stops the sync loop and closes the
// writer. The stream is left as it is, for the next owner.
func (w *WAL) Close() error {
	w.closeOnce.Do(func() {
		w.kill() // first: an oracle call in progress holds the mutex
		w.mu.Lock()
		if w.stopped == nil {
			w.stopped = streamwal.Errorf(streamwal.CodeClosed, "wal of %s (term %d) is closed", w.cfg.PChannel, w.cfg.Term)
		}
		w.mu.Unlock()
		close(w.stop)
		<-w.loopDone
		// The writer resolves what it holds within its own close budget;
		// the appends in flight resolve with it.
		_ = w.w.Close()
		drained := make(chan struct{})
		go func() { w.inflight.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(closeBudget):
			w.log.Warn().Msg("appends still in flight after the close budget")
		}
		w.finalRound()
		if w.segs != nil {
			w.mu.Lock()
			_ = w.segs.Restore(nil, 0) // gives its growing bytes back to the node's memory account
			w.mu.Unlock()
		}
	})
	return nil
}

// fail stops the WAL for a reason of its own (uncertain state).
func (w *WAL) failLocked(err error) {
	if w.stopped == nil {
		w.log.Error().Err(err).Msg("wal stops")
		w.stopped = err
		close(w.broken) // the sync loop ends, and Done with it
	}
}

// Causes of invalid-argument refusals.
var (
	// errAppendsOnly refuses what only the WAL itself may append.
	errAppendsOnly = errors.New("written by the WAL itself")
	// errTxnMsgID refuses a caller message ID on a transaction's
	// messages: they are never retried (a body that may not have landed
	// aborts its transaction), and a deduplicated one would leave the
	// transaction without it.
	errTxnMsgID = errors.New("transaction messages carry no message id")
)
