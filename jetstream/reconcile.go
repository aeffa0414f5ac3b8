package jetstream

import (
	"context"
	"errors"
	"strconv"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// tailChunk is how many messages one direct batch get reads.
const tailChunk = 1000

// msgRef locates one message of an unresolved request.
type msgRef struct {
	f *AppendFuture
	i int
}

// reconcile reads the stream from the last resolved sequence to its end and
// settles every in-flight batch: landed batches resolve, the others go back
// to the front of the queue. A newer barrier or a stranger's message in the
// tail fences the writer; a tail shorter than what was acknowledged is
// unrecoverable.
func (s *sequencer) reconcile() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.w.b.opts.AckTimeout)
	defer cancel()
	last, err := s.lastSeq(ctx)
	if err != nil {
		return err
	}
	if last < s.acked {
		return streamwal.Errorf(streamwal.CodeUnrecoverable,
			"stream %s ends at %d but this writer had %d acknowledged: acknowledged writes were lost", s.w.stream, last, s.acked)
	}
	refs := s.unresolved()
	landed := map[*AppendFuture][]uint64{}
	lastID := s.ackedID
	err = s.scanTail(ctx, last, func(m *njs.RawStreamMsg) error {
		lastID = m.Header.Get(nats.MsgIdHdr)
		if r, ok := refs[lastID]; ok {
			seqs := landed[r.f]
			if seqs == nil {
				seqs = make([]uint64, len(r.f.msgs))
				landed[r.f] = seqs
			}
			seqs[r.i] = m.Sequence
			return nil
		}
		return s.stranger(m)
	})
	var fence *fencedError
	switch {
	case errors.As(err, &fence):
		// Nothing of ours lands after a newer barrier: what did not land
		// before it never will.
		s.settle(landed, fence.err)
		return fence.err
	case err != nil:
		return err
	}
	s.settle(landed, nil)
	s.tail, s.acked = last, last
	s.ackedID, s.lastID = lastID, lastID
	return nil
}

// fencedError stops a tail scan at a newer owner's barrier.
type fencedError struct{ err error }

func (e *fencedError) Error() string { return e.err.Error() }

// unresolved indexes the message IDs of every in-flight request.
func (s *sequencer) unresolved() map[string]msgRef {
	refs := map[string]msgRef{}
	for _, b := range s.inflight {
		for _, f := range b.reqs {
			for i, id := range f.ids {
				refs[id] = msgRef{f: f, i: i}
			}
		}
	}
	return refs
}

// scanTail calls fn for every message after s.acked up to last.
func (s *sequencer) scanTail(ctx context.Context, last uint64, fn func(*njs.RawStreamMsg) error) error {
	for from := s.acked + 1; from <= last; {
		n := int(min(uint64(tailChunk), last-from+1))
		it, err := jetstreamext.GetBatch(ctx, s.w.b.js, s.w.stream, n, jetstreamext.GetBatchSeq(from))
		if err != nil {
			return classify(err)
		}
		got := 0
		for m, err := range it {
			if errors.Is(err, jetstreamext.ErrNoMessages) {
				break
			}
			if err != nil {
				return classify(err)
			}
			if m.Sequence > last {
				break
			}
			if err := fn(m); err != nil {
				return err
			}
			from = m.Sequence + 1
			got++
		}
		if got == 0 {
			return streamwal.Errorf(streamwal.CodeUnavailable, "tail of %s from %d is not readable yet", s.w.stream, from)
		}
	}
	return nil
}

// stranger judges a message in the tail that is not ours: a barrier of a
// newer term fences us; anything else means another writer shares the
// stream, which fences us too rather than interleave with it.
func (s *sequencer) stranger(m *njs.RawStreamMsg) error {
	if m.Subject == s.w.fenceSubj {
		term, _ := strconv.ParseUint(m.Header.Get(messages.HdrTerm), 10, 64)
		return &fencedError{streamwal.Errorf(streamwal.CodeFenced, "%s was opened under term %d (barrier at %d); this writer has term %d",
			s.w.p, term, m.Sequence, s.w.term)}
	}
	return streamwal.Errorf(streamwal.CodeFenced, "%s holds message %d (%s) of another writer; stopping",
		s.w.p, m.Sequence, m.Header.Get(nats.MsgIdHdr))
}

// settle resolves landed requests and queues the others again, in order;
// when the writer is fenced (fenced != nil) the others fail with it instead.
// A request that landed only in part (possible only when it was re-sent
// message by message) fails with an unknown outcome.
func (s *sequencer) settle(landed map[*AppendFuture][]uint64, fenced error) {
	var again []*AppendFuture
	for _, b := range s.inflight {
		for _, f := range b.reqs {
			seqs, ok := landed[f]
			switch {
			case ok && allSet(seqs):
				f.resolveEach(seqs)
				delete(s.solo, f)
			case ok:
				f.fail(streamwal.Errorf(streamwal.CodeUnknownOutcome, "only part of the append landed"))
				delete(s.solo, f)
			case fenced != nil:
				f.fail(fenced)
			case b.dup && s.solo[f] && len(f.msgs) > 1:
				// Refused alone: re-send message by message, so that each
				// stored ID resolves to its original sequence.
				delete(s.solo, f)
				for _, p := range f.split() {
					s.solo[p] = true
					again = append(again, p)
				}
			default:
				if b.dup {
					// Refused with others: re-send alone (a single message
					// then goes as a plain publish, which answers a stored
					// ID with its original sequence).
					s.solo[f] = true
				}
				again = append(again, f)
			}
		}
	}
	s.clearInflight()
	s.queue = append(again, s.queue...)
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
