package client

import (
	"context"
	"time"

	"github.com/nats-io/nuid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/internal/admit"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// AppendResult is where an appended message landed.
type AppendResult struct {
	ID            messages.MessageID
	TimeTick      messages.TimeTick
	LastConfirmed messages.MessageID
	// Txn is the transaction context of a transaction message (a
	// BeginTxn's carries the TxnID the WAL assigned).
	Txn *messages.TxnContext
}

// Append appends msgs, each to its VChannel (or PChannel), and returns
// where each landed, in order. Messages without a message ID get one.
// Messages of a transaction go through a Txn instead.
//
// The messages of the call land in the order given on each VChannel,
// whatever their number and size and whatever the retries; other calls'
// messages may land between them, and separate calls are not ordered
// among themselves (see Order in the package doc). If the call fails,
// what it stored is in call order too.
func (c *Client) Append(ctx context.Context, msgs ...*messages.MutableMessage) ([]AppendResult, error) {
	ctx = c.opts.hooks.OnAppendCallStart(ctx, telemetry.AppendCallEvent{Messages: msgs})
	res, err := c.AppendAsync(ctx, msgs...).Wait()
	c.opts.hooks.OnAppendCallEnd(ctx, err)
	return res, err
}

// AppendBytes appends each payload to v as one Insert message of one row
// (the common case: the caller's bytes, no partition, no properties), in
// the order given, and
// returns where each landed, as Append does. v's collection must exist
// (CreateCollection); other types and properties go through Codec().New
// and Append.
func (c *Client) AppendBytes(ctx context.Context, v streamwal.VChannel, payloads ...[]byte) ([]AppendResult, error) {
	msgs := make([]*messages.MutableMessage, len(payloads))
	for i, p := range payloads {
		m, err := c.codec.New(messages.TypeInsert, v, p, messages.WithDML(0, 1))
		if err != nil {
			return nil, err
		}
		msgs[i] = m
	}
	return c.Append(ctx, msgs...)
}

// AppendFuture is an append under way.
type AppendFuture struct {
	entries []*entry
	err     error
}

// AppendAsync starts an append and returns at once, so that one caller
// can keep many appends in flight; Wait returns what Append would. While
// the client holds its WithMaxPending bytes (or its
// WithMaxPendingPerPChannel for a PChannel of the call), AppendAsync
// waits for room, up to WithPendingWait or ctx, and then the future fails
// with streamwal.ErrResourceExhausted: the backpressure that keeps the
// client's memory bounded. The
// messages of one call land in the order given on each VChannel, as in
// Append; separate calls are not ordered among themselves, even when one
// starts after the other.
func (c *Client) AppendAsync(ctx context.Context, msgs ...*messages.MutableMessage) *AppendFuture {
	f := &AppendFuture{entries: make([]*entry, len(msgs))}
	for i, m := range msgs {
		e, err := c.newEntry(ctx, m, true)
		if err != nil {
			f.err = err
			return f
		}
		f.entries[i] = e
	}
	f.err = c.enqueue(f.entries...)
	return f
}

// Wait blocks until every message of the append resolved, or its context
// ended, and returns where each landed or the first error.
func (f *AppendFuture) Wait() ([]AppendResult, error) {
	if f.err != nil {
		return nil, f.err
	}
	return collect(f.entries)
}

// newEntry validates and encodes one message for the batchers.
func (c *Client) newEntry(ctx context.Context, m *messages.MutableMessage, retry bool) (*entry, error) {
	if m == nil {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "append of a nil message")
	}
	if retry {
		if m.Txn() != nil || m.Type().Is(messages.FlagTxnControl) {
			return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "%s belongs to a transaction: append it through a Txn", m.Type())
		}
		if m.MsgID() == "" {
			if err := m.SetMsgID("c-" + nuid.Next()); err != nil {
				return nil, err
			}
		}
	}
	nm, err := c.codec.Encode(m)
	if err != nil {
		return nil, err
	}
	c.opts.hooks.OnInject(ctx, m.Type(), nm.Header)
	e := &entry{ctx: ctx, m: m, wm: wire.Message{Subject: nm.Subject, Header: nm.Header, Data: nm.Data},
		retry: retry, done: make(chan struct{})}
	e.size = wireSize(e.wm)
	if limit := c.requestBudget(); e.size > limit {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "message of %d bytes with its headers exceeds the %d bytes a request to a node carries", e.size, limit)
	}
	return e, nil
}

// requestOverhead is what an append request spends beyond its messages'
// subjects, headers and data (framing, lengths), with room to spare.
const requestOverhead = 4 << 10

// requestBudget is how many bytes of messages one append request may
// carry: the connection's maximum payload (NATS's default of 1 MiB while
// the connection has not heard the server's) less the framing.
func (c *Client) requestBudget() int {
	limit := int(c.nc.MaxPayload())
	if limit <= 0 {
		limit = 1 << 20
	}
	return limit - requestOverhead
}

// wireSize is what m weighs in a request, framing aside.
func wireSize(m wire.Message) int {
	n := len(m.Subject) + len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 8
		}
	}
	return n
}

