package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/internal/testbed"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// archiveEnv is one embedded server and a backend with Archive on.
type archiveEnv struct {
	t     *testing.T
	ctx   context.Context
	nc    *nats.Conn
	codec *messages.Codec
	b     *jetstream.JetStream
}

// newArchiveEnv starts a server and a backend with opts (Archive set).
func newArchiveEnv(t *testing.T, opts jetstream.Options) *archiveEnv {
	t.Helper()
	opts.Archive = true
	tb := testbed.Start(t, testbed.Config{Cluster: "arch", Backend: opts})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return &archiveEnv{t: t, ctx: ctx, nc: tb.Conn, codec: tb.Codec, b: tb.Backend}
}

// pchannel returns PChannel i of the test.
func (e *archiveEnv) pchannel(i int) streamwal.PChannel {
	p, err := streamwal.NewPChannel("arch", i)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// open opens a writer on p under term, closed when the test ends.
func (e *archiveEnv) open(p streamwal.PChannel, term uint64) jetstream.Writer {
	e.t.Helper()
	w, err := e.b.OpenWriter(e.ctx, p, term)
	if err != nil {
		e.t.Fatalf("open %s under term %d: %v", p, term, err)
	}
	e.t.Cleanup(func() { _ = w.Close() })
	return w
}

// appendN appends n inserts to v, one at a time, and returns their IDs.
func (e *archiveEnv) appendN(w jetstream.Writer, v streamwal.VChannel, n int, what string) []messages.MessageID {
	e.t.Helper()
	var ids []messages.MessageID
	for i := range n {
		m, err := e.codec.New(messages.TypeInsert, v, []byte(fmt.Sprintf("%s #%d", what, i)))
		if err != nil {
			e.t.Fatal(err)
		}
		got, err := w.Append(e.ctx, m)
		if err != nil {
			e.t.Fatalf("append: %v", err)
		}
		ids = append(ids, got...)
	}
	return ids
}

// read reads p from start until a message at or above last.
func (e *archiveEnv) read(p streamwal.PChannel, opts jetstream.ReadOptions, last messages.MessageID) []*messages.ImmutableMessage {
	e.t.Helper()
	sc, err := e.b.Read(e.ctx, p, opts)
	if err != nil {
		e.t.Fatalf("read %s from %s: %v", p, opts.Start, err)
	}
	defer func() { _ = sc.Close() }()
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	var out []*messages.ImmutableMessage
	for m, err := range sc.All(ctx) {
		if err != nil {
			e.t.Fatalf("read %s from %s: after %d messages: %v", p, opts.Start, len(out), err)
		}
		out = append(out, m)
		if m.ID() >= last {
			break
		}
	}
	return out
}

// ids lists the IDs of ms.
func ids(ms []*messages.ImmutableMessage) []messages.MessageID {
	out := make([]messages.MessageID, len(ms))
	for i, m := range ms {
		out[i] = m.ID()
	}
	return out
}

// span lists from..to.
func span(from, to messages.MessageID) []messages.MessageID {
	var out []messages.MessageID
	for id := from; id <= to; id++ {
		out = append(out, id)
	}
	return out
}

// state reads p's state.
func (e *archiveEnv) state(p streamwal.PChannel) jetstream.StreamState {
	e.t.Helper()
	st, err := e.b.State(e.ctx, p)
	if err != nil {
		e.t.Fatalf("state of %s: %v", p, err)
	}
	return st
}

func TestArchiveTruncateRead(t *testing.T) {
	e := newArchiveEnv(t, jetstream.Options{ArchiveObjectBytes: 4096})
	p := e.pchannel(0)
	v, _ := p.VChannel(1, 0)
	w := e.open(p, 1)
	got := e.appendN(w, v, 99, "a")
	last := got[len(got)-1]
	if err := e.b.Truncate(e.ctx, p, 50); err != nil {
		t.Fatal(err)
	}
	all := e.read(p, jetstream.ReadOptions{Start: jetstream.Earliest()}, last)
	if !slices.Equal(ids(all), span(1, last)) {
		t.Fatalf("earliest after truncation: %v", ids(all))
	}
	for i, m := range all[1:] {
		if want := fmt.Sprintf("a #%d", i); string(m.Payload()) != want {
			t.Fatalf("message %d: payload %q, want %q", m.ID(), m.Payload(), want)
		}
	}
	st := e.state(p)
	if st.First != 50 || st.Last != last || st.Messages != uint64(last-49) || st.ArchivedBelow != 50 {
		t.Errorf("state %+v", st)
	}
	for _, id := range []messages.MessageID{1, 2, 30, 49, 50, 51} {
		m, err := e.b.Get(e.ctx, p, id)
		if err != nil || m.ID() != id {
			t.Errorf("get %d: %v %v", id, m, err)
		}
	}
}

// TestArchiveAdvance: Advance archives the stream, then moves it so that
// the next message stored (the next writer's barrier) gets the ID asked
// for, even far past the last; reads from Earliest then cross the gap.
func TestArchiveAdvance(t *testing.T) {
	e := newArchiveEnv(t, jetstream.Options{ArchiveObjectBytes: 4096})
	p := e.pchannel(1)
	v, _ := p.VChannel(1, 0)
	w := e.open(p, 1)
	before := append([]messages.MessageID{w.Barrier().ID()}, e.appendN(w, v, 20, "before")...)
	if err := e.b.Truncate(e.ctx, p, 8); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	last := before[len(before)-1]
	for _, next := range []messages.MessageID{0, last} {
		err := e.b.Advance(e.ctx, p, next)
		if !errors.Is(err, streamwal.ErrInvalidArgument) {
			t.Errorf("advance to %d with messages up to %d: %v", next, last, err)
		}
	}
	next := last + 1000
	if err := e.b.Advance(e.ctx, p, next); err != nil {
		t.Fatal(err)
	}
	st := e.state(p)
	if st != (jetstream.StreamState{First: next, Last: next - 1, ArchivedBelow: last + 1}) {
		t.Errorf("state after advancing to %d: %+v", next, st)
	}
	w2 := e.open(p, 2)
	if got := w2.Barrier().ID(); got != next {
		t.Fatalf("the barrier after advancing to %d landed at %d", next, got)
	}
	after := append([]messages.MessageID{next}, e.appendN(w2, v, 5, "after")...)
	want := append(slices.Clone(before), after...)
	if got := ids(e.read(p, jetstream.ReadOptions{Start: jetstream.Earliest()}, after[len(after)-1])); !slices.Equal(got, want) {
		t.Errorf("earliest after advancing: %v, want %v", got, want)
	}
	if got := ids(e.read(p, jetstream.ReadOptions{Start: jetstream.From(last + 1)}, after[len(after)-1])); !slices.Equal(got, after) {
		t.Errorf("from the gap after advancing: %v, want %v", got, after)
	}
	if err := e.b.Advance(e.ctx, p, after[len(after)-1]+1); err != nil {
		t.Errorf("advance right after the last message: %v", err)
	}
	if st := e.state(p); st.ArchivedBelow != after[len(after)-1]+1 || st.Messages != 0 {
		t.Errorf("state after the second advance: %+v", st)
	}
}

// TestAdvanceWithoutArchive: without an archive Advance only moves the
// stream; the purge with a sequence past the last compacts the stream to
// it (nats-server behaviour this relies on).
func TestAdvanceWithoutArchive(t *testing.T) {
	e := newArchiveEnv(t, jetstream.Options{})
	b, err := jetstream.New(e.nc, e.codec, jetstream.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := e.pchannel(2)
	v, _ := p.VChannel(1, 0)
	w, err := b.OpenWriter(e.ctx, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	last := e.appendN(w, v, 3, "x")[2]
	_ = w.Close()
	if err := b.Advance(e.ctx, p, last+50); err != nil {
		t.Fatal(err)
	}
	js, err := njs.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(e.ctx, e.codec.Cluster().StreamName(p))
	if err != nil {
		t.Fatal(err)
	}
	if st := s.CachedInfo().State; st.FirstSeq != uint64(last+50) || st.LastSeq != uint64(last+49) || st.Msgs != 0 {
		t.Errorf("stream after advancing to %d: %+v", last+50, st)
	}
	if st, err := b.State(e.ctx, p); err != nil || st != (jetstream.StreamState{First: last + 50, Last: last + 49}) {
		t.Errorf("state: %+v, %v", st, err)
	}
	if _, err := js.ObjectStore(e.ctx, e.codec.Cluster().ObjectStoreName(streamwal.ObjectStoreSegments)); !errors.Is(err, njs.ErrBucketNotFound) {
		t.Errorf("a backend without archive touched the object store: %v", err)
	}
	w2, err := b.OpenWriter(e.ctx, p, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w2.Close() }()
	if w2.Barrier().ID() != last+50 {
		t.Errorf("barrier at %d, want %d", w2.Barrier().ID(), last+50)
	}
}

// TestArchiveEnabledLater: a stream truncated before the archive was
// turned on archives from where it was cut; the IDs already lost are an
// empty range.
func TestArchiveEnabledLater(t *testing.T) {
	e := newArchiveEnv(t, jetstream.Options{})
	plain, err := jetstream.New(e.nc, e.codec, jetstream.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := e.pchannel(3)
	v, _ := p.VChannel(1, 0)
	w := e.open(p, 1)
	all := e.appendN(w, v, 30, "x")
	if err := plain.Truncate(e.ctx, p, 10); err != nil {
		t.Fatal(err)
	}
	if st := e.state(p); st.First != 10 || st.ArchivedBelow != 0 {
		t.Errorf("state before archiving: %+v", st)
	}
	if err := e.b.Truncate(e.ctx, p, 5); err != nil { // only the barrier is there
		t.Fatal(err)
	}
	if err := e.b.Truncate(e.ctx, p, 20); err != nil {
		t.Fatal(err)
	}
	want := append([]messages.MessageID{1}, all[8:]...) // the barrier, then 10..
	if got := ids(e.read(p, jetstream.ReadOptions{Start: jetstream.Earliest()}, all[29])); !slices.Equal(got, want) {
		t.Errorf("earliest: %v, want %v", got, want)
	}
	if got := ids(e.read(p, jetstream.ReadOptions{Start: jetstream.From(3)}, all[29])); !slices.Equal(got, want[1:]) {
		t.Errorf("from 3: %v, want %v", got, want[1:])
	}
	if st := e.state(p); st.First != 20 || st.ArchivedBelow != 20 || st.Last != all[29] {
		t.Errorf("state: %+v", st)
	}
}

// TestStateWithoutArchive: State finds the truncation point from the
// stream alone.
func TestStateWithoutArchive(t *testing.T) {
	e := newArchiveEnv(t, jetstream.Options{})
	b, err := jetstream.New(e.nc, e.codec, jetstream.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := e.pchannel(4)
	if st, err := b.State(e.ctx, p); err != nil || st != (jetstream.StreamState{First: 1}) {
		t.Errorf("state of a new stream: %+v, %v", st, err)
	}
	v, _ := p.VChannel(1, 0)
	w := e.open(p, 1)
	if st, err := b.State(e.ctx, p); err != nil || st != (jetstream.StreamState{First: 1, Last: 1, Messages: 1}) {
		t.Errorf("state with the barrier only: %+v, %v", st, err)
	}
	all := e.appendN(w, v, 10, "x")
	if err := b.Truncate(e.ctx, p, 2); err != nil {
		t.Fatal(err)
	}
	if st, err := b.State(e.ctx, p); err != nil || st != (jetstream.StreamState{First: 1, Last: all[9], Messages: 11}) {
		t.Errorf("state after truncating below the first insert: %+v, %v", st, err)
	}
	if err := b.Truncate(e.ctx, p, 6); err != nil {
		t.Fatal(err)
	}
	if st, err := b.State(e.ctx, p); err != nil || st != (jetstream.StreamState{First: 6, Last: all[9], Messages: 6}) {
		t.Errorf("state after truncating below 6: %+v, %v", st, err)
	}
}
