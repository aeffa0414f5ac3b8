package jetstream

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// closeBudget bounds how long Close waits for queued appends to resolve.
const closeBudget = 3 * time.Second

// writer is the Writer of one PChannel: the public methods queue work for
// the sequencer goroutine (run), which alone owns the batch state.
type writer struct {
	b         *JetStream
	p         streamwal.PChannel
	term      uint64
	stream    string
	fenceSubj string
	barrier   *messages.ImmutableMessage
	log       zerolog.Logger
	idPrefix  string
	termText  string
	// termValue is the Wal-Term header value, shared by every message
	// (header values are replaced, never changed in place).
	termValue []string
	idSeq     atomic.Uint64

	mu       sync.Mutex
	pending  []*AppendFuture
	stopped  error // once set, appends are refused with it
	wake     chan struct{}
	closeReq chan struct{}
	closing  sync.Once
	done     chan struct{}
	final    atomic.Pointer[error]

	seq   *sequencer
	stats struct {
		units, batches, msgs, recoveries atomic.Uint64
	}
}

// WriterStats counts what a writer sent.
type WriterStats struct {
	// Units is how many publishes or atomic batches were sent.
	Units uint64
	// Batches is how many of them were atomic batches.
	Batches uint64
	// Messages is how many messages were sent (re-sends included).
	Messages uint64
	// Recoveries is how many times the writer resolved its tail.
	Recoveries uint64
}

// Stats returns the writer's counters.
func (w *writer) Stats() WriterStats {
	return WriterStats{Units: w.stats.units.Load(), Batches: w.stats.batches.Load(),
		Messages: w.stats.msgs.Load(), Recoveries: w.stats.recoveries.Load()}
}

// startWriter starts the sequencer after the barrier landed.
func startWriter(b *JetStream, p streamwal.PChannel, term uint64, barrier *messages.ImmutableMessage) (*writer, error) {
	w := &writer{
		b: b, p: p, term: term, barrier: barrier,
		stream:    b.codec.Cluster().StreamName(p),
		fenceSubj: b.barrierSubject(p),
		log:       b.log.With().Str("pchannel", p.String()).Uint64("term", term).Logger(),
		idPrefix:  "w" + strconv.FormatUint(term, 10) + "-" + nuid.Next() + "-",
		termText:  strconv.FormatUint(term, 10),
		termValue: []string{strconv.FormatUint(term, 10)},
		wake:      make(chan struct{}, 1),
		closeReq:  make(chan struct{}),
		done:      make(chan struct{}),
	}
	s, err := newSequencer(w, uint64(barrier.ID()))
	if err != nil {
		return nil, err
	}
	w.seq = s
	go s.run()
	return w, nil
}

// PChannel implements Writer.
func (w *writer) PChannel() streamwal.PChannel { return w.p }

// Term implements Writer.
func (w *writer) Term() uint64 { return w.term }

// Barrier implements Writer.
func (w *writer) Barrier() *messages.ImmutableMessage { return w.barrier }

// Fenced implements Writer.
func (w *writer) Fenced(ctx context.Context) (bool, error) {
	stream, err := w.b.js.Stream(ctx, w.stream)
	if err != nil {
		return false, classify(fmt.Errorf("check fence of %s: %w", w.p, err))
	}
	last, err := w.b.newestBarrier(ctx, stream, w.p)
	if err != nil {
		return false, err
	}
	return last.term > w.term, nil
}

// Done implements Writer.
func (w *writer) Done() <-chan struct{} { return w.done }

