package client

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/attribute"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/wire"
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
func (c *Client) Append(ctx context.Context, msgs ...*messages.MutableMessage) ([]AppendResult, error) {
	ctx, span := c.tracer.Start(ctx, "wal.dist_append")
	defer span.End()
	span.SetAttributes(attribute.Int("messages", len(msgs)))
	return c.AppendAsync(ctx, msgs...).Wait()
}

// AppendFuture is an append under way.
type AppendFuture struct {
	entries []*entry
	err     error
}

// AppendAsync starts an append and returns at once, so that one caller
// can keep many appends in flight; Wait returns what Append would. The
// messages of one call are ordered as in Append; separate calls are not
// ordered among themselves.
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
	ctx     context.Context
	m       *messages.MutableMessage
	wm      wire.Message
	size    int  // wireSize of wm
	retry   bool // retried on retriable errors (it has a message ID)
	sent    bool // went out at least once
	backoff *backoff.ExponentialBackOff
	done    chan struct{}
	res     AppendResult
	err     error
}

// finish resolves an entry.
func (e *entry) finish(res AppendResult, err error) {
	e.res, e.err = res, err
	close(e.done)
}

// expired resolves an entry whose caller gave up.
func (e *entry) expired() {
	err := e.ctx.Err()
	if e.sent {
		err = streamwal.Errorf(streamwal.CodeUnknownOutcome, "append of %s in flight when the caller gave up: %w", e.m.MsgID(), err)
	}
	e.finish(AppendResult{}, err)
}

// enqueue hands entries to their PChannels' batchers; the entries of one
// PChannel are queued together, so that they go out in order, in one
// request when they fit.
func (c *Client) enqueue(entries ...*entry) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errClosed()
	}
	groups := map[*batcher][]*entry{}
	var order []*batcher
	for _, e := range entries {
		b := c.batchers[e.m.PChannel()]
		if b == nil {
			b = &batcher{c: c, p: e.m.PChannel()}
			c.batchers[e.m.PChannel()] = b
		}
		if groups[b] == nil {
			order = append(order, b)
		}
		groups[b] = append(groups[b], e)
	}
	c.mu.Unlock()
	for _, b := range order {
		b.enqueue(groups[b]...)
	}
	return nil
}

// batcher coalesces the appends of one PChannel into requests. While a
// request is in flight, queued appends linger (up to the client's linger)
// for company, so that a burst of appends released by one reply goes out
// as one request instead of a first request of one message and a second
// of the rest.
type batcher struct {
	c        *Client
	p        streamwal.PChannel
	mu       sync.Mutex
	queue    []*entry
	weight   int // of the queue, in wireSize bytes
	inflight int
	linger   *time.Timer // armed while queued appends linger
	due      bool        // the linger ran out: send what is queued
	closed   bool
}

// enqueue queues entries and sends what can go.
func (b *batcher) enqueue(entries ...*entry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		for _, e := range entries {
			e.finish(AppendResult{}, errClosed())
		}
		return
	}
	b.queue = append(b.queue, entries...)
	for _, e := range entries {
		b.weight += e.size
	}
	b.kickLocked()
}

// kickLocked sends queued entries while fewer than maxInFlight requests
// are out and the queue may go: nothing is in flight, a batch is full, or
// the linger ran out.
func (b *batcher) kickLocked() {
	o, budget := b.c.opts, b.c.requestBudget()
	for b.inflight < o.maxInFlight && len(b.queue) > 0 {
		full := len(b.queue) >= o.maxBatch || b.weight >= budget
		if b.inflight > 0 && !full && o.linger > 0 && !b.due {
			if b.linger == nil {
				b.linger = time.AfterFunc(o.linger, b.lingered)
			}
			return
		}
		b.due = false
		if b.linger != nil {
			b.linger.Stop()
			b.linger = nil
		}
		batch := b.take(o.maxBatch, budget)
		if len(batch) == 0 {
			return
		}
		b.inflight++
		b.c.wg.Add(1)
		go b.send(batch)
	}
}

// lingered sends what waited for company.
func (b *batcher) lingered() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.linger = nil
	if b.closed {
		return
	}
	b.due = true
	b.kickLocked()
}

// take removes from the head of the queue up to n live entries weighing
// at most budget bytes together (at least one), resolving those whose
// callers gave up.
func (b *batcher) take(n, budget int) []*entry {
	var batch []*entry
	for len(b.queue) > 0 && len(batch) < n {
		e := b.queue[0]
		if e.ctx.Err() != nil {
			b.queue = b.queue[1:]
			b.weight -= e.size
			e.expired()
			continue
		}
		if len(batch) > 0 && e.size > budget {
			break
		}
		b.queue = b.queue[1:]
		b.weight -= e.size
		budget -= e.size
		batch = append(batch, e)
	}
	return batch
}

// send makes one request (or one local call) and settles its entries.
func (b *batcher) send(batch []*entry) {
	defer b.c.wg.Done()
	results, err := b.c.deliver(b.p, batch)
	for i, e := range batch {
		e.sent = true
		r := err
		if r == nil {
			r = results[i].Error.Err()
		}
		if r == nil {
			e.finish(resultOf(results[i]), nil)
			continue
		}
		b.retry(e, r)
	}
	b.mu.Lock()
	b.inflight--
	b.kickLocked()
	b.mu.Unlock()
}

// retry requeues e after a backoff if its error is worth a retry, or
// resolves it with the error.
func (b *batcher) retry(e *entry, err error) {
	if !e.retry {
		e.finish(AppendResult{}, once(err))
		return
	}
	if !streamwal.IsRetriableWithID(err) {
		e.finish(AppendResult{}, err)
		return
	}
	if e.backoff == nil {
		e.backoff = backoff.NewExponentialBackOff()
		e.backoff.InitialInterval = 10 * time.Millisecond
		e.backoff.MaxInterval = b.c.opts.retryMax
	}
	delay := e.backoff.NextBackOff()
	b.c.opts.logger.Debug().Err(err).Str("pchannel", b.p.String()).Dur("backoff", delay).Msg("append retried")
	b.c.wg.Add(1)
	go func() {
		defer b.c.wg.Done()
		if sleep(e.ctx, delay) != nil {
			e.expired()
			return
		}
		b.enqueue(e)
	}()
}

// once is the error of an append that is not retried: a request that
// reached nobody (no responders) wrote nothing and stays retriable, but
// one that timed out may have landed, which only UnknownOutcome says.
func once(err error) error {
	if streamwal.CodeOf(err) == streamwal.CodeUnavailable && !errors.Is(err, nats.ErrNoResponders) {
		return streamwal.Errorf(streamwal.CodeUnknownOutcome, "no answer: %w", err)
	}
	return err
}

// close fails what is queued; what is in flight completes.
func (b *batcher) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.linger != nil {
		b.linger.Stop()
		b.linger = nil
	}
	for _, e := range b.queue {
		e.finish(AppendResult{}, errClosed())
	}
	b.queue, b.weight = nil, 0
}

// deliver appends a batch to p: directly to a WAL served in this process,
// or as one request on p's append subject.
func (c *Client) deliver(p streamwal.PChannel, batch []*entry) ([]wire.AppendResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.timeout)
	defer cancel()
	if c.opts.local {
		if w, ok := node.Local(c.opts.cluster, p); ok {
			msgs := make([]*messages.MutableMessage, len(batch))
			for i, e := range batch {
				msgs[i] = e.m.Clone()
			}
			out, errs := w.AppendMany(ctx, msgs)
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
