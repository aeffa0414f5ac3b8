package read

import (
	"context"
	"fmt"
	"io"
	"iter"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// Start is where a scanner starts: a position in the stream, or the
// first message with a TimeTick at or above TimeTick.
type Start struct {
	// Position is where the backend starts reading (ignored when TimeTick
	// is set).
	Position jetstream.StartPosition
	// TimeTick, when set, starts at the first message with a TimeTick at
	// or above it, found by a binary search of the stream.
	TimeTick messages.TimeTick
}

// Earliest starts at the first message in the stream.
func Earliest() Start { return Start{Position: jetstream.Earliest()} }

// Latest delivers only messages appended after the scanner opened.
func Latest() Start { return Start{Position: jetstream.Latest()} }

// From starts at id, inclusive.
func From(id messages.MessageID) Start { return Start{Position: jetstream.From(id)} }

// After starts right after id.
func After(id messages.MessageID) Start { return Start{Position: jetstream.After(id)} }

// AtTimeTick starts at the first message with a TimeTick at or above t.
func AtTimeTick(t messages.TimeTick) Start { return Start{TimeTick: t} }

// Options configure a Scanner.
type Options struct {
	// Backend holds the stream; Codec decodes live ticks. Both required.
	Backend jetstream.Backend
	Codec   *messages.Codec
	// Ticks, if set, receives the PChannel's live ticks, so that the
	// watermark advances while nothing is appended.
	Ticks *nats.Conn
	// PChannel is the channel read; VChannel, if set, narrows the scanner
	// to one of its VChannels (plus the PChannel-level messages).
	PChannel streamwal.PChannel
	VChannel streamwal.VChannel
	// Start is where to start; Types the types to deliver (see Filter).
	Start Start
	Types []*messages.Type
	// MinTimeTick drops messages with a smaller TimeTick. Start a scanner
	// at a message's LastConfirmedMessageID with MinTimeTick at its
	// TimeTick to read exactly what follows it in TimeTick order.
	MinTimeTick messages.TimeTick
	// Until, if set, ends the scanner once it has read the message of
	// that ID (or one above it): Next then returns io.EOF. A reader that
	// sets it to the last message of its filters as of its start reads
	// what is there and returns (see the client's ReadOptions.UntilNow).
	// Transactions still open there are not delivered.
	Until messages.MessageID
}

// Scanner delivers one PChannel or VChannel in TimeTick order, with
// transactions assembled. It is safe for concurrent use, though messages
// come out of one Next at a time.
type Scanner struct {
	sc    jetstream.Scanner
	sub   *nats.Subscription
	next  sync.Mutex // serializes Next
	mu    sync.Mutex // guards asm
	asm   *Assembler
	until messages.MessageID // 0: unbounded
}

// Open starts a scanner. A failure of the backend, in opening its scanner
// or in locating a TimeTick start, is returned as is, with nothing left
// open.
func Open(ctx context.Context, o Options) (*Scanner, error) {
	if o.Backend == nil || o.Codec == nil || o.PChannel.IsZero() {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "read needs a backend, a codec and a pchannel")
	}
	if !o.VChannel.IsZero() && o.VChannel.PChannel() != o.PChannel {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "vchannel %s is not on %s", o.VChannel, o.PChannel)
	}
	start := o.Start.Position
	var err error
	if o.Start.TimeTick != 0 {
		if start, err = Locate(ctx, o.Backend, o.PChannel, o.Start.TimeTick); err != nil {
			return nil, err
		}
	}
	s := &Scanner{asm: NewAssembler(Filter{Types: o.Types, From: max(o.MinTimeTick, o.Start.TimeTick)}), until: o.Until}
	if o.Ticks != nil {
		if s.sub, err = s.subscribeTicks(o); err != nil {
			return nil, err
		}
	}
	s.sc, err = o.Backend.Read(ctx, o.PChannel, jetstream.ReadOptions{Start: start, Filters: filters(o)})
	if err != nil {
		s.unsubscribe()
		return nil, err
	}
	s.mu.Lock()
	switch st := s.sc.Start(); st.Kind {
	case jetstream.StartAfter:
		s.asm.StartAfter(st.ID)
	case jetstream.StartFrom:
		s.asm.StartAfter(st.ID - 1)
	}
	s.mu.Unlock()
	return s, nil
}

// filters are the subject filters of o: every message of the PChannel, or
// one VChannel's plus the PChannel-level ones.
func filters(o Options) []string {
	if o.VChannel.IsZero() {
		return nil
	}
	return o.Codec.Cluster().VChannelFilter(o.VChannel)
}

// subscribeTicks feeds the PChannel's live ticks to the assembler.
func (s *Scanner) subscribeTicks(o Options) (*nats.Subscription, error) {
	sub, err := o.Ticks.Subscribe(o.Codec.Cluster().LiveTickSubject(o.PChannel), func(m *nats.Msg) {
		t, err := o.Codec.DecodeLiveTick(m)
		if err != nil || t.PChannel != o.PChannel {
			return
		}
		s.mu.Lock()
		s.asm.PushTick(t)
		s.mu.Unlock()
	})
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "subscribe to live ticks of %s: %w", o.PChannel, err)
	}
	return sub, nil
}

// Next blocks for the next message, until ctx ends or the scanner is
// closed (streamwal.ErrClosed); past Options.Until it returns io.EOF,
// without reading the backend. A failure of the backend's read is
// returned as is and changes neither Last nor Watermark.
func (s *Scanner) Next(ctx context.Context) (*messages.ImmutableMessage, error) {
	s.next.Lock()
	defer s.next.Unlock()
	for {
		if s.ended() {
			return nil, io.EOF
		}
		m, err := s.sc.Next(ctx)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		out := s.asm.Push(m)
		s.mu.Unlock()
		if out != nil {
			return out, nil
		}
	}
}

// ended reports whether the scanner read through Options.Until.
func (s *Scanner) ended() bool {
	if s.until == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asm.Last() >= s.until
}

// Last is the MessageID of the last message the scanner read from the
// stream, delivered or not (or the position before its start).
func (s *Scanner) Last() messages.MessageID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asm.Last()
}

// All iterates until ctx ends, the scanner closes or an error occurs; the
// error, if any, is the last pair.
func (s *Scanner) All(ctx context.Context) iter.Seq2[*messages.ImmutableMessage, error] {
	return func(yield func(*messages.ImmutableMessage, error) bool) {
		for {
			m, err := s.Next(ctx)
			if !yield(m, err) || err != nil {
				return
			}
		}
	}
}

// Watermark is the largest TimeTick the scanner knows complete: every
// message with a TimeTick at or below it has been read.
func (s *Scanner) Watermark() messages.TimeTick {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asm.Watermark()
}

// Close stops the scanner.
func (s *Scanner) Close() error {
	s.unsubscribe()
	if err := s.sc.Close(); err != nil {
		return fmt.Errorf("close scanner: %w", err)
	}
	return nil
}

// unsubscribe stops the live ticks.
func (s *Scanner) unsubscribe() {
	if s.sub != nil {
		_ = s.sub.Unsubscribe()
	}
}
