package jetstream

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// scanner reads one PChannel through an ordered consumer. With
// HeadersOnly, that consumer delivers headers only, and a second one,
// filtered to the subjects of the types asked for whole, delivers those
// whole: the first gives the order, and each message of a whole type is
// taken from the second (a subsequence of the stream in the same order).
type scanner struct {
	b     *JetStream
	p     streamwal.PChannel
	start StartPosition
	msgs  njs.MessagesContext
	// headersOnly: msgs delivers headers only; whole types come from bodies.
	headersOnly bool
	whole       map[*messages.Type]bool
	bodies      njs.MessagesContext // nil unless whole types are asked for
	ahead       njs.Msg             // a message of bodies read past the one wanted
	// cfg, pull and bodiesCfg create the consumers again (see restart);
	// last is the stream sequence msgs delivered last, stall how long the
	// next wait for a message may last before the scanner looks whether
	// its consumer stalled.
	cfg, bodiesCfg njs.OrderedConsumerConfig
	pull           []njs.PullMessagesOpt
	last           uint64
	stall          time.Duration
	wait           stallWait
	mu             sync.Mutex
	closed         bool
}

// stallWait is the context of the waits for a message, with the stall
// bound as its timeout, kept from one message to the next while at least
// half of that bound is left, so that a stream of messages does not cost a
// context and a timer each: a scanner looks whether its consumer stalled
// after between half its stall bound and that bound without a message.
type stallWait struct {
	ctx    context.Context
	cancel context.CancelFunc
	done   <-chan struct{} // the caller's Done, which ctx derives from
	stall  time.Duration   // the bound ctx was made with
	until  time.Time       // its deadline
}

// get returns a context that ends with ctx or after at most stall.
func (w *stallWait) get(ctx context.Context, stall time.Duration) context.Context {
	now := time.Now()
	if w.ctx != nil && w.done == ctx.Done() && w.stall == stall && w.ctx.Err() == nil && w.until.Sub(now) > stall/2 {
		return w.ctx
	}
	w.release()
	w.ctx, w.cancel = context.WithTimeout(ctx, stall)
	w.done, w.stall, w.until = ctx.Done(), stall, now.Add(stall)
	return w.ctx
}

// release cancels the context kept, if any.
func (w *stallWait) release() {
	if w.cancel != nil {
		w.cancel()
		*w = stallWait{}
	}
}

// Bounds of the wait for a message before a scanner looks whether its
// consumer stalled: it starts at minStall and doubles at every look, up
// to maxStall, until a message comes.
const (
	minStall = 5 * time.Second
	maxStall = time.Minute
)

// headersOnlyBatch is how many messages a headers-only consumer asks for
// at a time: headers are small, and a larger batch halves the per-message
// cost of the pull protocol.
const headersOnlyBatch = 4096

// newScanner creates the ordered consumers and starts their message flow.
func newScanner(ctx context.Context, b *JetStream, p streamwal.PChannel, opts ReadOptions) (*scanner, error) {
	s := &scanner{b: b, p: p, start: opts.Start, headersOnly: opts.HeadersOnly, stall: minStall}
	s.cfg = consumerConfig(opts)
	if opts.HeadersOnly {
		s.cfg.HeadersOnly = true
		s.pull = append(s.pull, njs.PullMaxMessages(headersOnlyBatch))
	}
	var err error
	if s.msgs, err = b.orderedMessages(ctx, p, opts.Start, s.cfg, s.pull...); err != nil {
		return nil, err
	}
	if opts.HeadersOnly && len(opts.Whole) > 0 {
		s.whole = map[*messages.Type]bool{}
		s.bodiesCfg = consumerConfig(ReadOptions{Start: opts.Start})
		for _, t := range opts.Whole {
			s.whole[t] = true
			s.bodiesCfg.FilterSubjects = append(s.bodiesCfg.FilterSubjects, b.codec.Cluster().PChannelTypeFilters(p, t.Token)...)
		}
		if s.bodies, err = b.orderedMessages(ctx, p, opts.Start, s.bodiesCfg); err != nil {
			s.msgs.Stop()
			return nil, err
		}
	}
	return s, nil
}

