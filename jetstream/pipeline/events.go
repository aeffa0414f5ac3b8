package pipeline

import (
	"time"

	"github.com/streamwal/streamwal"
)

// Refused records that the client library refused request k of unit u,
// the unit Next returned last, before it left: the request fails with
// err, the unit's other requests go back to the front of the queue, and
// its place in the stream is given back. An unfinished batch is never
// committed, so nothing of it is stored.
func (p *Pipeline[T]) Refused(now time.Time, u *Unit[T], k int, err error) {
	for _, r := range u.Reqs[k+1:] {
		r.sent = r.wasSent // never left
	}
	p.fail(u.Reqs[k], err)
	rest := append(append([]*Request[T](nil), u.Reqs[:k]...), u.Reqs[k+1:]...)
	p.queue = append(rest, p.queue...)
	p.unreserve(now, u)
}

// unreserve gives back the place of unit u, the last reserved, which did
// not go out. If the unit before it went out unanswered, only the tail can
// tell whether it landed.
func (p *Pipeline[T]) unreserve(now time.Time, u *Unit[T]) {
	p.remove(len(p.inflight)-1, len(p.inflight))
	p.tail -= uint64(u.N)
	p.lastID = u.After
	if n := len(p.inflight); n > 0 && p.inflight[n-1].Quiet {
		p.recover(now, streamwal.Errorf(streamwal.CodeUnavailable, "an unanswered unit lost its follower"))
	}
}

// SendFailed records that the connection failed while unit u went out:
// some of it may have left.
func (p *Pipeline[T]) SendFailed(now time.Time, u *Unit[T], err error) {
	if u.failed == nil {
		u.failed = err
	}
	p.recover(now, err)
}

// Ack records the server's answer to a unit: a success resolves it and
// the units before it; anything else starts a recovery.
func (p *Pipeline[T]) Ack(now time.Time, a Ack) {
	err := p.noteAck(a)
	switch {
	case p.phase == draining:
		p.drained(now)
	case err != nil && p.phase == running:
		p.recover(now, err)
	}
}

// noteAck records an answer: a success resolves its unit (and the units
// before it); anything else marks the unit failed and is returned.
func (p *Pipeline[T]) noteAck(a Ack) error {
	i, u := p.find(a.Num)
	if u == nil {
		return nil // a unit already resolved by recovery
	}
	if a.Duplicate && a.Err == nil && !p.landedLate(i, a.Seq) {
		p.duplicate(i, a.Seq)
		return nil
	}
	if a.Duplicate {
		a.Count = 1
	}
	if a.Err == nil && (a.Count != uint64(u.N) || a.Seq != u.Expect+uint64(u.N)) {
		a.Err = streamwal.Errorf(streamwal.CodeInternal, "batch ack %d/%d does not match %d after %d", a.Seq, a.Count, u.N, u.Expect)
	}
	if a.Err != nil {
		p.noteRefusal(u, a)
		return a.Err
	}
	if !p.landed(i) {
		u.failed = streamwal.Errorf(streamwal.CodeInternal, "unit landed after a refused unit")
		return u.failed
	}
	return nil
}

// find returns the in-flight unit of a number.
func (p *Pipeline[T]) find(num uint64) (int, *Unit[T]) {
	for i, u := range p.inflight {
		if u.Num == num {
			return i, u
		}
	}
	return -1, nil
}

// duplicate resolves a plain publish whose message ID was already stored:
// the append is idempotent, so its caller gets the original's sequence. The
// stream did not grow, so the units after it will fail their expected
// sequence and be re-sent by recovery.
func (p *Pipeline[T]) duplicate(i int, seq uint64) {
	u := p.inflight[i]
	p.refusals = 0
	p.resolveEach(u.Reqs[0], []uint64{seq})
	p.remove(i, i+1)
	p.tail--
	if i == len(p.inflight) {
		// Nothing was sent after it: the next unit follows what came before.
		p.lastID = p.ackedID
		if i > 0 {
			p.lastID = p.inflight[i-1].lastID()
		}
	}
}

// landedLate reports whether a plain publish answered as a duplicate of
// a message at seq found an earlier send of its own, which landed after a
// recovery read the tail: the message is the first after everything this
// writer acknowledged, where the unit expected to land, so the stream is
// where the writer expects. Only the first unit in flight can tell: a
// duplicate says nothing of the units before it.
func (p *Pipeline[T]) landedLate(i int, seq uint64) bool {
	return i == 0 && p.inflight[0].Expect == p.acked && seq == p.acked+1
}

