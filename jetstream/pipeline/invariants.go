package pipeline

import "fmt"

// CheckInvariants returns what the pipeline's state breaks of the
// invariants the package doc states, or nil. It walks the whole state:
// tests call it after every step, the writer never does.
func (p *Pipeline[T]) CheckInvariants() error {
	for _, check := range []func() error{p.checkCounts, p.checkChain, p.checkOrder, p.checkOnce} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// checkCounts: the in-flight counters count the in-flight list, and a
// replicated stream has one fenced unit in flight at most.
func (p *Pipeline[T]) checkCounts() error {
	msgs, batches, fenced := 0, 0, 0
	for _, u := range p.inflight {
		msgs += u.N
		if u.Atomic() {
			batches++
		}
		if u.Fenced {
			fenced++
		}
	}
	if msgs != p.inflightMsgs || batches != p.inflightBatches || fenced != p.inflightFenced {
		return fmt.Errorf("in flight: %d messages, %d batches, %d fenced counted as %d, %d, %d",
			msgs, batches, fenced, p.inflightMsgs, p.inflightBatches, p.inflightFenced)
	}
	if p.cfg.Replicas > 1 && fenced > 1 {
		return fmt.Errorf("%d fenced units in flight on a replicated stream", fenced)
	}
	return nil
}

// checkChain: the tail is the acknowledged sequence plus the messages in
// flight, the last message ID sent is the last unit's (or the
// acknowledged one), and nothing acknowledged lies below the barrier.
func (p *Pipeline[T]) checkChain() error {
	if p.tail != p.acked+uint64(p.inflightMsgs) {
		return fmt.Errorf("tail %d is not acknowledged %d + %d in flight", p.tail, p.acked, p.inflightMsgs)
	}
	want := p.ackedID
	if n := len(p.inflight); n > 0 {
		want = p.inflight[n-1].lastID()
	}
	if p.lastID != want {
		return fmt.Errorf("last message id %q, the last sent is %q", p.lastID, want)
	}
	if p.acked < p.cfg.Barrier {
		return fmt.Errorf("acknowledged %d is below the barrier %d", p.acked, p.cfg.Barrier)
	}
	return nil
}

// checkOrder: units in flight are numbered in the order they went out,
// each below the next number, and none is empty.
func (p *Pipeline[T]) checkOrder() error {
	for i, u := range p.inflight {
		if u.Num >= p.nextNum || i > 0 && u.Num <= p.inflight[i-1].Num {
			return fmt.Errorf("unit %d at %d is out of order (next %d)", u.Num, i, p.nextNum)
		}
		if u.N == 0 || len(u.Reqs) == 0 {
			return fmt.Errorf("unit %d is empty", u.Num)
		}
	}
	// A unit's expected sequence may be wrong (a duplicate answered before
	// it did not grow the stream, or a late landing did): the server then
	// refuses it, which starts a recovery. So it is no invariant.
	return nil
}

// checkOnce: no request is both queued and in flight, or twice in either.
func (p *Pipeline[T]) checkOnce() error {
	seen := map[*Request[T]]bool{}
	for _, u := range p.inflight {
		for _, r := range u.Reqs {
			if seen[r] {
				return fmt.Errorf("request %v is in flight twice", r.ids)
			}
			seen[r] = true
		}
	}
	for _, r := range p.queue {
		if seen[r] {
			return fmt.Errorf("request %v is queued while in flight or queued", r.ids)
		}
		seen[r] = true
	}
	return nil
}
