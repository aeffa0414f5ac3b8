package client

import (
	"context"
	"sync"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
)

// Txn is a transaction on one VChannel. Its messages are appended in the
// order of the calls that append them; call Commit or Rollback after the
// last Append returned. A Txn is safe for concurrent use, but bodies
// appended concurrently with Commit may or may not make it in.
type Txn struct {
	c  *Client
	v  streamwal.VChannel
	tc messages.TxnContext
	// ctx is the transaction's context, as the hooks made it at its
	// begin (telemetry.TxnHook: a wal.txn span, parent of its messages'
	// appends, ended with the transaction); only its values are used.
	ctx context.Context

	mu    sync.Mutex
	ended error
}

// BeginTxn opens a transaction on v with a keepalive (0: the WAL's default
// of 10 s): it expires when no message of it arrives for that long.
func (c *Client) BeginTxn(ctx context.Context, v streamwal.VChannel, keepalive time.Duration) (*Txn, error) {
	if keepalive == 0 {
		keepalive = messages.DefaultKeepalive
	}
	tctx := c.opts.hooks.OnTxnStart(ctx, telemetry.TxnStartEvent{VChannel: v})
	m, err := c.codec.NewBody(messages.TypeBeginTxn, v, messages.BeginTxnBody{},
		messages.WithTxn(messages.TxnContext{ID: 1, Keepalive: keepalive}))
	if err != nil {
		c.opts.hooks.OnTxnEnd(tctx, telemetry.TxnEndEvent{Err: err})
		return nil, err
	}
	res, err := c.appendOnce(c.opts.hooks.OnTxnAppend(ctx, tctx), m)
	if err == nil && res.Txn == nil {
		err = streamwal.Errorf(streamwal.CodeInternal, "BeginTxn landed without a transaction id")
	}
	if err != nil {
		c.opts.hooks.OnTxnEnd(tctx, telemetry.TxnEndEvent{Err: err})
		return nil, err
	}
	return &Txn{c: c, v: v, tc: *res.Txn, ctx: tctx}, nil
}

// Context is the transaction's ID and keepalive.
func (t *Txn) Context() messages.TxnContext { return t.tc }

// VChannel is the transaction's VChannel.
func (t *Txn) VChannel() streamwal.VChannel { return t.v }

// Append appends body messages (Insert, Delete, Upsert, or application
// types declared as transaction bodies) to the transaction. A failure
// ends the transaction on the node's side; start a new one.
func (t *Txn) Append(ctx context.Context, msgs ...*messages.MutableMessage) ([]AppendResult, error) {
	if err := t.usable(); err != nil {
		return nil, err
	}
	entries := make([]*entry, len(msgs))
	for i, m := range msgs {
		if m == nil || m.VChannel() != t.v || m.MsgID() != "" {
			return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "transaction %d on %s takes body messages of its vchannel without message ids", t.tc.ID, t.v)
		}
		m = m.Clone()
		if err := m.SetTxn(&t.tc); err != nil {
			return nil, err
		}
		e, err := t.c.newEntry(t.c.opts.hooks.OnTxnAppend(ctx, t.ctx), m, false)
		if err != nil {
			return nil, err
		}
		entries[i] = e
	}
	if err := t.c.enqueue(entries...); err != nil {
		return nil, err
	}
	out, err := collect(entries)
	if err != nil {
		// A body that failed (or may have) ends the transaction: the node
		// refuses to commit it, or would commit it without the body.
		t.mu.Lock()
		if t.ended == nil {
			t.ended = streamwal.Errorf(streamwal.CodeTxnInvalidState, "transaction %d: a body failed: %w", t.tc.ID, err)
		}
		t.mu.Unlock()
	}
	return out, err
}

// Commit commits the transaction: readers see it as one Txn message.
func (t *Txn) Commit(ctx context.Context) (AppendResult, error) {
	return t.end(ctx, messages.TypeCommitTxn, messages.CommitTxnBody{})
}

// Rollback rolls the transaction back: readers never see it.
func (t *Txn) Rollback(ctx context.Context) error {
	_, err := t.end(ctx, messages.TypeRollbackTxn, messages.RollbackTxnBody{})
	return err
}

// end appends the CommitTxn or RollbackTxn once.
func (t *Txn) end(ctx context.Context, typ *messages.Type, body any) (AppendResult, error) {
	t.mu.Lock()
	if t.ended != nil {
		err := t.ended
		t.mu.Unlock()
		return AppendResult{}, err
	}
	t.ended = streamwal.Errorf(streamwal.CodeTxnInvalidState, "transaction %d already ended", t.tc.ID)
	t.mu.Unlock()
	m, err := t.c.codec.NewBody(typ, t.v, body, messages.WithTxn(t.tc))
	if err == nil {
		var res AppendResult
		res, err = t.c.appendOnce(t.c.opts.hooks.OnTxnAppend(ctx, t.ctx), m)
		if err == nil {
			t.c.opts.hooks.OnTxnEnd(t.ctx, telemetry.TxnEndEvent{ID: t.tc.ID})
			return res, nil
		}
	}
	t.c.opts.hooks.OnTxnEnd(t.ctx, telemetry.TxnEndEvent{ID: t.tc.ID, Err: err})
	return AppendResult{}, err
}

// usable refuses work on an ended transaction.
func (t *Txn) usable() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ended
}

// appendOnce appends one transaction message, without retries.
func (c *Client) appendOnce(ctx context.Context, m *messages.MutableMessage) (AppendResult, error) {
	e, err := c.newEntry(ctx, m, false)
	if err != nil {
		return AppendResult{}, err
	}
	if err := c.enqueue(e); err != nil {
		return AppendResult{}, err
	}
	out, err := collect([]*entry{e})
	if err != nil {
		return AppendResult{}, err
	}
	return out[0], nil
}