// landed resolves the in-flight units up to index i once unit i's ack
// arrived: unit i followed exactly the sequence its predecessors were to
// end at, under this writer's fence, so they landed too.
//
// It reports false, resolving nothing, if a unit before it was refused:
// then only the tail can tell what happened.
func (p *Pipeline[T]) landed(i int) bool {
	for _, u := range p.inflight[:i] {
		if u.failed != nil {
			return false
		}
	}
	p.refusals = 0
	for _, u := range p.inflight[:i+1] {
		p.complete(u, u.Expect+1)
		if end := u.Expect + uint64(u.N); end > p.acked {
			p.acked, p.ackedID = end, u.lastID()
		}
	}
	p.remove(0, i+1)
	// The landing shows where the stream ends: after a duplicate the units
	// behind it may have expected more than the writer's tail counted.
	p.tail = p.acked + uint64(p.inflightMsgs)
	return true
}

// noteRefusal records why the server refused a unit.
func (p *Pipeline[T]) noteRefusal(u *Unit[T], a Ack) {
	u.failed, u.dup = a.Err, a.RefusedDup
	if a.Permanent {
		u.permanent = a.Err
	}
	if !a.RefusedDup && !a.WrongSeq {
		// Duplicate refusals are cured by re-sending differently, and a
		// unit refused for its expected sequence by re-sending after
		// recovery read the tail (a newer owner's barrier there stops the
		// writer as fenced), not by waiting: only the other refusals pause.
		p.refusals++
	}
}

// Tick tells the pipeline the time: an answer overdue starts a recovery,
// a recovery stops waiting for it, a pause or a retry's wait ends.
func (p *Pipeline[T]) Tick(now time.Time) {
	switch p.phase {
	case running:
		for _, u := range p.inflight {
			if now.After(u.deadline) {
				p.recover(now, streamwal.Errorf(streamwal.CodeUnavailable, "batch ack timed out after %v", p.cfg.AckTimeout))
				return
			}
		}
	case draining:
		p.drained(now)
	case retrying:
		if !now.Before(p.resumeAt) {
			p.phase = scanning
		}
	case pausing:
		if !now.Before(p.resumeAt) {
			p.phase = running
		}
	}
}

// Reconnected records that the connection was re-established: the answers
// to what was in flight may have been lost with the old one, and waiting
// for every deadline would stall appends for AckTimeout, so the tail is
// read at once.
func (p *Pipeline[T]) Reconnected(now time.Time) {
	if len(p.inflight) == 0 {
		return
	}
	err := streamwal.Errorf(streamwal.CodeUnavailable, "connection re-established with units in flight")
	for _, u := range p.inflight {
		if u.failed == nil {
			u.failed = err
		}
	}
	if p.phase == running {
		p.recover(now, err)
	} else if p.phase == draining {
		p.drained(now)
	}
}

// Close starts the close: the pipeline keeps resolving what is queued for
// CloseBudget, without the pause or wait a recovery was in.
func (p *Pipeline[T]) Close(now time.Time) {
	if p.closing {
		return
	}
	p.closing, p.closeBy = true, now.Add(p.cfg.CloseBudget)
	switch p.phase {
	case pausing:
		p.phase = running
	case retrying:
		p.phase = scanning
	}
}

// Halt stops the writer with err (the connection closed for good).
func (p *Pipeline[T]) Halt(err error) {
	if p.fatal == nil {
		p.fatal = err
	}
}

// recover starts a recovery: wait for the answers still due, then read
// the tail (NeedScan) and settle every unit in flight against it.
func (p *Pipeline[T]) recover(now time.Time, cause error) {
	p.ready.Recoveries = append(p.ready.Recoveries, cause)
	p.phase, p.retry = draining, firstRetry
	p.drained(now)
}

// due reports whether a recovery waits for unit u's answer until its
// deadline: it was neither refused nor sent quiet.
func (p *Pipeline[T]) due(u *Unit[T]) bool { return u.failed == nil && !u.Quiet }

// drained ends the wait of a recovery once no answer is due: the tail is
// read next, unless the answers resolved every unit.
func (p *Pipeline[T]) drained(now time.Time) {
	for _, u := range p.inflight {
		if p.due(u) && now.Before(u.deadline) {
			return
		}
	}
	if len(p.inflight) == 0 {
		p.phase = running
		return
	}
	p.phase = scanning
}