// Err implements Writer.
func (w *writer) Err() error {
	if e := w.final.Load(); e != nil {
		return *e
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

// Append implements Writer.
func (w *writer) Append(ctx context.Context, msgs ...*messages.MutableMessage) ([]messages.MessageID, error) {
	return w.AppendAsync(ctx, msgs...).Wait(ctx)
}

// AppendAsync implements Writer. ctx is checked before the append is
// queued; pass it to Wait as well.
func (w *writer) AppendAsync(ctx context.Context, msgs ...*messages.MutableMessage) *AppendFuture {
	if err := ctx.Err(); err != nil {
		return failedFuture(err)
	}
	f, err := w.encode(msgs)
	if err != nil {
		return failedFuture(err)
	}
	w.mu.Lock()
	if w.stopped != nil {
		err := w.stopped
		w.mu.Unlock()
		return failedFuture(err)
	}
	w.pending = append(w.pending, f)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return f
}

// encode validates and encodes msgs, giving each a message ID.
func (w *writer) encode(msgs []*messages.MutableMessage) (*AppendFuture, error) {
	if len(msgs) == 0 || len(msgs) > w.b.opts.MaxBatch {
		return nil, invalidArg("append takes 1 to %d messages, got %d", w.b.opts.MaxBatch, len(msgs))
	}
	f := newFuture(len(msgs))
	ids := f.ids
	limit := int(w.b.opts.MaxMsgSize)
	if mp := int(w.b.nc.MaxPayload()); mp > 0 {
		limit = min(limit, mp)
	}
	var seen idSet
	for i, m := range msgs {
		if m == nil || m.PChannel() != w.p {
			return nil, invalidArg("message %d is not for %s", i, w.p)
		}
		if m.Type() == messages.TypeRecoveryBarrier {
			return nil, invalidArg("only the writer appends RecoveryBarriers")
		}
		nm, err := w.b.codec.Encode(m)
		if err != nil {
			return nil, err
		}
		nm.Header[messages.HdrTerm] = w.termValue
		ids[i] = m.MsgID()
		if ids[i] == "" {
			ids[i] = w.idPrefix + strconv.FormatUint(w.idSeq.Add(1), 36)
			nm.Header.Set(nats.MsgIdHdr, ids[i])
		}
		if size := len(nm.Subject) + m.Size() + batchHeaderAllowance; size > limit {
			return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "message %d is %d bytes, over the limit of %d", i, size, limit)
		}
		if m.MsgID() != "" && seen.repeat(ids[:i], ids[i]) {
			return nil, invalidArg("message %d repeats message id %q of the same append", i, ids[i])
		}
		f.msgs[i] = nm
	}
	return f, nil
}

// idSet finds a repeated message ID among the earlier ones of an append:
// by scanning while the append is small, with a map once it is not.
type idSet struct{ m map[string]bool }

// repeat reports whether id is among earlier.
func (s *idSet) repeat(earlier []string, id string) bool {
	if len(earlier) < 16 {
		return slices.Contains(earlier, id)
	}
	if s.m == nil {
		s.m = make(map[string]bool, 2*len(earlier))
		for _, e := range earlier {
			s.m[e] = true
		}
	}
	if s.m[id] {
		return true
	}
	s.m[id] = true
	return false
}

// batchHeaderAllowance covers the headers the sequencer adds to a message.
const batchHeaderAllowance = 384 + messages.MaxMsgIDLen

// Close implements Writer: it refuses new appends, lets the sequencer
// resolve the queued ones within a bounded time, and waits for it to stop.
func (w *writer) Close() error {
	w.closing.Do(func() {
		w.mu.Lock()
		if w.stopped == nil {
			w.stopped = streamwal.Errorf(streamwal.CodeClosed, "writer of %s (term %d) is closed", w.p, w.term)
		}
		w.mu.Unlock()
		close(w.closeReq)
	})
	<-w.done
	return nil
}

// stop refuses appends with err from now on and returns what was pending.
func (w *writer) stop(err error) []*AppendFuture {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped == nil || streamwal.CodeOf(err) == streamwal.CodeFenced {
		w.stopped = err
	}
	p := w.pending
	w.pending = nil
	return p
}

// takePending moves the queued requests to the sequencer.
func (w *writer) takePending() []*AppendFuture {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pending
	w.pending = nil
	return p
}

// headers of the batch protocol (ADR-50), as jetstreamext names them.
const (
	hdrBatchID     = "Nats-Batch-Id"
	hdrBatchSeq    = "Nats-Batch-Sequence"
	hdrBatchCommit = "Nats-Batch-Commit"
)

// clearBatchHeaders removes what a previous send set.
func clearBatchHeaders(m *nats.Msg) {
	for _, h := range []string{hdrBatchID, hdrBatchSeq, hdrBatchCommit, njs.ExpectedLastSeqHeader,
		njs.ExpectedLastSubjSeqHeader, njs.ExpectedLastSubjSeqSubjHeader, njs.ExpectedLastMsgIDHeader} {
		m.Header.Del(h)
	}
	m.Reply = ""
}