// collect waits for every entry and returns the results or the first
// error.
func collect(entries []*entry) ([]AppendResult, error) {
	out := make([]AppendResult, len(entries))
	var first error
	for i, e := range entries {
		select {
		case <-e.done:
		case <-e.ctx.Done():
			// The request goes on in the background; its result is lost.
			return nil, streamwal.Errorf(streamwal.CodeUnknownOutcome, "append in flight when the caller gave up: %w", e.ctx.Err())
		}
		if e.err != nil && first == nil {
			first = e.err
		}
		out[i] = e.res
	}
	if first != nil {
		return nil, first
	}
	return out, nil
}

// entry is one message on its way.
type entry struct {
	ctx   context.Context
	m     *messages.MutableMessage
	wm    wire.Message
	size  int  // wireSize of wm
	retry bool // retried on retriable errors (it has a message ID)
	sent  bool // went out at least once
	run   *run // the part of its call that goes to its PChannel
	// gate holds charge bytes for the entry, admitted, until it resolves
	// (nil before it is admitted).
	gate   *admit.Gate[streamwal.PChannel]
	charge int64
	// before is where a later entry of its run landed while this one was
	// refused (0: none); landing above it breaks the call's order.
	before messages.MessageID
	done   chan struct{}
	res    AppendResult
	err    error
}

// finish resolves an entry and frees its room in the pending bounds.
func (e *entry) finish(res AppendResult, err error) {
	e.res, e.err = res, err
	e.release()
	close(e.done)
}

// release frees the room the entry held in the pending bounds, once.
func (e *entry) release() {
	if e.gate != nil {
		e.gate.Release(e.m.PChannel(), e.charge)
		e.gate = nil
	}
}

// land resolves an entry that landed at res, unless it landed above a
// later entry of its call: then the call's order is broken, and the caller
// hears it.
func (e *entry) land(res AppendResult) {
	if e.before != 0 && res.ID > e.before {
		e.finish(AppendResult{}, streamwal.Errorf(streamwal.CodeInternal,
			"%s landed at %d, above %d where a later message of its call landed while the node refused this one: the call's order is broken",
			e.m.MsgID(), res.ID, e.before))
		return
	}
	e.finish(res, nil)
}

// bound records that a later entry of e's run landed at id while e was
// refused.
func (e *entry) bound(id messages.MessageID) {
	if id != 0 && (e.before == 0 || id < e.before) {
		e.before = id
	}
}

// expired resolves an entry whose caller gave up.
func (e *entry) expired() {
	err := e.ctx.Err()
	if e.sent {
		err = streamwal.Errorf(streamwal.CodeUnknownOutcome, "append of %s in flight when the caller gave up: %w", e.m.MsgID(), err)
	}
	e.finish(AppendResult{}, err)
}

// deliver appends a batch to p within timeout: directly to a WAL served
// in this process, or as one request on p's append subject.
func (c *Client) deliver(p streamwal.PChannel, batch []*entry, timeout time.Duration) (results []wire.AppendResult, err error) {
	if len(c.opts.hooks) > 0 {
		start := time.Now()
		defer func() { c.noteRequest(p, len(batch), results, err, time.Since(start)) }()
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if c.opts.local != nil {
		msgs := make([]*messages.MutableMessage, len(batch))
		for i, e := range batch {
			msgs[i] = e.m.Clone()
			if parent := e.wm.Header.Get(messages.HdrTraceParent); parent != "" {
				// What the hooks injected, as a request carries it.
				if err := msgs[i].SetTrace(parent, e.wm.Header.Get(messages.HdrTraceState)); err != nil {
					return nil, err
				}
			}
		}
		if out, errs, ok := c.opts.local.AppendLocal(ctx, c.opts.cluster, p, msgs); ok {
			if len(out) != len(batch) || len(errs) != len(batch) {
				return nil, streamwal.Errorf(streamwal.CodeInternal, "local append of %d messages answered %d results", len(batch), len(out))
			}
			results := make([]wire.AppendResult, len(batch))
			for i := range batch {
				results[i] = wire.ResultOf(out[i], errs[i])
			}
			return results, nil
		}
	}
	req := wire.AppendRequest{Messages: make([]wire.Message, len(batch))}
	for i, e := range batch {
		req.Messages[i] = e.wm
	}
	var reply wire.AppendReply
	if err := wire.Call(ctx, c.nc, c.opts.cluster.AppendSubject(p), req, &reply); err != nil {
		return nil, err
	}
	if len(reply.Results) != len(batch) {
		return nil, streamwal.Errorf(streamwal.CodeInternal, "append reply with %d results for %d messages", len(reply.Results), len(batch))
	}
	return reply.Results, nil
}

// resultOf converts a wire result.
func resultOf(r wire.AppendResult) AppendResult {
	out := AppendResult{ID: r.ID, TimeTick: r.TimeTick, LastConfirmed: r.LastConfirmed}
	if r.TxnID != 0 {
		out.Txn = &messages.TxnContext{ID: r.TxnID, Keepalive: r.Keepalive}
	}
	return out
}