// readStreamOrArchive opens a scanner of p's stream while it reads the
// archive's index, so that a read the stream serves (the usual case) waits
// for one round trip to the server, not two. When the start is below the
// archive's end, the stream's scanner is closed unused and the read starts
// in the archive. Whichever finishes first, the outcome is the one of
// reading the index before opening the scanner: a truncation archives
// before it removes, so an index without the start shows that nothing at
// or above it was removed when the index was read; what a truncation
// removes after that, before the scanner delivers it, is lost to this
// read in either order, as to any reader that falls behind truncation
// (the retention floor and durable positions are what keep it).
func (b *JetStream) readStreamOrArchive(ctx context.Context, p streamwal.PChannel, opts ReadOptions) (Scanner, error) {
	type opened struct {
		s   *scanner
		err error
	}
	stream := make(chan opened, 1)
	go func() {
		s, err := newScanner(ctx, b, p, opts)
		stream <- opened{s, err}
	}()
	sc, archived, err := b.readArchived(ctx, p, opts)
	o := <-stream
	if archived || err != nil {
		if o.s != nil {
			_ = o.s.Close()
		}
		return sc, err
	}
	return o.s, o.err
}

// consumerConfig is the ordered consumer of opts, with its start and
// filters.
func consumerConfig(opts ReadOptions) njs.OrderedConsumerConfig {
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
	return cfg
}

// orderedMessages creates an ordered consumer of p and starts its flow.
func (b *JetStream) orderedMessages(ctx context.Context, p streamwal.PChannel, start StartPosition, cfg njs.OrderedConsumerConfig, opts ...njs.PullMessagesOpt) (njs.MessagesContext, error) {
	cons, err := b.js.OrderedConsumer(ctx, b.codec.Cluster().StreamName(p), cfg)
	if err != nil {
		return nil, classify(fmt.Errorf("read %s from %s: %w", p, start, err))
	}
	msgs, err := cons.Messages(opts...)
	if err != nil {
		return nil, classify(fmt.Errorf("read %s from %s: %w", p, start, err))
	}
	return msgs, nil
}

// Start implements Scanner.
func (s *scanner) Start() StartPosition { return s.start }

// Next implements Scanner.
func (s *scanner) Next(ctx context.Context) (*messages.ImmutableMessage, error) {
	m, seq, err := s.nextMain(ctx)
	if err != nil {
		return nil, err
	}
	nm := &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
	if !s.headersOnly {
		return s.decode(nm, seq)
	}
	im, err := s.b.codec.DecodeHeadersOnly(nm, messages.MessageID(seq))
	if err != nil {
		return nil, fmt.Errorf("read %s: message %d: %w", s.p, seq, err)
	}
	if s.whole[im.Type()] {
		return s.wholeMessage(ctx, seq)
	}
	return im, nil
}

// nextMain takes the next message of the main consumer. An ordered
// consumer of a replicated stream was seen to stay silent for good while
// the stream grew and its heartbeats kept coming (so nats.go did not
// replace it), when it was created just after the stream: a scanner that
// waits for a message longer than its stall bound, while the stream holds
// a message past the last one it delivered that its filters let through,
// starts its consumers again after that message. The bound doubles at
// every look and starts again with each message delivered. The wait's
// context is kept from one message to the next (see stallWait) and
// released when Next fails.
func (s *scanner) nextMain(ctx context.Context) (njs.Msg, uint64, error) {
	for {
		m, seq, err := s.next(s.wait.get(ctx, s.stall), s.current())
		if err == nil {
			s.last, s.stall = seq, minStall
			return m, seq, nil
		}
		s.wait.release()
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return nil, 0, err
		}
		s.restartIfStalled(ctx)
	}
}

// current is the main consumer's message flow.
func (s *scanner) current() njs.MessagesContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.msgs
}

// restartIfStalled starts the consumers again after the last message
// delivered if the stream holds a later one that the scanner's filters
// let through. A scanner that started at the stream's end and delivered
// nothing yet keeps its consumer: it cannot tell where it started. The
// wait before the next look doubles either way, so that an idle scanner
// looks about once a minute. A look or a restart that fails (the server
// unavailable for a while) leaves the consumers as they are, to be looked
// at again: the scanner goes on waiting, as it did before it looked.
func (s *scanner) restartIfStalled(ctx context.Context) {
	if s.last == 0 && s.start.Kind == StartLatest {
		return
	}
	s.stall = min(2*s.stall, maxStall)
	newer, err := s.newerThan(ctx, s.last)
	if err != nil || !newer {
		return // nothing to read, or no answer: keep waiting
	}
	from := StartPosition{Kind: StartAfter, ID: messages.MessageID(s.last)}
	if s.last == 0 {
		from = s.start
	}
	log := s.b.log.Debug().Str("pchannel", s.p.String()).Stringer("from", from)
	if err := s.restart(ctx, from); err != nil {
		log.Err(err).Msg("scanner's consumer delivered nothing while its stream grew; starting it again failed")
		return
	}
	log.Msg("scanner's consumer delivered nothing while its stream grew: started it again")
}

