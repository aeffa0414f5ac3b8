package jetstream

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// scanner reads one PChannel through an ordered consumer.
type scanner struct {
	b      *JetStream
	p      streamwal.PChannel
	start  StartPosition
	msgs   njs.MessagesContext
	mu     sync.Mutex
	closed bool
}

// newScanner creates the ordered consumer and starts its message flow.
func newScanner(ctx context.Context, b *JetStream, p streamwal.PChannel, opts ReadOptions) (*scanner, error) {
	cfg := njs.OrderedConsumerConfig{FilterSubjects: opts.Filters}
	switch opts.Start.Kind {
	case StartEarliest:
		cfg.DeliverPolicy = njs.DeliverAllPolicy
	case StartLatest:
		cfg.DeliverPolicy = njs.DeliverNewPolicy
	case StartFrom:
		cfg.DeliverPolicy, cfg.OptStartSeq = njs.DeliverByStartSequencePolicy, uint64(opts.Start.ID)
	case StartAfter:
		cfg.DeliverPolicy, cfg.OptStartSeq = njs.DeliverByStartSequencePolicy, uint64(opts.Start.ID)+1
	}
	cons, err := b.js.OrderedConsumer(ctx, b.codec.Cluster().StreamName(p), cfg)
	if err != nil {
		return nil, classify(fmt.Errorf("read %s from %s: %w", p, opts.Start, err))
	}
	msgs, err := cons.Messages()
	if err != nil {
		return nil, classify(fmt.Errorf("read %s from %s: %w", p, opts.Start, err))
	}
	return &scanner{b: b, p: p, start: opts.Start, msgs: msgs}, nil
}

// Start implements Scanner.
func (s *scanner) Start() StartPosition { return s.start }

// Next implements Scanner.
func (s *scanner) Next(ctx context.Context) (*messages.ImmutableMessage, error) {
	if s.isClosed() {
		return nil, s.closedErr()
	}
	m, err := s.msgs.Next(njs.NextContext(ctx))
	if err != nil {
		if errors.Is(err, njs.ErrMsgIteratorClosed) || s.isClosed() {
			return nil, s.closedErr()
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, classify(fmt.Errorf("read %s: %w", s.p, err))
	}
	seq, err := streamSequence(m)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeInternal, "read %s: message without metadata: %v", s.p, err)
	}
	nm := &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
	im, err := s.b.codec.Decode(nm, messages.MessageID(seq))
	if err != nil {
		return nil, fmt.Errorf("read %s: message %d: %w", s.p, seq, err)
	}
	return im, nil
}

// All implements Scanner.
func (s *scanner) All(ctx context.Context) iter.Seq2[*messages.ImmutableMessage, error] {
	return all(ctx, s.Next)
}

// all iterates next until ctx ends, the scanner closes or an error occurs;
// the error, if any, is the last pair.
func all(ctx context.Context, next func(context.Context) (*messages.ImmutableMessage, error)) iter.Seq2[*messages.ImmutableMessage, error] {
	return func(yield func(*messages.ImmutableMessage, error) bool) {
		for {
			m, err := next(ctx)
			if err != nil {
				yield(nil, err)
				return
			}
			if !yield(m, nil) {
				return
			}
		}
	}
}

// Close implements Scanner; it is idempotent.
func (s *scanner) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.msgs.Stop()
	}
	return nil
}

func (s *scanner) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *scanner) closedErr() error {
	return streamwal.Errorf(streamwal.CodeClosed, "scanner of %s is closed", s.p)
}

// ackPrefix starts the reply subject of a consumer's message:
// "$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>".
const ackPrefix = "$JS.ACK."

// streamSequence is m's stream sequence, as m.Metadata() reads it, without
// building the rest of the metadata when the reply subject has this
// server's form (see ackSequence).
func streamSequence(m njs.Msg) (uint64, error) {
	if seq, ok := ackSequence(m.Reply()); ok {
		return seq, nil
	}
	meta, err := m.Metadata()
	if err != nil {
		return 0, err
	}
	return meta.Sequence.Stream, nil
}

// ackSequence reads the stream sequence of a reply subject of nine tokens
// as nats.go does (anything but ASCII digits is 0); other forms are not ok.
func ackSequence(reply string) (uint64, bool) {
	if !strings.HasPrefix(reply, ackPrefix) || strings.Count(reply, ".") != 8 {
		return 0, false
	}
	tok := reply[len(ackPrefix):]
	for range 3 { // stream, consumer, delivered
		_, tok, _ = strings.Cut(tok, ".")
	}
	tok, _, _ = strings.Cut(tok, ".")
	var n uint64
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return 0, true
		}
		n = n*10 + uint64(tok[i]-'0')
	}
	return n, true
}
