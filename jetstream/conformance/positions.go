package conformance

import (
	"context"
	"fmt"
	"testing"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// testStartPositions checks Earliest, Latest, From, After, and From below
// the first message left by truncation.
func (e *env) testStartPositions(t *testing.T) {
	ctx := testContext(t)
	b := e.backend(t)
	p := e.pchannel(t, "pos")
	v := vchannel(t, p, 1)
	w := openWriter(ctx, t, b, p, 1)

	all := []messages.MessageID{w.Barrier().ID()}
	for i := range 12 {
		n := 1
		if i%4 == 3 {
			n = 3
		}
		msgs := make([]*messages.MutableMessage, n)
		for k := range msgs {
			msgs[k] = e.insert(t, v, fmt.Sprintf("pos %d.%d", i, k), "")
		}
		all = append(all, appendOne(ctx, t, w, msgs...)...)
	}
	last := all[len(all)-1]
	read := func(start jetstream.StartPosition, through messages.MessageID) []*messages.ImmutableMessage {
		t.Helper()
		return mustReadRange(ctx, t, b, p, jetstream.ReadOptions{Start: start}, through)
	}

	sameIDs(t, "earliest", read(jetstream.Earliest(), last), all)
	for _, i := range []int{0, 1, 5, len(all) - 1} {
		sameIDs(t, fmt.Sprintf("from %d", all[i]), read(jetstream.From(all[i]), last), all[i:])
	}
	for _, i := range []int{0, 1, 5, len(all) - 2} {
		sameIDs(t, fmt.Sprintf("after %d", all[i]), read(jetstream.After(all[i]), last), all[i+1:])
	}

	// Positions past the tail deliver what is appended afterwards.
	for i := range 3 {
		start := []jetstream.StartPosition{jetstream.Latest(), jetstream.After(last), jetstream.From(last + 1)}[i]
		sc, err := b.Read(ctx, p, jetstream.ReadOptions{Start: start})
		if err != nil {
			t.Fatalf("read from %s: %v", start, err)
		}
		ids := appendOne(ctx, t, w, e.insert(t, v, "new 1 "+start.String(), ""), e.insert(t, v, "new 2 "+start.String(), ""))
		got, err := readThrough(ctx, sc, ids[1])
		_ = sc.Close()
		if err != nil {
			t.Fatalf("read from %s: %v", start, err)
		}
		sameIDs(t, start.String()+" (taken before the append)", got, ids)
		last = ids[1]
	}

	// Latest ignores everything already in the stream, however much.
	sc, err := b.Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Latest()})
	if err != nil {
		t.Fatalf("read from latest: %v", err)
	}
	ids := appendOne(ctx, t, w, e.insert(t, v, "after latest", ""))
	got, err := readThrough(ctx, sc, ids[0])
	_ = sc.Close()
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, "latest", got, ids)
	if len(got) == 1 && string(got[0].Payload()) != "after latest" {
		t.Errorf("latest delivered %q", got[0].Payload())
	}

	t.Run("AfterTruncation", func(t *testing.T) { e.startAfterTruncation(ctx, t, b) })
}

// startAfterTruncation checks that a start below the first message left by
// truncation begins at the first message still there, or, with an archive,
// where it says.
func (e *env) startAfterTruncation(ctx context.Context, t *testing.T, b jetstream.Backend) {
	p := e.pchannel(t, "postr")
	v := vchannel(t, p, 1)
	w1 := openWriter(ctx, t, b, p, 1)
	history := []messages.MessageID{w1.Barrier().ID()}
	for i := range 5 {
		history = append(history, appendOne(ctx, t, w1, e.insert(t, v, fmt.Sprint("term 1 #", i), ""))...)
	}
	if err := w1.Close(); err != nil {
		t.Fatal(err)
	}
	w2 := openWriter(ctx, t, b, p, 2)
	b2 := w2.Barrier().ID()
	history = append(history, b2)
	var xs []messages.MessageID
	for i := range 10 {
		xs = append(xs, appendOne(ctx, t, w2, e.insert(t, v, fmt.Sprint("term 2 #", i), ""))...)
	}
	last := xs[len(xs)-1]
	if err := b.Truncate(ctx, p, xs[3]); err != nil {
		t.Fatalf("truncate below %d: %v", xs[3], err)
	}
	// Without an archive a start below what truncation left begins there;
	// with one, nothing is lost.
	left, truncated := append([]messages.MessageID{b2}, xs[3:]...), xs[3:]
	after1 := left
	if e.h.Archive {
		history = append(history, xs...)
		left, after1, truncated = history, history[1:], xs
	}
	read := func(start jetstream.StartPosition) []*messages.ImmutableMessage {
		t.Helper()
		return mustReadRange(ctx, t, b, p, jetstream.ReadOptions{Start: start}, last)
	}
	sameIDs(t, "earliest after truncation", read(jetstream.Earliest()), left)
	sameIDs(t, "from 1 after truncation", read(jetstream.From(1)), left)
	sameIDs(t, "after 1 after truncation", read(jetstream.After(1)), after1)
	sameIDs(t, fmt.Sprintf("from %d (truncated) after truncation", xs[0]), read(jetstream.From(xs[0])), truncated)
	sameIDs(t, fmt.Sprintf("after %d (the barrier) after truncation", b2), read(jetstream.After(b2)), truncated)
}

