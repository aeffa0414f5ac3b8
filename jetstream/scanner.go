package jetstream

import (
	"context"
	"errors"
	"fmt"
	"iter"
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
	meta, err := m.Metadata()
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeInternal, "read %s: message without metadata: %v", s.p, err)
	}
	nm := &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
	im, err := s.b.codec.Decode(nm, messages.MessageID(meta.Sequence.Stream))
	if err != nil {
		return nil, fmt.Errorf("read %s: message %d: %w", s.p, meta.Sequence.Stream, err)
	}
	return im, nil
}

// All implements Scanner.
func (s *scanner) All(ctx context.Context) iter.Seq2[*messages.ImmutableMessage, error] {
	return func(yield func(*messages.ImmutableMessage, error) bool) {
		for {
			m, err := s.Next(ctx)
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
