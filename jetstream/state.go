package jetstream

import (
	"context"
	"errors"
	"fmt"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// StreamState is what a PChannel's log holds.
type StreamState struct {
	// First is the first message the stream keeps: the first at or above
	// the truncation point. The newest RecoveryBarrier, kept below it to
	// fence earlier writers, does not count. With nothing kept, First is
	// Last+1.
	First messages.MessageID
	// Last is the last message stored (0 for a new stream).
	Last messages.MessageID
	// Messages is how many the stream keeps from First to Last.
	Messages uint64
	// ArchivedBelow is the archive's end (Options.Archive): every message
	// stored below it is in the archive. 0 when nothing is archived.
	ArchivedBelow messages.MessageID
}

// maxKeptBarriers bounds the barriers State looks past at the stream's
// start without an archive (Truncate keeps one).
const maxKeptBarriers = 4

// State implements Backend. Without an archive (or before anything was
// archived), the truncation point is found from the stream alone: a
// RecoveryBarrier at the stream's start followed by a gap was kept by
// Truncate below it.
func (b *JetStream) State(ctx context.Context, p streamwal.PChannel) (StreamState, error) {
	if err := b.checkOpen(p); err != nil {
		return StreamState{}, err
	}
	if err := b.ensure(ctx, p); err != nil {
		return StreamState{}, err
	}
	s, err := b.js.Stream(ctx, b.codec.Cluster().StreamName(p))
	if err != nil {
		err = classify(fmt.Errorf("state of %s: %w", p, err))
	}
	if err != nil {
		return StreamState{}, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return StreamState{}, classify(fmt.Errorf("state of %s: %w", p, err))
	}
	st := StreamState{Last: messages.MessageID(info.State.LastSeq)}
	if b.opts.Archive {
		idx, err := b.loadIndex(ctx, p)
		if err != nil {
			return StreamState{}, err
		}
		st.ArchivedBelow = idx.end()
	}
	var below uint64
	if st.ArchivedBelow > 0 {
		st.First, below, err = b.keptFrom(ctx, s, p, info.State, st.ArchivedBelow)
	} else {
		st.First, below, err = b.keptAfterBarriers(ctx, s, p, info.State)
	}
	if err != nil {
		return StreamState{}, err
	}
	st.Messages = info.State.Msgs - below
	return st, nil
}

// keptFrom returns the first message s holds at or above floor and how
// many it holds below.
func (b *JetStream) keptFrom(ctx context.Context, s njs.Stream, p streamwal.PChannel, state njs.StreamState, floor messages.MessageID) (messages.MessageID, uint64, error) {
	if state.Msgs == 0 || uint64(floor) <= state.FirstSeq {
		return b.firstOrEnd(state), 0, nil
	}
	below, err := b.countBelow(ctx, b.codec.Cluster().StreamName(p), state.FirstSeq, uint64(floor))
	if err != nil {
		return 0, 0, err
	}
	first, err := b.nextStored(ctx, s, p, uint64(floor))
	if first == 0 && err == nil {
		first = messages.MessageID(state.LastSeq) + 1
	}
	return first, below, err
}

// keptAfterBarriers returns the first message s holds past the barriers
// kept below a gap at its start, and how many those are.
func (b *JetStream) keptAfterBarriers(ctx context.Context, s njs.Stream, p streamwal.PChannel, state njs.StreamState) (messages.MessageID, uint64, error) {
	first := b.firstOrEnd(state)
	var below uint64
	for ; below < maxKeptBarriers && uint64(first) <= state.LastSeq; below++ {
		raw, err := s.GetMsg(ctx, uint64(first))
		if err != nil {
			return 0, 0, classify(fmt.Errorf("state of %s: %w", p, err))
		}
		if raw.Subject != b.barrierSubject(p) {
			break
		}
		next, err := b.nextStored(ctx, s, p, uint64(first)+1)
		switch {
		case err != nil || next == first+1 || next == 0 && uint64(first) == state.LastSeq:
			return first, below, err
		case next == 0:
			// Only the barrier is left of a stream truncated past it.
			return messages.MessageID(state.LastSeq) + 1, below + 1, nil
		}
		first = next
	}
	return first, below, nil
}

// firstOrEnd is the stream's first sequence, Last+1 when it holds nothing.
func (b *JetStream) firstOrEnd(state njs.StreamState) messages.MessageID {
	if state.Msgs == 0 {
		return messages.MessageID(state.LastSeq) + 1
	}
	return messages.MessageID(state.FirstSeq)
}

// nextStored returns the first sequence at or above seq that s holds (0 if
// none).
func (b *JetStream) nextStored(ctx context.Context, s njs.Stream, p streamwal.PChannel, seq uint64) (messages.MessageID, error) {
	raw, err := s.GetMsg(ctx, seq, njs.WithGetMsgSubject(b.codec.Cluster().StreamSubjects(p)[0]))
	if errors.Is(err, njs.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, classify(fmt.Errorf("state of %s: %w", p, err))
	}
	return messages.MessageID(raw.Sequence), nil
}

// countBelow counts the messages the stream holds from first up to
// floor-1 with direct batch gets: below the archive's end the stream
// keeps only a fencing barrier or two, so one small request answers.
func (b *JetStream) countBelow(ctx context.Context, stream string, first, floor uint64) (uint64, error) {
	var below uint64
	for next := first; next < floor; {
		it, err := jetstreamext.GetBatch(ctx, b.js, stream, maxKeptBarriers+1, jetstreamext.GetBatchSeq(next))
		if err != nil {
			return 0, classify(fmt.Errorf("state of %s: %w", stream, err))
		}
		got := false
		for m, err := range it {
			if errors.Is(err, jetstreamext.ErrNoMessages) {
				break
			}
			if err != nil {
				return 0, classify(fmt.Errorf("state of %s: %w", stream, err))
			}
			got = true
			if m.Sequence >= floor {
				return below, nil
			}
			below++
			next = m.Sequence + 1
		}
		if !got {
			break
		}
	}
	return below, nil
}

// Last returns the MessageID of the last message p's stream holds (0 if
// it holds none or does not exist), from the stream's info alone: no
// consumer, nothing created.
func (b *JetStream) Last(ctx context.Context, p streamwal.PChannel) (messages.MessageID, error) {
	if err := b.checkOpen(p); err != nil {
		return 0, err
	}
	s, err := b.js.Stream(ctx, b.codec.Cluster().StreamName(p))
	if errors.Is(err, njs.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, classify(fmt.Errorf("last message of %s: %w", p, err))
	}
	return messages.MessageID(s.CachedInfo().State.LastSeq), nil
}