// testFilters checks that a VChannel filter delivers the VChannel's
// messages and the PChannel-level ones, and nothing else.
func (e *env) testFilters(t *testing.T) {
	ctx := testContext(t)
	b := e.backend(t)
	p := e.pchannel(t, "filt")
	v1, v2 := vchannel(t, p, 1), vchannel(t, p, 2)
	w := openWriter(ctx, t, b, p, 1)

	// kind of every message: "v1", "v2" or "p" (PChannel-level).
	kind := map[messages.MessageID]string{w.Barrier().ID(): "p"}
	order := []messages.MessageID{w.Barrier().ID()}
	build := func(i int) (*messages.MutableMessage, string) {
		switch i % 3 {
		case 0:
			return e.insert(t, v1, fmt.Sprint("v1 #", i), ""), "v1"
		case 1:
			return e.insert(t, v2, fmt.Sprint("v2 #", i), ""), "v2"
		}
		return e.timeTick(t, p), "p"
	}
	for i := range 15 {
		if i%5 == 4 { // a multi-message append mixing all three
			var msgs []*messages.MutableMessage
			var kinds []string
			for k := range 4 {
				m, kd := build(i + k)
				msgs, kinds = append(msgs, m), append(kinds, kd)
			}
			for k, id := range appendOne(ctx, t, w, msgs...) {
				kind[id], order = kinds[k], append(order, id)
			}
			continue
		}
		m, kd := build(i)
		id := appendOne(ctx, t, w, m)[0]
		kind[id], order = kd, append(order, id)
	}
	// The last message is PChannel-level, so the reads of the VChannel
	// filters run to the end of the stream.
	id := appendOne(ctx, t, w, e.timeTick(t, p))[0]
	kind[id], order = "p", append(order, id)

	cl := e.codec.Cluster()
	cases := []struct {
		name    string
		filters []string
		match   func(string) bool
		check   func(*messages.ImmutableMessage) error
	}{
		{"vchannel 1", cl.VChannelFilter(v1), func(k string) bool { return k != "v2" }, vchannelIs(v1)},
		{"vchannel 2", cl.VChannelFilter(v2), func(k string) bool { return k != "v1" }, vchannelIs(v2)},
		{"pchannel level", []string{cl.PChannelLevelFilter(p)}, func(k string) bool { return k == "p" }, vchannelIs(streamwal.VChannel{})},
		{"all vchannels", []string{cl.AllVChannelsFilter(p)}, func(k string) bool { return k != "p" }, nil},
		{"pchannel", cl.PChannelFilter(p), func(string) bool { return true }, nil},
		{"two vchannels", append(cl.VChannelFilter(v1), cl.VChannelFilter(v2)[0]), func(string) bool { return true }, nil},
	}
	for _, c := range cases {
		for _, start := range []jetstream.StartPosition{jetstream.Earliest(), jetstream.From(order[len(order)/2])} {
			var want []messages.MessageID
			for _, id := range order {
				if c.match(kind[id]) && (start.Kind == jetstream.StartEarliest || id >= start.ID) {
					want = append(want, id)
				}
			}
			got := mustReadRange(ctx, t, b, p, jetstream.ReadOptions{Start: start, Filters: c.filters}, want[len(want)-1])
			sameIDs(t, c.name+" from "+start.String(), got, want)
			for _, m := range got {
				if c.check != nil {
					if err := c.check(m); err != nil {
						t.Errorf("%s: %v", c.name, err)
					}
				}
			}
		}
	}
}

// vchannelIs checks that a message is PChannel-level or on v.
func vchannelIs(v streamwal.VChannel) func(*messages.ImmutableMessage) error {
	return func(m *messages.ImmutableMessage) error {
		if m.VChannel().IsZero() || m.VChannel() == v {
			return nil
		}
		return fmt.Errorf("message %d of %s delivered", m.ID(), m.VChannel())
	}
}
