package faulty

import (
	"context"
	"errors"
	"iter"
	"sync"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// writer is a faulty jetstream.Writer. An append that fails with an error
// matching streamwal.ErrFenced (injected or not) stops it as fencing stops
// a writer: Err returns that error, Done is closed, Fenced reports true
// and every later append is refused with it.
type writer struct {
	b     *Backend
	inner jetstream.Writer
	done  chan struct{}
	fence chan struct{}

	mu     sync.Mutex
	fenced error
}

// newWriter wraps w; its Done closes when w's does or when it is fenced.
func newWriter(b *Backend, w jetstream.Writer) *writer {
	fw := &writer{b: b, inner: w, done: make(chan struct{}), fence: make(chan struct{})}
	go func() {
		defer close(fw.done)
		select {
		case <-w.Done():
		case <-fw.fence:
		}
	}()
	return fw
}

// PChannel implements jetstream.Writer.
func (w *writer) PChannel() streamwal.PChannel { return w.inner.PChannel() }

// Term implements jetstream.Writer.
func (w *writer) Term() uint64 { return w.inner.Term() }

// Barrier implements jetstream.Writer.
func (w *writer) Barrier() *messages.ImmutableMessage { return w.inner.Barrier() }

// Stats implements jetstream.Writer.
func (w *writer) Stats() jetstream.WriterStats { return w.inner.Stats() }

// Done implements jetstream.Writer.
func (w *writer) Done() <-chan struct{} { return w.done }

// Err implements jetstream.Writer.
func (w *writer) Err() error {
	if err := w.fencedErr(); err != nil {
		return err
	}
	return w.inner.Err()
}

// Close implements jetstream.Writer; it is never faulty. Like the
// wrapped writer's, Done is closed once it returns.
func (w *writer) Close() error {
	err := w.inner.Close()
	<-w.done // the wrapped writer's Done is closed: so is this one, now
	return err
}

// Fenced implements jetstream.Writer (OpFenced).
func (w *writer) Fenced(ctx context.Context) (bool, error) {
	if w.fencedErr() != nil {
		return true, nil
	}
	f := w.b.inject(Call{Op: OpFenced, PChannel: w.inner.PChannel(), Term: w.inner.Term()})
	return apply(ctx, f, func() (bool, error) { return w.inner.Fenced(ctx) }, nil)
}

// Append implements jetstream.Writer (OpAppend).
func (w *writer) Append(ctx context.Context, msgs ...*messages.MutableMessage) ([]messages.MessageID, error) {
	if err := w.fencedErr(); err != nil {
		return nil, err
	}
	f := w.b.inject(w.appendCall(msgs, false))
	ids, err := apply(ctx, f, func() ([]messages.MessageID, error) { return w.inner.Append(ctx, msgs...) }, nil)
	w.noteFenced(err)
	return ids, err
}

// AppendAsync implements jetstream.Writer (OpAppend). A fault's Delay
// and Hold defer the delivery of the result, never the call: the append
// is handed to the wrapped writer at once (so appends keep their order),
// unless the fault fails it without After. Such an append is never sent;
// its future has failed already when AppendAsync returns, as a writer
// refuses an append before queueing it, or, when the fault also waits,
// fails once the wait is over, as an append lost on its way would.
func (w *writer) AppendAsync(ctx context.Context, msgs ...*messages.MutableMessage) *jetstream.AppendFuture {
	if err := w.fencedErr(); err != nil {
		return jetstream.FailedFuture(err)
	}
	f := w.b.inject(w.appendCall(msgs, true))
	switch {
	case f.Err != nil && !f.After:
		return w.failAsync(ctx, f, msgs)
	case f.zero():
		return w.inner.AppendAsync(ctx, msgs...)
	}
	return w.relay(ctx, f, w.inner.AppendAsync(ctx, msgs...))
}

// failAsync fails an append that is never sent: at once, or once f's
// wait is over.
func (w *writer) failAsync(ctx context.Context, f Fault, msgs []*messages.MutableMessage) *jetstream.AppendFuture {
	if !f.waits() {
		w.noteFenced(f.Err)
		return jetstream.FailedFuture(f.Err)
	}
	fut, resolve := jetstream.NewFuture(callerIDs(msgs))
	go func() {
		_ = f.wait(ctx)
		w.noteFenced(f.Err)
		resolve(nil, f.Err)
	}()
	return fut
}

// relay returns a future that resolves as inner does, after f's wait
// and with f.Err when inner succeeded; inner itself when the wrapped
// writer refused the append at once, which stays a refusal.
func (w *writer) relay(ctx context.Context, f Fault, inner *jetstream.AppendFuture) *jetstream.AppendFuture {
	select {
	case <-inner.Done():
		if _, err := inner.Result(); err != nil {
			w.noteFenced(err)
			return inner
		}
	default:
	}
	fut, resolve := jetstream.NewFuture(inner.MsgIDs())
	go func() {
		<-inner.Done()
		ids, err := inner.Result()
		if err == nil {
			_ = f.wait(ctx) // the result is known: a context that ends only cuts the wait short
			if f.Err != nil {
				ids, err = nil, f.Err
			}
		}
		w.noteFenced(err)
		resolve(ids, err)
	}()
	return fut
}

// appendCall describes an append of msgs.
func (w *writer) appendCall(msgs []*messages.MutableMessage, async bool) Call {
	return Call{Op: OpAppend, PChannel: w.inner.PChannel(), Term: w.inner.Term(), Msgs: msgs, Async: async}
}

// callerIDs are the message IDs the caller gave msgs ("" where none).
func callerIDs(msgs []*messages.MutableMessage) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		if m != nil {
			ids[i] = m.MsgID()
		}
	}
	return ids
}

// fencedErr is the error the writer was fenced with, nil if it was not.
func (w *writer) fencedErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fenced
}

// noteFenced stops the writer if err says it was fenced.
func (w *writer) noteFenced(err error) {
	if !errors.Is(err, streamwal.ErrFenced) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fenced == nil {
		w.fenced = err
		close(w.fence)
	}
}

// scanner is a faulty jetstream.Scanner.
type scanner struct {
	b     *Backend
	p     streamwal.PChannel
	inner jetstream.Scanner
}

// Start implements jetstream.Scanner.
func (s *scanner) Start() jetstream.StartPosition { return s.inner.Start() }

// Next implements jetstream.Scanner (OpNext). With After, the message
// read is dropped.
func (s *scanner) Next(ctx context.Context) (*messages.ImmutableMessage, error) {
	f := s.b.inject(Call{Op: OpNext, PChannel: s.p})
	return apply(ctx, f, func() (*messages.ImmutableMessage, error) { return s.inner.Next(ctx) }, nil)
}

// All implements jetstream.Scanner: each step is a Next, and faulty.
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

// Close implements jetstream.Scanner; it is never faulty.
func (s *scanner) Close() error { return s.inner.Close() }
