package client

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/internal/admit"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// enqueue hands entries to their PChannels' batchers once the client's
// pending bounds have room for them (see admit): the entries of one
// PChannel become one run, which goes out in order (see batcher).
func (c *Client) enqueue(entries ...*entry) error {
	if err := c.admit(entries); err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		for _, e := range entries {
			e.release()
		}
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
		b.enqueue(groups[b])
	}
	return nil
}

// entryOverhead is what the client keeps of an entry beyond its size in
// a request (the entry, its message, their headers), roughly, as the
// pending bounds count it.
const entryOverhead = 1 << 10

// admit waits, within the pending wait and the call's context, until the
// client's pending bounds have room for the entries of one call (whole),
// and charges each entry, until it resolves, to its PChannel.
func (c *Client) admit(entries []*entry) error {
	if len(entries) == 0 {
		return nil
	}
	var one [1]admit.Claim[streamwal.PChannel]
	claims := one[:0]
	for _, e := range entries {
		e.charge = int64(e.size + entryOverhead)
		i := slices.IndexFunc(claims, func(c admit.Claim[streamwal.PChannel]) bool { return c.Key == e.m.PChannel() })
		if i < 0 {
			claims = append(claims, admit.Claim[streamwal.PChannel]{Key: e.m.PChannel()})
			i = len(claims) - 1
		}
		claims[i].Weight += e.charge
	}
	if err := c.pending.Acquire(entries[0].ctx, c.opts.pendingWait, claims...); err != nil {
		return streamwal.Errorf(streamwal.CodeResourceExhausted, "append of %d messages: the client holds too much not yet answered: %w", len(entries), err)
	}
	for _, e := range entries {
		e.gate = c.pending
	}
	return nil
}

// run is the part of one call that goes to one PChannel. Its entries go
// out in call order, and only one request at a time carries any of them:
// the node handles concurrent requests concurrently, so two requests in
// flight may land in either order.
type run struct {
	// pending are the entries still to send (again), in call order.
	pending []*entry
	// failed is set once an entry failed for good: what was never sent
	// is not sent.
	failed error
}

// batcher coalesces the appends of one PChannel into requests. Runs wait
// in arrival order; a request takes the head entries of the runs at the
// head, and a run with entries in a request waits out of the queue until
// that request is settled, then goes back to the head of the queue with
// what it has left (its retries first). While a request is in flight,
// queued appends linger (up to the client's linger) for company, so that
// a burst of appends released by one reply goes out as one request
// instead of a first request of one message and a second of the rest.
//
// A request that leaves entries to retry makes the whole batcher wait one
// backoff, which grows with consecutive failures and starts over after a
// request that landed whole: the retries go out together, in order, ahead
// of what was queued since. A request that timed out stretches the
// timeout of the next ones (see patienceLocked).
type batcher struct {
	c        *Client
	p        streamwal.PChannel
	mu       sync.Mutex
	ready    []*run // runs with entries to send and none in flight, oldest first
	queued   int    // entries of the ready runs
	weight   int    // of those entries, in wireSize bytes
	inflight int
	linger   *time.Timer // armed while queued appends linger
	due      bool        // the linger ran out: send what is queued
	backoff  *backoff.ExponentialBackOff
	pause    *time.Timer   // armed while the batcher waits to retry
	patience time.Duration // a request's timeout (0: the client's), see patienceLocked
	closed   bool
}

// enqueue queues the entries of one call as a run and sends what can go.
func (b *batcher) enqueue(entries []*entry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		for _, e := range entries {
			e.finish(AppendResult{}, errClosed())
		}
		return
	}
	r := &run{pending: entries}
	for _, e := range entries {
		e.run = r
	}
	b.ready = append(b.ready, r)
	b.count(entries, 1)
	b.kickLocked()
}

// count adds (sign 1) or removes (-1) entries to the ready tallies.
func (b *batcher) count(entries []*entry, sign int) {
	for _, e := range entries {
		b.weight += sign * e.size
	}
	b.queued += sign * len(entries)
}

