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
// settles every in-flight unit: landed requests resolve, the others go back
// to the front of the queue. A newer owner's barrier in the tail fences the
// writer: what did not land before it never will. A stranger's message (no
// barrier) stops the writer as unrecoverable. A tail shorter than what was
// acknowledged is unrecoverable.
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
	t := &tailScan{refs: s.unresolved(), landed: map[*AppendFuture][]uint64{}, lastID: s.ackedID}
	last, err = s.scanTail(ctx, last, func(m *njs.RawStreamMsg) error { return s.judge(t, m) })
	if err != nil {
		return err
	}
	switch {
	case t.fenced != nil:
		s.settle(t, t.fenced)
		return t.fenced
	case t.stranger != nil:
		s.settle(t, streamwal.Errorf(streamwal.CodeUnknownOutcome, "the writer stopped: %v", t.stranger))
		return t.stranger
	}
	s.settle(t, nil)
	s.tail, s.acked = last, last
	s.ackedID, s.lastID = t.lastID, t.lastID
	return nil
}

// tailScan is what reading the tail found.
type tailScan struct {
	refs   map[string]msgRef
	landed map[*AppendFuture][]uint64
	// late are requests with a message after a newer barrier: that must
	// never happen, and their callers learn only an unknown outcome.
	late     map[*AppendFuture]bool
	lastID   string
	fenced   error
	stranger error
}

// judge records one message of the tail.
func (s *sequencer) judge(t *tailScan, m *njs.RawStreamMsg) error {
	id := m.Header.Get(nats.MsgIdHdr)
	t.lastID = id
	r, ours := t.refs[id]
	// A caller's message ID may also be stored by a newer owner (a client
	// retrying there): only a message of this writer's term is ours.
	ours = ours && m.Header.Get(messages.HdrTerm) == s.w.termText
	switch {
	case ours && t.fenced != nil:
		s.w.log.Error().Uint64("seq", m.Sequence).Str("msg_id", id).
			Msg("INVARIANT VIOLATED: a message of this writer landed after a newer owner's barrier")
		if t.late == nil {
			t.late = map[*AppendFuture]bool{}
		}
		t.late[r.f] = true
	case ours:
		seqs := t.landed[r.f]
		if seqs == nil {
			seqs = make([]uint64, len(r.f.msgs))
			t.landed[r.f] = seqs
		}
		seqs[r.i] = m.Sequence
	case t.fenced != nil || t.stranger != nil:
		// The newer owner's messages; keep looking for ours.
	case m.Subject == s.w.fenceSubj:
		term, _ := strconv.ParseUint(m.Header.Get(messages.HdrTerm), 10, 64)
		t.fenced = streamwal.Errorf(streamwal.CodeFenced, "%s was opened under term %d (barrier at %d); this writer has term %d",
			s.w.p, term, m.Sequence, s.w.term)
	default:
		t.stranger = streamwal.Errorf(streamwal.CodeUnrecoverable, "%s holds message %d (%s) of another writer without a newer barrier",
			s.w.p, m.Sequence, id)
	}
	return nil
}

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

// scanTail calls fn for every message after s.acked, up to last and beyond
// it until the stream ends: stream info is not isolated from an atomic
// batch's commit and may end inside one, direct gets are. It returns the
// sequence the tail really ends at.
func (s *sequencer) scanTail(ctx context.Context, last uint64, fn func(*njs.RawStreamMsg) error) (uint64, error) {
	end := last
	for from := s.acked + 1; ; {
		it, err := jetstreamext.GetBatch(ctx, s.w.b.js, s.w.stream, tailChunk, jetstreamext.GetBatchSeq(from))
		if err != nil {
			if errors.Is(err, jetstreamext.ErrNoMessages) && from > last {
				return end, nil
			}
			return 0, classify(err)
		}
		got := 0
		for m, err := range it {
			if errors.Is(err, jetstreamext.ErrNoMessages) {
				break
			}
			if err != nil {
				return 0, classify(err)
			}
			if err := fn(m); err != nil {
				return 0, err
			}
			from = m.Sequence + 1
			end = max(end, m.Sequence)
			got++
		}
		if got == 0 {
			if from <= last {
				return 0, streamwal.Errorf(streamwal.CodeUnavailable, "tail of %s from %d is not readable yet", s.w.stream, from)
			}
			return end, nil
		}
	}
}

// settle resolves landed requests and queues the others again, in order.
// When the writer stops (final != nil) the others fail with final instead:
// ErrFenced after a newer barrier (they can never land), an unknown outcome
// otherwise. A request refused for good by the server fails with that
// refusal. A request that landed only in part (possible only when it was
// re-sent message by message) fails with an unknown outcome.
func (s *sequencer) settle(t *tailScan, final error) {
	var again []*AppendFuture
	for _, b := range s.inflight {
		for _, f := range b.reqs {
			seqs, ok := t.landed[f]
			switch {
			case t.late[f]:
				f.fail(streamwal.Errorf(streamwal.CodeUnknownOutcome, "the append landed after a newer owner's barrier"))
			case ok && allSet(seqs):
				f.resolveEach(seqs)
			case ok:
				f.fail(streamwal.Errorf(streamwal.CodeUnknownOutcome, "only part of the append landed"))
			case final != nil:
				f.fail(final)
			case b.permanent != nil:
				f.fail(b.permanent)
			case b.dup && len(f.msgs) > 1 && (f.solo || len(b.reqs) == 1):
				// Refused alone: re-send message by message, so that each
				// stored ID resolves to its original sequence.
				again = append(again, f.split()...)
			default:
				if b.dup {
					// Refused with others: re-send alone (a single message
					// then goes as a plain publish, which answers a stored
					// ID with its original sequence).
					f.solo = true
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
