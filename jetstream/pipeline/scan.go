package pipeline

import (
	"errors"
	"strconv"
	"time"

	"github.com/streamwal/streamwal"
)

// TailMsg is what a recovery needs of one message in the stream's tail.
type TailMsg struct {
	// Seq is its stream sequence, ID its message ID.
	Seq uint64
	ID  string
	// Term is its ownership-term header.
	Term string
	// Barrier: it is a RecoveryBarrier (on the barrier subject).
	Barrier bool
}

// Scan is one reading of the tail a recovery asked for: the shell calls
// Judge for every message from From to the stream's end, in order, then
// EndScan.
type Scan[T any] struct {
	p      *Pipeline[T]
	from   uint64
	refs   map[string]msgRef[T]
	landed map[*Request[T]][]uint64
	// late are requests with a message after a newer barrier: that must
	// never happen, and their callers learn only an unknown outcome.
	late     map[*Request[T]]bool
	lastID   string
	fenced   error
	stranger error
}

// msgRef locates one message of an unresolved request.
type msgRef[T any] struct {
	r *Request[T]
	i int
}

// StartScan begins the reading of the tail, given the stream's last
// sequence. A stream that ends below what this writer had acknowledged
// lost acknowledged writes: that is unrecoverable.
func (p *Pipeline[T]) StartScan(last uint64) (*Scan[T], error) {
	if last < p.acked {
		return nil, streamwal.Errorf(streamwal.CodeUnrecoverable,
			"%s ends at %d but this writer had %d acknowledged: acknowledged writes were lost", p.cfg.PChannel, last, p.acked)
	}
	return &Scan[T]{p: p, from: p.acked + 1, refs: p.unresolved(), landed: map[*Request[T]][]uint64{}, lastID: p.ackedID}, nil
}

// From is the first sequence to read.
func (s *Scan[T]) From() uint64 { return s.from }

// unresolved indexes the message IDs of every in-flight request.
func (p *Pipeline[T]) unresolved() map[string]msgRef[T] {
	refs := map[string]msgRef[T]{}
	for _, u := range p.inflight {
		for _, r := range u.Reqs {
			for i, id := range r.ids {
				refs[id] = msgRef[T]{r: r, i: i}
			}
		}
	}
	return refs
}

// Judge records one message of the tail.
func (s *Scan[T]) Judge(m TailMsg) {
	s.lastID = m.ID
	ref, ours := s.refs[m.ID]
	// A caller's message ID may also be stored by a newer owner (a client
	// retrying there): only a message of this writer's term is ours.
	ours = ours && m.Term == s.p.termText
	switch {
	case ours && s.fenced != nil:
		s.p.ready.Late = append(s.p.ready.Late, m)
		if s.late == nil {
			s.late = map[*Request[T]]bool{}
		}
		s.late[ref.r] = true
	case ours:
		seqs := s.landed[ref.r]
		if seqs == nil {
			seqs = make([]uint64, ref.r.Len())
			s.landed[ref.r] = seqs
		}
		seqs[ref.i] = m.Seq
	case s.fenced != nil || s.stranger != nil:
		// The newer owner's messages; keep looking for ours.
	case m.Barrier:
		term, _ := strconv.ParseUint(m.Term, 10, 64)
		s.fenced = streamwal.Errorf(streamwal.CodeFenced, "%s was opened under term %d (barrier at %d); this writer has term %d",
			s.p.cfg.PChannel, term, m.Seq, s.p.cfg.Term)
	default:
		s.stranger = streamwal.Errorf(streamwal.CodeUnrecoverable, "%s holds message %d (%s) of another writer without a newer barrier",
			s.p.cfg.PChannel, m.Seq, m.ID)
	}
}

// EndScan settles the recovery with what the scan found, the sequence the
// tail ends at, or the error that stopped it (scan may then be nil). A
// newer owner's barrier in the tail fences the writer; a stranger's
// message (no barrier) stops it as unrecoverable; an error the read may
// not meet again is retried after a wait that doubles up to a second.
// When refusals came in a row, sending pauses.
func (p *Pipeline[T]) EndScan(now time.Time, scan *Scan[T], end uint64, err error) {
	if p.phase != scanning || p.fatal != nil {
		return
	}
	if err != nil {
		p.scanFailed(now, err)
		return
	}
	switch {
	case scan.fenced != nil:
		p.settle(scan, scan.fenced)
		p.fatal = scan.fenced
		return
	case scan.stranger != nil:
		p.settle(scan, streamwal.Errorf(streamwal.CodeUnknownOutcome, "the writer stopped: %v", scan.stranger))
		p.fatal = scan.stranger
		return
	}
	p.settle(scan, nil)
	p.tail, p.acked = end, end
	p.ackedID, p.lastID = scan.lastID, scan.lastID
	p.phase = running
	if p.refusals > 0 {
		p.phase, p.resumeAt = pausing, now.Add(min(time.Millisecond<<min(p.refusals, 10), maxDelay))
	}
}

// scanFailed stops the writer on an error no retry cures, and otherwise
// waits before reading the tail again.
func (p *Pipeline[T]) scanFailed(now time.Time, err error) {
	var se *streamwal.Error
	if errors.As(err, &se) && (se.Code == streamwal.CodeFenced || se.Code == streamwal.CodeUnrecoverable) {
		p.fatal = err
		return
	}
	p.phase, p.resumeAt = retrying, now.Add(p.retry)
	p.retry = min(2*p.retry, maxDelay)
}

// settle resolves landed requests and queues the others again, in order.
// When the writer stops (final != nil) the others fail with final instead:
// ErrFenced after a newer barrier (they can never land), an unknown outcome
// otherwise. A request refused for good by the server fails with that
// refusal. A request that landed only in part (possible only when it was
// re-sent message by message) fails with an unknown outcome.
func (p *Pipeline[T]) settle(t *Scan[T], final error) {
	var again []*Request[T]
	for _, u := range p.inflight {
		for _, r := range u.Reqs {
			seqs, ok := t.landed[r]
			switch {
			case t.late[r]:
				p.fail(r, streamwal.Errorf(streamwal.CodeUnknownOutcome, "the append landed after a newer owner's barrier"))
			case ok && allSet(seqs):
				p.resolveEach(r, seqs)
			case ok:
				p.fail(r, streamwal.Errorf(streamwal.CodeUnknownOutcome, "only part of the append landed"))
			case final != nil:
				p.fail(r, final)
			case u.permanent != nil:
				p.fail(r, u.permanent)
			case u.dup && r.Len() > 1 && (r.solo || len(u.Reqs) == 1):
				// Refused alone: re-send message by message, so that each
				// stored ID resolves to its original sequence.
				again = append(again, r.split()...)
			default:
				if u.dup {
					// Refused with others: re-send alone (a single message
					// then goes as a plain publish, which answers a stored
					// ID with its original sequence).
					r.solo = true
				}
				again = append(again, r)
			}
		}
	}
	p.clearInflight()
	p.tail, p.lastID = p.acked, p.ackedID
	p.queue = append(again, p.queue...)
}

// allSet reports whether every message has a sequence.
func allSet(seqs []uint64) bool {
	for _, q := range seqs {
		if q == 0 {
			return false
		}
	}
	return true
}