// kickLocked sends queued entries while fewer than maxInFlight requests
// are out, no retry is waited for, and the queue may go: nothing is in
// flight, a batch is full, or the linger ran out.
func (b *batcher) kickLocked() {
	o, budget := b.c.opts, b.c.requestBudget()
	for b.inflight < o.maxInFlight && b.queued > 0 && b.pause == nil {
		full := b.queued >= o.maxBatch || b.weight >= budget
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
		go b.send(batch, b.timeoutLocked())
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

// take builds a request of up to n live entries weighing at most budget
// bytes together (at least one) from the runs at the head of the queue,
// resolving the runs whose callers gave up.
func (b *batcher) take(n, budget int) []*entry {
	var batch []*entry
	for len(b.ready) > 0 && len(batch) < n {
		var more bool
		if batch, budget, more = b.takeRun(batch, n, budget); !more {
			break
		}
	}
	return batch
}

// takeRun moves the head entries of the first ready run into batch while
// they fit, and takes the run off the queue: what is left of it waits
// for the request. It reports false when not even the run's first entry
// fits.
func (b *batcher) takeRun(batch []*entry, n, budget int) ([]*entry, int, bool) {
	r := b.ready[0]
	if r.pending[0].ctx.Err() != nil {
		// One call, one context: the whole run is given up.
		b.ready = b.ready[1:]
		b.count(r.pending, -1)
		for _, e := range r.pending {
			e.expired()
		}
		return batch, budget, true
	}
	k := 0
	for k < len(r.pending) && len(batch) < n {
		e := r.pending[k]
		if len(batch) > 0 && e.size > budget {
			break
		}
		budget -= e.size
		batch = append(batch, e)
		k++
	}
	if k == 0 {
		return batch, budget, false
	}
	b.ready = b.ready[1:]
	b.count(r.pending, -1)
	r.pending = r.pending[k:]
	return batch, budget, true
}

// send makes one request (or one local call) within timeout, settles its
// entries and puts their runs back in the queue.
func (b *batcher) send(batch []*entry, timeout time.Duration) {
	defer b.c.wg.Done()
	results, err := b.c.deliver(b.p, batch, timeout)
	back, cause := settle(batch, outcomes(batch, results, err))
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight--
	b.patienceLocked(err, cause)
	b.requeueLocked(back)
	b.retryLaterLocked(cause, back)
	b.kickLocked()
}

// maxPatience bounds how far timeouts stretch the timeout of requests, in
// multiples of the client's.
const maxPatience = 4

// timeoutLocked is the timeout of the next request.
func (b *batcher) timeoutLocked() time.Duration {
	if b.patience == 0 {
		return b.c.opts.timeout
	}
	return b.patience
}

// patienceLocked adapts the timeout of requests to how the last one
// ended (err, and cause for what it left to retry). One that timed out
// was most likely still at work on the node (a stalled link, a backlog
// of retries): the next requests, which carry its messages again, get
// twice as long (up to maxPatience times the client's timeout) instead
// of adding one more copy to the node's work every timeout. Only a
// request that left nothing to retry brings the client's timeout back: an
// answer that refuses messages as still in flight on the node says the
// node is still at work on them.
func (b *batcher) patienceLocked(err, cause error) {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		b.patience = min(2*b.timeoutLocked(), maxPatience*b.c.opts.timeout)
	case cause == nil:
		b.patience = 0
	}
}

// outcome is what a request said of one of its entries.
type outcome struct {
	res AppendResult
	err error
}

// outcomes pairs a request's entries with their results, or with the
// request's error.
func outcomes(batch []*entry, results []wire.AppendResult, err error) []outcome {
	out := make([]outcome, len(batch))
	for i := range batch {
		if err != nil {
			out[i].err = err
			continue
		}
		if out[i].err = results[i].Error.Err(); out[i].err == nil {
			out[i].res = resultOf(results[i])
		}
	}
	return out
}

// settle resolves what a request decided and returns the runs with
// entries left to send, and an error worth a retry if there was one. The
// entries of one run are adjacent in a request.
func settle(batch []*entry, outs []outcome) (back []*run, cause error) {
	for start := 0; start < len(batch); {
		r, end := batch[start].run, start+1
		for end < len(batch) && batch[end].run == r {
			end++
		}
		if err := settleRun(r, batch[start:end], outs[start:end]); err != nil {
			cause = err
		}
		if len(r.pending) > 0 {
			back = append(back, r)
		}
		start = end
	}
	return back, cause
}

// settleRun settles the entries of run r that went out in one request:
// those that landed are resolved, those refused for good fail (and with
// them what r never sent), and those worth a retry go back to the head of
// r, in order. A refused entry followed by a later one that landed is
// bound to land below it: a retry of what landed meanwhile (an earlier
// attempt, still in flight at the node when this one was refused) returns
// the stored message, which lies below; a fresh landing there would break
// the call's order, and the entry fails instead (see entry.land). It
// returns an error worth a retry, if an entry had one.
func settleRun(r *run, seg []*entry, outs []outcome) (cause error) {
	var again []*entry
	var next messages.MessageID // where the nearest later entry landed
	for i := len(seg) - 1; i >= 0; i-- {
		e, o := seg[i], outs[i]
		e.sent = true
		switch {
		case o.err == nil:
			e.land(o.res)
			next = o.res.ID
		case e.retry && streamwal.IsRetriableWithID(o.err):
			e.bound(next)
			again = append(again, e)
			cause = o.err
		default:
			if !e.retry {
				o.err = once(o.err)
			}
			e.finish(AppendResult{}, o.err)
			r.failed = o.err
		}
	}
	if r.failed != nil {
		abort(r.pending, r.failed)
		r.pending = nil
	}
	slices.Reverse(again)
	r.pending = append(again, r.pending...)
	return cause
}

// abort fails entries never sent because an earlier entry of their call
// failed for good.
func abort(entries []*entry, cause error) {
	for _, e := range entries {
		e.finish(AppendResult{}, streamwal.Errorf(streamwal.CodeOf(cause), "not sent: an earlier message of the call failed: %w", cause))
	}
}

// requeueLocked puts runs with entries left at the head of the queue, in
// order: they are older than anything queued since. After Close their
// entries fail instead.
func (b *batcher) requeueLocked(back []*run) {
	if b.closed {
		for _, r := range back {
			for _, e := range r.pending {
				e.finish(AppendResult{}, errClosed())
			}
		}
		return
	}
	if len(back) == 0 {
		return
	}
	for _, r := range back {
		b.count(r.pending, 1)
	}
	b.ready = append(back, b.ready...)
}

// retryLaterLocked starts the batcher's backoff after a request that left
// entries to retry (cause), or resets it after one that did not.
func (b *batcher) retryLaterLocked(cause error, back []*run) {
	if cause == nil {
		if b.backoff != nil {
			b.backoff.Reset()
		}
		return
	}
	if b.closed || b.pause != nil {
		return
	}
	if b.backoff == nil {
		b.backoff = backoff.NewExponentialBackOff()
		b.backoff.InitialInterval = 10 * time.Millisecond
		b.backoff.MaxInterval = b.c.opts.retryMax
	}
	delay := b.backoff.NextBackOff()
	b.c.opts.logger.Debug().Err(cause).Str("pchannel", b.p.String()).Int("calls", len(back)).
		Dur("backoff", delay).Msg("append retried")
	b.pause = time.AfterFunc(delay, b.resume)
}

// resume sends again once the backoff ran out.
func (b *batcher) resume() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pause = nil
	if !b.closed {
		b.kickLocked()
	}
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

// close fails what is queued; what is in flight completes, and what its
// calls have left then fails too.
func (b *batcher) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for _, t := range []*time.Timer{b.linger, b.pause} {
		if t != nil {
			t.Stop()
		}
	}
	b.linger, b.pause = nil, nil
	for _, r := range b.ready {
		for _, e := range r.pending {
			e.finish(AppendResult{}, errClosed())
		}
	}
	b.ready, b.queued, b.weight = nil, 0, 0
}
