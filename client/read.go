package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"slices"
	"strconv"
	"sync"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
	"github.com/streamwal/streamwal/telemetry"
)

// Start is where a read (or a new durable subscription) starts: Earliest,
// Latest, From, After, AtTimeTick or AtTime. The zero Start is Earliest.
type Start struct{ s read.Start }

// Earliest starts at the first message of the log (in the archive, when
// the stream was truncated).
func Earliest() Start { return Start{read.Earliest()} }

// Latest delivers only messages appended after the read opened.
func Latest() Start { return Start{read.Latest()} }

// From starts at the message id, inclusive.
func From(id messages.MessageID) Start { return Start{read.From(id)} }

// After starts right after the message id.
func After(id messages.MessageID) Start { return Start{read.After(id)} }

// AtTimeTick starts at the first message with a TimeTick at or above t,
// from its LastConfirmedMessageID, so that transactions begun before it
// and committed after it are delivered whole.
func AtTimeTick(t messages.TimeTick) Start { return Start{read.AtTimeTick(t)} }

// AtTime starts at the first message appended at or after t (by its
// TimeTick's physical time).
func AtTime(t time.Time) Start { return AtTimeTick(max(messages.TimeTickAt(t), 1)) }

// ReadOptions say what to read.
type ReadOptions struct {
	// VChannel is read with the PChannel-level messages of its PChannel;
	// when zero, PChannel is read whole.
	VChannel streamwal.VChannel
	PChannel streamwal.PChannel
	// Start is where to start (Earliest by default).
	Start Start
	// Types are the types to deliver; empty means every type but the
	// WAL's own (TimeTick, RecoveryBarrier) and the transaction control
	// messages, which arrive assembled as one Txn. A Txn is delivered
	// when TypeTxn or the type of one of its bodies is listed.
	Types []*messages.Type
	// MinTimeTick drops messages with a smaller TimeTick.
	MinTimeTick messages.TimeTick
	// UntilNow ends the read at the tail of the log as of the start of
	// the read: Next returns io.EOF, and All ends, once every message
	// that was there has been read. Transactions still open at that
	// point are not delivered.
	UntilNow bool
}

// Scanner delivers one PChannel or VChannel in TimeTick order, with
// transactions assembled. It is safe for concurrent use, though messages
// come out of one Next at a time.
type Scanner struct {
	s     *read.Scanner
	empty bool // UntilNow with nothing to read
	// hooks are told of each message read (telemetry.ConsumeHook).
	hooks telemetry.Hooks
}

// Read opens a scanner straight on JetStream: messages in TimeTick order
// with transactions assembled, a visibility watermark, and All for a Go
// iterator. Close it when done.
func (c *Client) Read(ctx context.Context, o ReadOptions) (*Scanner, error) {
	ro, err := c.readOptions(o.VChannel, o.PChannel, o.Start, o.Types, o.MinTimeTick)
	if err != nil {
		return nil, err
	}
	if o.UntilNow {
		if ro.Until, err = c.tailOf(ctx, ro); err != nil {
			return nil, err
		}
		if ro.Until == 0 {
			return &Scanner{empty: true}, nil
		}
	}
	s, err := read.Open(ctx, ro)
	if err != nil {
		return nil, err
	}
	return &Scanner{s: s, hooks: c.opts.hooks}, nil
}

// readOptions are the read pipeline's options for a read of v (or p).
func (c *Client) readOptions(v streamwal.VChannel, p streamwal.PChannel, start Start, types []*messages.Type, minTT messages.TimeTick) (read.Options, error) {
	if !v.IsZero() {
		if !p.IsZero() && p != v.PChannel() {
			return read.Options{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "vchannel %s is not on %s", v, p)
		}
		p = v.PChannel()
	}
	if p.IsZero() {
		return read.Options{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "read of no vchannel and no pchannel")
	}
	return read.Options{Backend: c.backend, Codec: c.codec, Ticks: c.nc, PChannel: p, VChannel: v, Start: start.s,
		Types: types, MinTimeTick: minTT}, nil
}

// tailOf is the MessageID of the last message of o's channel in its
// stream (0: none): the whole stream's last for a PChannel, the last
// matching one of the VChannel's subject filters for a VChannel, each
// read directly (no consumer).
func (c *Client) tailOf(ctx context.Context, o read.Options) (messages.MessageID, error) {
	js, err := njs.New(c.nc)
	if err != nil {
		return 0, streamwal.Errorf(streamwal.CodeUnavailable, "jetstream: %v", err)
	}
	name := c.opts.cluster.StreamName(o.PChannel)
	st, err := js.Stream(ctx, name)
	if errors.Is(err, njs.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, streamwal.Errorf(streamwal.CodeUnavailable, "stream %s: %v", name, err)
	}
	if o.VChannel.IsZero() {
		return messages.MessageID(st.CachedInfo().State.LastSeq), nil
	}
	filters := c.opts.cluster.VChannelFilter(o.VChannel)
	lasts, errs := make([]messages.MessageID, len(filters)), make([]error, len(filters))
	var wg sync.WaitGroup
	for i, f := range filters {
		wg.Go(func() { lasts[i], errs[i] = lastOf(ctx, st, f) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, streamwal.Errorf(streamwal.CodeUnavailable, "last message on %s: %v", name, err)
	}
	return slices.Max(lasts), nil
}

// lastOf is the MessageID of the last message of st on subject filter f
// (0: none), read directly; the filters of a VChannel are read side by
// side, so that a read to now waits for one round trip for them, not one
// each.
func lastOf(ctx context.Context, st njs.Stream, f string) (messages.MessageID, error) {
	m, err := st.GetLastMsgForSubject(ctx, f)
	if errors.Is(err, njs.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("last message of %s: %w", f, err)
	}
	return messages.MessageID(m.Sequence), nil
}

// Next blocks for the next message, until ctx ends or the scanner is
// closed (streamwal.ErrClosed); a read with UntilNow returns io.EOF once
// it has read everything that was there when it opened.
func (s *Scanner) Next(ctx context.Context) (*messages.ImmutableMessage, error) {
	if s.empty {
		return nil, io.EOF
	}
	m, err := s.s.Next(ctx)
	if err == nil {
		noteConsume(ctx, s.hooks, m)
	}
	return m, err
}

// All iterates until ctx ends, the scanner closes, an error occurs, or
// (UntilNow) the read reached the tail it started with; an error other
// than that end, if any, is the last pair.
func (s *Scanner) All(ctx context.Context) iter.Seq2[*messages.ImmutableMessage, error] {
	return func(yield func(*messages.ImmutableMessage, error) bool) {
		for {
			m, err := s.Next(ctx)
			if errors.Is(err, io.EOF) {
				return
			}
			if !yield(m, err) || err != nil {
				return
			}
		}
	}
}

// Watermark is the largest TimeTick the scanner knows complete: every
// message with a TimeTick at or below it has been read.
func (s *Scanner) Watermark() messages.TimeTick {
	if s.empty {
		return 0
	}
	return s.s.Watermark()
}

// Close stops the scanner.
func (s *Scanner) Close() error {
	if s.empty {
		return nil
	}
	return s.s.Close()
}

// itoa formats an int64.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