// newerThan reports whether the stream holds a message after seq that
// the scanner's filters let through: the stream's last message without
// filters, each filter's last message with them (direct gets).
func (s *scanner) newerThan(ctx context.Context, seq uint64) (bool, error) {
	str, err := s.b.js.Stream(ctx, s.b.codec.Cluster().StreamName(s.p))
	if err != nil {
		return false, classify(fmt.Errorf("read %s: %w", s.p, err))
	}
	if len(s.cfg.FilterSubjects) == 0 {
		return str.CachedInfo().State.LastSeq > seq, nil
	}
	for _, f := range s.cfg.FilterSubjects {
		m, err := str.GetLastMsgForSubject(ctx, f)
		if errors.Is(err, njs.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, classify(fmt.Errorf("read %s: %w", s.p, err))
		}
		if m.Sequence > seq {
			return true, nil
		}
	}
	return false, nil
}

// restart replaces the consumers by ones that start at from.
func (s *scanner) restart(ctx context.Context, from StartPosition) error {
	cfg := consumerConfig(ReadOptions{Start: from, Filters: s.cfg.FilterSubjects})
	cfg.HeadersOnly = s.cfg.HeadersOnly
	msgs, err := s.b.orderedMessages(ctx, s.p, from, cfg, s.pull...)
	if err != nil {
		return err
	}
	var bodies njs.MessagesContext
	if s.bodies != nil {
		bcfg := consumerConfig(ReadOptions{Start: from, Filters: s.bodiesCfg.FilterSubjects})
		if bodies, err = s.b.orderedMessages(ctx, s.p, from, bcfg); err != nil {
			msgs.Stop()
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		msgs.Stop()
		if bodies != nil {
			bodies.Stop()
		}
		return s.closedErr()
	}
	s.msgs.Stop()
	s.msgs = msgs
	if bodies != nil {
		s.bodies.Stop()
		s.bodies, s.ahead = bodies, nil
	}
	return nil
}

// next takes the next message of one of s's consumers, with its stream
// sequence.
func (s *scanner) next(ctx context.Context, from njs.MessagesContext) (njs.Msg, uint64, error) {
	if s.isClosed() {
		return nil, 0, s.closedErr()
	}
	m, err := from.Next(njs.NextContext(ctx))
	if err != nil {
		if errors.Is(err, njs.ErrMsgIteratorClosed) || s.isClosed() {
			return nil, 0, s.closedErr()
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, 0, ctxErr
		}
		return nil, 0, classify(fmt.Errorf("read %s: %w", s.p, err))
	}
	seq, err := streamSequence(m)
	if err != nil {
		return nil, 0, streamwal.Errorf(streamwal.CodeInternal, "read %s: message without metadata: %v", s.p, err)
	}
	return m, seq, nil
}

// decode decodes a whole message.
func (s *scanner) decode(nm *nats.Msg, seq uint64) (*messages.ImmutableMessage, error) {
	im, err := s.b.codec.Decode(nm, messages.MessageID(seq))
	if err != nil {
		return nil, fmt.Errorf("read %s: message %d: %w", s.p, seq, err)
	}
	return im, nil
}

// wholeMessage takes message seq, of a type asked for whole, from the
// second consumer, skipping what it delivers below seq (messages of those
// types that the first consumer's filters leave out). Should the second
// consumer not hold seq (removed between the two reads), it is read alone.
func (s *scanner) wholeMessage(ctx context.Context, seq uint64) (*messages.ImmutableMessage, error) {
	for {
		m := s.ahead
		s.ahead = nil
		got := uint64(0)
		if m != nil {
			got, _ = streamSequence(m)
		} else {
			var err error
			if m, got, err = s.next(ctx, s.bodies); err != nil {
				return nil, err
			}
		}
		switch {
		case got == seq:
			return s.decode(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}, seq)
		case got > seq:
			s.ahead = m
			return s.b.Get(ctx, s.p, messages.MessageID(seq))
		}
	}
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
		if s.bodies != nil {
			s.bodies.Stop()
		}
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
