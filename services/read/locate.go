package read

import (
	"context"
	"errors"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// Locate finds where a reader starting at TimeTick t must begin: the
// LastConfirmedMessageID of the first message with a TimeTick at or above
// t, so that transactions begun earlier and committed later are assembled
// too. Stream order is TimeTick order, so it binary-searches the stream
// with direct reads (a few round trips, however long the stream) instead
// of reading it from the start. A RecoveryBarrier is skipped over while
// probing: its TimeTick is drawn before an earlier owner's last messages
// may land, so it alone may be out of order. A direct read that finds
// nothing stored (jetstream.ErrNotStored) is truncation, which the search
// steps over; any other failure of the backend is returned as is.
func Locate(ctx context.Context, be jetstream.Backend, p streamwal.PChannel, t messages.TimeTick) (jetstream.StartPosition, error) {
	end, err := be.Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Latest()})
	if err != nil {
		return jetstream.StartPosition{}, err
	}
	last := end.Start().ID
	if err := end.Close(); err != nil {
		return jetstream.StartPosition{}, err
	}
	// Invariant: every message below lo is before t (or gone); hi is the
	// first known at or above t (last+1: none).
	lo, hi := messages.MessageID(1), last+1
	var found *messages.ImmutableMessage
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, gone, err := probe(ctx, be, p, mid, hi)
		if err != nil {
			return jetstream.StartPosition{}, err
		}
		switch {
		case gone:
			lo = mid + 1 // truncated away, and everything below it
		case m == nil:
			hi = mid // only barriers from mid up to hi
		case m.TimeTick() >= t:
			hi, found = mid, m
		default:
			lo = m.ID() + 1
		}
	}
	if found == nil {
		return jetstream.After(last), nil
	}
	return jetstream.From(max(1, min(found.LastConfirmed(), found.ID()))), nil
}

// probe reads the first message at or after id and below hi that is not a
// RecoveryBarrier (nil when there is none); gone reports that id was
// truncated away.
func probe(ctx context.Context, be jetstream.Backend, p streamwal.PChannel, id, hi messages.MessageID) (m *messages.ImmutableMessage, gone bool, err error) {
	for first := id; id < hi; id++ {
		m, err := be.Get(ctx, p, id)
		if errors.Is(err, jetstream.ErrNotStored) && id == first {
			return nil, true, nil
		}
		if err != nil {
			return nil, false, err
		}
		if m.Type() != messages.TypeRecoveryBarrier {
			return m, false, nil
		}
	}
	return nil, false, nil
}
