package pipeline

import (
	"strings"
)

// room reports whether the next unit may go out. With group commit, at
// most MaxInFlight units of any kind are in flight, so that the appends
// arriving meanwhile gather into the next unit, or two when a full batch
// waits (it could gather nothing more). Without it, atomic batches are
// bounded by MaxInFlight and messages by MaxInFlightMsgs. A replicated
// stream is different, see replicatedRoom.
func (p *Pipeline[T]) room() bool {
	if len(p.inflight) == 0 {
		return true
	}
	if last := p.inflight[len(p.inflight)-1]; last.Reqs[0].parent != nil {
		// The parts of a request re-sent message by message go one at a
		// time: a stored ID does not grow the stream, which would fail every
		// part pipelined behind it.
		return false
	}
	if p.cfg.Replicas > 1 {
		return p.replicatedRoom()
	}
	if p.cfg.GroupCommit && p.plainTrain() {
		return p.inflightMsgs < p.cfg.MaxInFlightMsgs
	}
	if p.cfg.GroupCommit {
		return len(p.inflight) < p.cfg.MaxInFlight || len(p.inflight) < 2 && p.queuedAtLeast(p.cfg.MaxBatch)
	}
	n := p.queue[0].Len()
	return p.inflightMsgs+n <= p.cfg.MaxInFlightMsgs && (n == 1 || p.inflightBatches < p.cfg.MaxInFlight)
}

// replicatedRoom is room on a replicated stream, where the server refuses
// a second pending expectation on the barrier subject: a fenced unit goes
// out only when no other is in flight, and gathers (with group commit)
// what waited meanwhile; a plain publish of this writer's chain, which
// needs no fence, goes out at once behind it, so that appends that trickle
// in do not wait a whole unit's round trip.
func (p *Pipeline[T]) replicatedRoom() bool {
	_, n := p.unitSize()
	if p.fenced(n, p.lastID) {
		return p.inflightFenced == 0
	}
	return p.inflightMsgs+n <= p.cfg.MaxInFlightMsgs
}

// fenced reports whether a unit of n messages that follows message ID
// after must expect our barrier to be the stream's newest. A plain
// publish of this writer's chain need not: it expects the message ID
// before it, which only this writer stores, so it cannot land after a
// newer owner's barrier. An atomic batch cannot expect a message ID, and
// a caller's message ID may be stored again by a newer owner.
func (p *Pipeline[T]) fenced(n int, after string) bool {
	return n > 1 || !strings.HasPrefix(after, p.cfg.IDPrefix)
}

// unitSize is how many queued requests the next unit takes and how many
// messages they hold: with group commit every queued request up to
// MaxBatch messages, otherwise one; a solo request (retried after a
// duplicate refusal) always goes alone.
func (p *Pipeline[T]) unitSize() (reqs, n int) {
	if p.plainTrain() {
		return 1, 1
	}
	for i, r := range p.queue {
		if i > 0 && (!p.cfg.GroupCommit || r.solo || n+r.Len() > p.cfg.MaxBatch) {
			break
		}
		reqs, n = i+1, n+r.Len()
		if r.solo {
			break
		}
	}
	return reqs, n
}

// plainTrain reports whether, with group commit, the next unit is a plain
// publish of the first queued append although a batch could gather more:
// the load is light (at most PlainUpTo appends queued and in flight, now
// and at the recent sends, every queued append of one message, none to go
// alone), so a batch would pay its fixed staging cost for a handful of
// messages, while plain publishes pipelined one behind the other cost
// only their writes. Under a heavier load units go as batches, which wait
// for the unit in flight and so gather what arrives meanwhile; the recent
// peak keeps a load that arrives in bursts (callers that all wait for the
// same batch, then append again together) from starting each burst with
// a few plain publishes that the batch behind them would wait for.
func (p *Pipeline[T]) plainTrain() bool {
	if !p.cfg.GroupCommit || p.cfg.PlainUpTo <= 0 || max(p.demand, p.inflightMsgs+len(p.queue)) > p.cfg.PlainUpTo {
		return false
	}
	for _, r := range p.queue {
		if r.Len() != 1 || r.solo {
			return false
		}
	}
	return true
}

// queuedAtLeast reports whether the queue holds at least n messages.
func (p *Pipeline[T]) queuedAtLeast(n int) bool {
	for _, r := range p.queue {
		if n -= r.Len(); n <= 0 {
			return true
		}
	}
	return false
}

// reserve takes the next unit (see unitSize) off the queue and reserves
// its place in the stream.
func (p *Pipeline[T]) reserve() *Unit[T] {
	p.demand = max(p.inflightMsgs+len(p.queue), p.demand-(p.demand+7)/8)
	k, n := p.unitSize()
	u := &Unit[T]{Num: p.nextNum, Expect: p.tail, After: p.lastID, N: n}
	u.Reqs = append(u.oneReq[:0], p.queue[:k]...)
	p.queue = p.queue[k:]
	p.nextNum++
	if u.Fenced = p.fenced(u.N, u.After); u.Fenced {
		u.Fence = p.cfg.Barrier
	}
	p.tail += uint64(u.N)
	p.lastID = u.lastID()
	p.push(u)
	return u
}

// quiet reports whether unit u, just reserved, may go out without a reply
// subject: a first-time plain publish followed at once by another one with
// a message ID of this writer. The follower lands only right after u (it
// expects u's message ID and the sequence after u), and it cannot be a
// duplicate, so its ack answers for u as well; if u was refused, the
// follower fails too, and recovery reads what landed. Re-sent requests
// always get their own answer, which is how a refusal of u is learnt.
func (p *Pipeline[T]) quiet(u *Unit[T]) bool {
	if p.quietRun >= maxQuietRun || !u.Reqs[0].fresh() || u.Atomic() || len(p.queue) == 0 {
		return false
	}
	next := p.queue[0]
	return next.fresh() && next.Len() == 1 && strings.HasPrefix(next.ids[0], p.cfg.IDPrefix) && p.room()
}
