package faulty

import (
	"context"
	"sync/atomic"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// Backend is a [jetstream.Backend] that asks its injector about every
// operation before passing it to the backend it wraps. Its writers and
// scanners do the same. Beyond Backend it offers the methods of
// jetstream.SegmentStore and of wal.Tiers (Advance), which fail with an
// internal error when the wrapped backend has none. It is safe for
// concurrent use.
type Backend struct {
	inner jetstream.Backend
	inj   atomic.Pointer[Injector]
}

// Interfaces the wrapper implements.
var (
	_ jetstream.Backend      = (*Backend)(nil)
	_ jetstream.SegmentStore = (*Backend)(nil)
)

// New wraps b, asking inj about each operation (nil: [Pass]).
func New(b jetstream.Backend, inj Injector) *Backend {
	fb := &Backend{inner: b}
	fb.SetInjector(inj)
	return fb
}

// SetInjector replaces the injector (nil: [Pass]); operations already
// running keep the fault they were given.
func (b *Backend) SetInjector(inj Injector) {
	if inj == nil {
		inj = Pass
	}
	b.inj.Store(&inj)
}

// Unwrap returns the wrapped backend.
func (b *Backend) Unwrap() jetstream.Backend { return b.inner }

// Options returns the wrapped backend's options when it has any (as
// *jetstream.JetStream does), else the zero Options.
func (b *Backend) Options() jetstream.Options {
	if o, ok := b.inner.(interface{ Options() jetstream.Options }); ok {
		return o.Options()
	}
	return jetstream.Options{}
}

// inject asks the injector about c.
func (b *Backend) inject(c Call) Fault { return (*b.inj.Load()).Inject(c) }

// OpenWriter implements [jetstream.Backend] (OpOpenWriter). With After,
// the writer opens (its barrier lands) and is closed again before the
// error is returned.
func (b *Backend) OpenWriter(ctx context.Context, p streamwal.PChannel, term uint64, opts ...jetstream.WriterOption) (jetstream.Writer, error) {
	f := b.inject(Call{Op: OpOpenWriter, PChannel: p, Term: term})
	w, err := apply(ctx, f, func() (jetstream.Writer, error) { return b.inner.OpenWriter(ctx, p, term, opts...) },
		func(w jetstream.Writer) { _ = w.Close() })
	if err != nil {
		return nil, err
	}
	return newWriter(b, w), nil
}

// Read implements [jetstream.Backend] (OpRead). With After, the scanner
// opens and is closed again before the error is returned.
func (b *Backend) Read(ctx context.Context, p streamwal.PChannel, opts jetstream.ReadOptions) (jetstream.Scanner, error) {
	f := b.inject(Call{Op: OpRead, PChannel: p})
	s, err := apply(ctx, f, func() (jetstream.Scanner, error) { return b.inner.Read(ctx, p, opts) },
		func(s jetstream.Scanner) { _ = s.Close() })
	if err != nil {
		return nil, err
	}
	return &scanner{b: b, p: p, inner: s}, nil
}

// Get implements [jetstream.Backend] (OpGet).
func (b *Backend) Get(ctx context.Context, p streamwal.PChannel, id messages.MessageID) (*messages.ImmutableMessage, error) {
	f := b.inject(Call{Op: OpGet, PChannel: p, ID: id})
	return apply(ctx, f, func() (*messages.ImmutableMessage, error) { return b.inner.Get(ctx, p, id) }, nil)
}

// Truncate implements [jetstream.Backend] (OpTruncate).
func (b *Backend) Truncate(ctx context.Context, p streamwal.PChannel, below messages.MessageID) error {
	f := b.inject(Call{Op: OpTruncate, PChannel: p, ID: below})
	_, err := apply(ctx, f, func() (struct{}, error) { return struct{}{}, b.inner.Truncate(ctx, p, below) }, nil)
	return err
}

// State implements [jetstream.Backend] (OpState).
func (b *Backend) State(ctx context.Context, p streamwal.PChannel) (jetstream.StreamState, error) {
	f := b.inject(Call{Op: OpState, PChannel: p})
	return apply(ctx, f, func() (jetstream.StreamState, error) { return b.inner.State(ctx, p) }, nil)
}

// Close implements [jetstream.Backend]; it is never faulty.
func (b *Backend) Close() error { return b.inner.Close() }

// Advance is wal.Tiers' Advance of the wrapped backend (OpAdvance).
func (b *Backend) Advance(ctx context.Context, p streamwal.PChannel, next messages.MessageID) error {
	t, ok := b.inner.(interface {
		Advance(context.Context, streamwal.PChannel, messages.MessageID) error
	})
	if !ok {
		return b.lacks(OpAdvance)
	}
	f := b.inject(Call{Op: OpAdvance, PChannel: p, ID: next})
	_, err := apply(ctx, f, func() (struct{}, error) { return struct{}{}, t.Advance(ctx, p, next) }, nil)
	return err
}

// WriteSegment implements [jetstream.SegmentStore] (OpWriteSegment).
func (b *Backend) WriteSegment(ctx context.Context, m jetstream.SegmentManifest, msgs jetstream.Messages) error {
	s, ok := b.inner.(jetstream.SegmentStore)
	if !ok {
		return b.lacks(OpWriteSegment)
	}
	// A manifest with a bad VChannel name is the wrapped backend's to
	// refuse; the injector then sees the zero VChannel.
	v, _ := streamwal.ParseVChannel(m.VChannel)
	f := b.inject(Call{Op: OpWriteSegment, VChannel: v})
	_, err := apply(ctx, f, func() (struct{}, error) { return struct{}{}, s.WriteSegment(ctx, m, msgs) }, nil)
	return err
}

// Segments implements [jetstream.SegmentStore] (OpSegments).
func (b *Backend) Segments(ctx context.Context, v streamwal.VChannel) ([]jetstream.SegmentManifest, error) {
	s, ok := b.inner.(jetstream.SegmentStore)
	if !ok {
		return nil, b.lacks(OpSegments)
	}
	f := b.inject(Call{Op: OpSegments, VChannel: v})
	return apply(ctx, f, func() ([]jetstream.SegmentManifest, error) { return s.Segments(ctx, v) }, nil)
}

// ReadSegment implements [jetstream.SegmentStore] (OpReadSegment).
func (b *Backend) ReadSegment(ctx context.Context, v streamwal.VChannel, id int64) (jetstream.SegmentManifest, []*messages.ImmutableMessage, error) {
	s, ok := b.inner.(jetstream.SegmentStore)
	if !ok {
		return jetstream.SegmentManifest{}, nil, b.lacks(OpReadSegment)
	}
	type segment struct {
		m    jetstream.SegmentManifest
		msgs []*messages.ImmutableMessage
	}
	f := b.inject(Call{Op: OpReadSegment, VChannel: v})
	got, err := apply(ctx, f, func() (segment, error) {
		m, msgs, err := s.ReadSegment(ctx, v, id)
		return segment{m, msgs}, err
	}, nil)
	return got.m, got.msgs, err
}

// lacks is the error of an operation the wrapped backend does not offer.
func (b *Backend) lacks(op Op) error {
	return streamwal.Errorf(streamwal.CodeInternal, "faulty: the wrapped backend %T has no %s", b.inner, op)
}

// apply runs op under fault f. Without After, it waits as f says and
// fails with f.Err without running op, or runs op. With After, it runs
// op; when op succeeded it waits, then fails with f.Err after undoing the
// result with discard (if not nil), or returns the result.
func apply[T any](ctx context.Context, f Fault, op func() (T, error), discard func(T)) (T, error) {
	var zero T
	if !f.After {
		if err := f.wait(ctx); err != nil {
			return zero, err
		}
		if f.Err != nil {
			return zero, f.Err
		}
		return op()
	}
	v, err := op()
	if err != nil {
		return v, err
	}
	_ = f.wait(ctx) // the result is known: a context that ends only cuts the wait short
	if f.Err != nil {
		if discard != nil {
			discard(v)
		}
		return zero, f.Err
	}
	return v, nil
}
