package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// testHeadersOnly checks ReadOptions.HeadersOnly: every message is
// delivered, in order, with the properties and payload size of the whole
// message; those of the types asked for whole come whole, the others
// without payload (or whole, read from an archive); filters still apply;
// after a truncation the same holds across the archive; a nil type among
// those asked for whole is refused.
func (e *env) testHeadersOnly(t *testing.T) {
	ctx := testContext(t)
	b := e.backend(t)
	p := e.pchannel(t, "hdr")
	v1, v2 := vchannel(t, p, 1), vchannel(t, p, 2)
	w := openWriter(ctx, t, b, p, 1)
	for i := range 40 {
		v := []streamwal.VChannel{v1, v2}[i%2]
		msgs := []*messages.MutableMessage{e.insert(t, v, strings.Repeat("x", 1+i*37), "")}
		switch i % 5 {
		case 1:
			msgs = append(msgs, e.timeTick(t, p))
		case 3:
			msgs = append(msgs, e.flush(t, v, int64(i)))
		}
		appendOne(ctx, t, w, msgs...)
	}
	last := appendOne(ctx, t, w, e.flush(t, v1, 99))[0]
	whole := []*messages.Type{messages.TypeFlush}
	check := func(what string, opts jetstream.ReadOptions) {
		t.Helper()
		full := mustReadRange(ctx, t, b, p, jetstream.ReadOptions{Start: opts.Start, Filters: opts.Filters}, last)
		opts.HeadersOnly, opts.Whole = true, whole
		got := mustReadRange(ctx, t, b, p, opts, last)
		sameIDs(t, what, got, idsOf(full))
		for i := range min(len(got), len(full)) {
			if err := sameButPayload(full[i], got[i], whole); err != nil {
				t.Errorf("%s: message %d: %v", what, got[i].ID(), err)
			}
		}
	}
	check("earliest", jetstream.ReadOptions{Start: jetstream.Earliest()})
	check("from the middle", jetstream.ReadOptions{Start: jetstream.From(last / 2)})
	check("one vchannel", jetstream.ReadOptions{Start: jetstream.Earliest(), Filters: e.codec.Cluster().VChannelFilter(v1)})

	if err := b.Truncate(ctx, p, last/2); err != nil {
		t.Fatalf("truncate below %d: %v", last/2, err)
	}
	if e.h.Archive {
		check("earliest across the archive", jetstream.ReadOptions{Start: jetstream.Earliest()})
	}
	check("after truncation", jetstream.ReadOptions{Start: jetstream.From(last / 2)})

	_, err := b.Read(ctx, p, jetstream.ReadOptions{HeadersOnly: true, Whole: []*messages.Type{nil}})
	expectCode(t, "read with a nil whole type", err, streamwal.ErrInvalidArgument)
}

// flush builds a Flush of v naming segment id.
func (e *env) flush(t *testing.T, v streamwal.VChannel, id int64) *messages.MutableMessage {
	t.Helper()
	m, err := e.codec.NewBody(messages.TypeFlush, v, messages.FlushBody{SegmentIDs: []int64{id}})
	if err != nil {
		t.Fatalf("build flush: %v", err)
	}
	return m
}

// sameButPayload reports how got, read with HeadersOnly and the types
// whole, differs from full, read whole, beyond what HeadersOnly allows.
func sameButPayload(full, got *messages.ImmutableMessage, whole []*messages.Type) error {
	switch {
	case got.Type() != full.Type():
		return fmt.Errorf("type %s, want %s", got.Type().Name, full.Type().Name)
	case got.PayloadSize() != full.PayloadSize():
		return fmt.Errorf("payload size %d, want %d", got.PayloadSize(), full.PayloadSize())
	case fmt.Sprint(got.Header()) != fmt.Sprint(full.Header()):
		return fmt.Errorf("header %v, want %v", got.Header(), full.Header())
	}
	for _, t := range whole {
		if t == got.Type() && got.HeadersOnly() {
			return fmt.Errorf("a %s came without its payload", t.Name)
		}
	}
	if !got.HeadersOnly() {
		if !bytes.Equal(got.Payload(), full.Payload()) {
			return fmt.Errorf("payload %q, want %q", got.Payload(), full.Payload())
		}
		return nil
	}
	if got.Payload() != nil {
		return fmt.Errorf("a headers-only message has a payload of %d bytes", len(got.Payload()))
	}
	if got.Type().Body != nil {
		if err := got.Body(&messages.TimeTickBody{}); !errors.Is(err, messages.ErrNoPayload) {
			return fmt.Errorf("body of a headers-only message: %v, want ErrNoPayload", err)
		}
	}
	return nil
}
