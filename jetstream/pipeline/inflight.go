package pipeline

import (
	"github.com/streamwal/streamwal"
)

// push adds a sent unit to the in-flight list.
func (p *Pipeline[T]) push(u *Unit[T]) {
	p.inflight = append(p.inflight, u)
	p.inflightMsgs += u.N
	if u.Atomic() {
		p.inflightBatches++
	}
	if u.Fenced {
		p.inflightFenced++
	}
}

// remove drops the in-flight units [from, to). Removing a prefix reslices,
// so resolving acks in order costs O(1) each.
func (p *Pipeline[T]) remove(from, to int) {
	for _, u := range p.inflight[from:to] {
		p.inflightMsgs -= u.N
		if u.Atomic() {
			p.inflightBatches--
		}
		if u.Fenced {
			p.inflightFenced--
		}
	}
	if from == 0 {
		p.inflight = p.inflight[to:]
		return
	}
	p.inflight = append(p.inflight[:from], p.inflight[to:]...)
}

// clearInflight empties the in-flight list.
func (p *Pipeline[T]) clearInflight() {
	p.inflight, p.inflightMsgs, p.inflightBatches, p.inflightFenced = nil, 0, 0, 0
}

// complete resolves a landed unit whose first message is at first.
func (p *Pipeline[T]) complete(u *Unit[T], first uint64) {
	for _, r := range u.Reqs {
		p.resolve(r, first)
		first += uint64(r.Len())
	}
}

// resolve reports that request r's messages are stored from first on.
func (p *Pipeline[T]) resolve(r *Request[T], first uint64) {
	if r.parent != nil {
		p.partResolved(r, first)
		return
	}
	p.ready.Results = append(p.ready.Results, Result[T]{Req: r, First: first})
}

// resolveEach reports that request r's messages are stored at seqs.
func (p *Pipeline[T]) resolveEach(r *Request[T], seqs []uint64) {
	if r.parent != nil {
		p.partResolved(r, seqs[0])
		return
	}
	p.ready.Results = append(p.ready.Results, Result[T]{Req: r, Seqs: seqs})
}

// fail reports that request r failed with err.
func (p *Pipeline[T]) fail(r *Request[T], err error) {
	if r.parent != nil {
		p.partFailed(r.parent, err)
		return
	}
	p.ready.Results = append(p.ready.Results, Result[T]{Req: r, Err: err})
}

// partResolved records that part r is stored at seq; the parent resolves
// with its last part.
func (p *Pipeline[T]) partResolved(r *Request[T], seq uint64) {
	f := r.parent
	if f.settled {
		return
	}
	f.seqs[r.index] = seq
	f.landed = true
	if f.parts--; f.parts == 0 {
		f.settled = true
		p.ready.Results = append(p.ready.Results, Result[T]{Req: f, Seqs: f.seqs})
	}
}

// partFailed fails request f with the first failure of a part. If another
// part already landed, the request is partly written.
func (p *Pipeline[T]) partFailed(f *Request[T], err error) {
	if f.settled {
		return
	}
	f.settled = true
	if f.landed {
		err = streamwal.Errorf(streamwal.CodeUnknownOutcome, "part of the append landed before: %v", err)
	}
	p.ready.Results = append(p.ready.Results, Result[T]{Req: f, Err: err})
}

// Stop fails whatever is left, as the writer stops for reason (Fatal,
// if set, wins): what is in flight, and what went out once and was queued
// again, may still land (an unknown outcome, unless the writer was fenced:
// then it never will); the rest fails with the reason. It returns the
// reason.
func (p *Pipeline[T]) Stop(reason error) error {
	if p.fatal != nil {
		reason = p.fatal
	}
	unknown := streamwal.Errorf(streamwal.CodeUnknownOutcome, "writer stopped before the append was confirmed: %v", reason)
	for _, u := range p.inflight {
		for _, r := range u.Reqs {
			p.fail(r, unknown)
		}
	}
	for _, r := range p.queue {
		if r.sent && streamwal.CodeOf(reason) != streamwal.CodeFenced {
			p.fail(r, unknown)
			continue
		}
		p.fail(r, reason)
	}
	p.clearInflight()
	p.tail, p.lastID = p.acked, p.ackedID
	p.queue = nil
	return reason
}
