package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// testBadArguments: every invalid call fails with a typed error and
// writes nothing.
func (e *env) testBadArguments(t *testing.T) {
	ctx := testContext(t)
	b := e.backend(t)
	p, q := e.pchannel(t, "bad"), e.pchannel(t, "bad")
	v, vq := vchannel(t, p, 1), vchannel(t, q, 1)
	w := openWriter(ctx, t, b, p, 1)
	wq := openWriter(ctx, t, b, q, 1)
	last, lastQ := w.Barrier().ID(), wq.Barrier().ID()
	written := func(what string) {
		t.Helper()
		e.nothingWritten(ctx, t, what, w, v, &last)
	}

	t.Run("OpenWriter", func(t *testing.T) {
		open := func(what string, p streamwal.PChannel, term uint64, want error, opts ...jetstream.WriterOption) {
			t.Helper()
			nw, err := b.OpenWriter(ctx, p, term, opts...)
			if err == nil {
				_ = nw.Close()
			}
			expectCode(t, what, err, want)
			written(what)
		}
		open("open the zero pchannel", streamwal.PChannel{}, 2, streamwal.ErrInvalidArgument)
		open("open under term 0", p, 0, streamwal.ErrInvalidArgument)
		wrongTerm, err := e.codec.NewPChannelBody(messages.TypeRecoveryBarrier, p, messages.RecoveryBarrierBody{Term: 7})
		if err != nil {
			t.Fatal(err)
		}
		open("open with a barrier of another term", p, 2, streamwal.ErrInvalidArgument, jetstream.WithBarrier(wrongTerm))
		otherP, err := e.codec.NewPChannelBody(messages.TypeRecoveryBarrier, q, messages.RecoveryBarrierBody{Term: 2})
		if err != nil {
			t.Fatal(err)
		}
		open("open with a barrier of another pchannel", p, 2, streamwal.ErrInvalidArgument, jetstream.WithBarrier(otherP))
		open("open with an insert as barrier", p, 2, streamwal.ErrInvalidArgument, jetstream.WithBarrier(e.insert(t, v, "not a barrier", "")))
		open("open under the current term", p, 1, streamwal.ErrFenced)
	})

	t.Run("Append", func(t *testing.T) {
		app := func(what string, want error, msgs ...*messages.MutableMessage) {
			t.Helper()
			ids, err := w.Append(ctx, msgs...)
			if err == nil {
				t.Errorf("%s: appended at %v", what, ids)
			}
			expectCode(t, what, err, want)
			written(what)
		}
		ok := e.insert(t, v, "valid", "")
		app("empty append", streamwal.ErrInvalidArgument)
		app("nil message", streamwal.ErrInvalidArgument, ok, nil)
		over := make([]*messages.MutableMessage, max(maxBatch(b), jetstream.DefaultMaxBatch)+1)
		for i := range over {
			over[i] = e.insert(t, v, fmt.Sprint("over ", i), "")
		}
		app(fmt.Sprintf("append of %d messages", len(over)), streamwal.ErrInvalidArgument, over...)
		if mb := maxBatch(b); mb < jetstream.DefaultMaxBatch {
			app(fmt.Sprintf("append of %d messages", mb+1), streamwal.ErrInvalidArgument, over[:mb+1]...)
		}
		app("message of another pchannel", streamwal.ErrInvalidArgument, e.insert(t, vq, "for q", ""))
		app("valid message with one of another pchannel", streamwal.ErrInvalidArgument, ok, e.insert(t, vq, "for q", ""))
		e.nothingWritten(ctx, t, "appends of q's messages to p's writer", wq, vq, &lastQ)
		barrier, err := e.codec.NewPChannelBody(messages.TypeRecoveryBarrier, p, messages.RecoveryBarrierBody{Term: 1})
		if err != nil {
			t.Fatal(err)
		}
		app("append of a RecoveryBarrier", streamwal.ErrInvalidArgument, barrier)
		app("valid message with a RecoveryBarrier", streamwal.ErrInvalidArgument, ok, barrier)

		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err = w.Append(cctx, ok)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("append with a cancelled context: %v, want context.Canceled", err)
		}
		written("append with a cancelled context")

		// The largest batch goes through, contiguously.
		full := over[:maxBatch(b)]
		appendOne(ctx, t, w, full...)
		last += messages.MessageID(len(full))
		written("the largest batch")
	})

	t.Run("MessageSize", func(t *testing.T) {
		limit := maxMsgSize(b)
		payload := bytes.Repeat([]byte{'x'}, e.codec.MaxPayload())
		if limit == 0 {
			t.Skip("the backend does not say its message size limit")
		}
		// The codec's largest payload fits the backend.
		m, err := e.codec.New(messages.TypeInsert, v, payload)
		if err != nil {
			t.Fatal(err)
		}
		id := appendOne(ctx, t, w, m)[0]
		if id != last+1 {
			t.Errorf("the message at the payload limit landed at %d, want %d", id, last+1)
		}
		last = id
		got := mustReadRange(ctx, t, b, p, jetstream.ReadOptions{Start: jetstream.From(id)}, id)
		if len(got) != 1 || !bytes.Equal(got[0].Payload(), payload) {
			t.Errorf("the message at the payload limit did not read back whole")
		}
		// Properties on top push it over the backend's limit.
		value := strings.Repeat("p", messages.MaxPropValueLen)
		var opts []messages.Option
		for i := range min(messages.MaxProps, (limit-len(payload))/messages.MaxPropValueLen+2) {
			opts = append(opts, messages.WithProperty(fmt.Sprint("k", i), value))
		}
		big, err := e.codec.New(messages.TypeInsert, v, payload, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if big.Size() <= limit {
			t.Skipf("cannot build a message over the limit of %d bytes (got %d)", limit, big.Size())
		}
		for _, msgs := range [][]*messages.MutableMessage{{big}, {e.insert(t, v, "small", ""), big}} {
			_, err := w.Append(ctx, msgs...)
			expectCode(t, fmt.Sprintf("append of a %d-byte message in a batch of %d", big.Size(), len(msgs)), err, streamwal.ErrInvalidArgument)
			written("oversize message")
		}
	})

	t.Run("Read", func(t *testing.T) {
		read := func(what string, p streamwal.PChannel, opts jetstream.ReadOptions, want error) {
			t.Helper()
			sc, err := b.Read(ctx, p, opts)
			if err == nil {
				_ = sc.Close()
			}
			expectCode(t, what, err, want)
		}
		cl := e.codec.Cluster()
		read("read the zero pchannel", streamwal.PChannel{}, jetstream.ReadOptions{}, streamwal.ErrInvalidArgument)
		read("read from message 0", p, jetstream.ReadOptions{Start: jetstream.From(0)}, streamwal.ErrInvalidArgument)
		read("read from an unknown start kind", p, jetstream.ReadOptions{Start: jetstream.StartPosition{Kind: 200, ID: 1}}, streamwal.ErrInvalidArgument)
		for _, f := range [][]string{
			cl.VChannelFilter(vq), {cl.PChannelLevelFilter(q)}, cl.PChannelFilter(q), {cl.AllVChannelsFilter(q)},
			{"wal.>"}, {">"}, {""}, {"foo.bar"}, {cl.AllVChannelsFilter(p), cl.AllVChannelsFilter(q)},
			{cl.TypeFilter(messages.TypeInsert.Token)},
		} {
			read(fmt.Sprintf("read %s with filters %q", p, f), p, jetstream.ReadOptions{Filters: f}, streamwal.ErrInvalidArgument)
		}
		written("bad reads")
	})

	t.Run("Truncate", func(t *testing.T) {
		expectCode(t, "truncate below 0", b.Truncate(ctx, p, 0), streamwal.ErrInvalidArgument)
		expectCode(t, "truncate the zero pchannel", b.Truncate(ctx, streamwal.PChannel{}, 5), streamwal.ErrInvalidArgument)
		_, err := b.State(ctx, streamwal.PChannel{})
		expectCode(t, "state of the zero pchannel", err, streamwal.ErrInvalidArgument)
		written("bad truncations")
		got := mustReadRange(ctx, t, b, p, jetstream.ReadOptions{Start: jetstream.Earliest()}, w.Barrier().ID())
		sameIDs(t, "earliest after bad truncations", got, []messages.MessageID{w.Barrier().ID()})
	})

	t.Run("RestrictedPChannels", func(t *testing.T) {
		if e.h.NewRestricted == nil {
			t.Skip("the harness cannot restrict a backend's pchannels")
		}
		rb := e.h.NewRestricted(t, []streamwal.PChannel{p})
		t.Cleanup(func() { _ = rb.Close() })
		other := e.pchannel(t, "bad")
		for _, c := range []streamwal.PChannel{q, other} {
			nw, err := rb.OpenWriter(ctx, c, 5)
			if err == nil {
				_ = nw.Close()
			}
			expectCode(t, "open a pchannel the backend does not serve", err, streamwal.ErrInvalidArgument)
			sc, err := rb.Read(ctx, c, jetstream.ReadOptions{})
			if err == nil {
				_ = sc.Close()
			}
			expectCode(t, "read a pchannel the backend does not serve", err, streamwal.ErrInvalidArgument)
			expectCode(t, "truncate a pchannel the backend does not serve", rb.Truncate(ctx, c, 1), streamwal.ErrInvalidArgument)
			_, err = rb.State(ctx, c)
			expectCode(t, "state of a pchannel the backend does not serve", err, streamwal.ErrInvalidArgument)
		}
		e.nothingWritten(ctx, t, "restricted backend", wq, vq, &lastQ)
		got := mustReadRange(ctx, t, rb, p, jetstream.ReadOptions{Start: jetstream.Earliest()}, w.Barrier().ID())
		sameIDs(t, "a served pchannel", got, []messages.MessageID{w.Barrier().ID()})
	})

	t.Run("ClosedWriter", func(t *testing.T) {
		if err := w.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := w.Close(); err != nil {
			t.Errorf("second close: %v", err)
		}
		_, err := w.Append(ctx, e.insert(t, v, "closed", ""))
		expectCode(t, "append on a closed writer", err, streamwal.ErrClosed)
		f := w.AppendAsync(ctx, e.insert(t, v, "closed async", ""))
		if !closedWithin(f.Done(), promptly) {
			t.Fatal("async append on a closed writer never resolved")
		}
		_, err = f.Result()
		expectCode(t, "async append on a closed writer", err, streamwal.ErrClosed)
		w2 := openWriter(ctx, t, b, p, 2)
		if w2.Barrier().ID() != last+1 {
			t.Errorf("appends on a closed writer wrote: the next barrier landed at %d, want %d", w2.Barrier().ID(), last+1)
		}
	})
}
