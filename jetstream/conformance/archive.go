package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// archiveRounds is how many append, truncate and reopen rounds the archive
// test runs.
const archiveRounds = 8

// appended is one message the archive test appended.
type appended struct {
	id      messages.MessageID
	kind    string // "v1", "v2" or "p"
	payload string
	msgID   string
	term    uint64
}

// archiveRun is the state of the archive test on one PChannel.
type archiveRun struct {
	e       *env
	ctx     context.Context
	t       *testing.T
	b       jetstream.Backend
	p       streamwal.PChannel
	v1, v2  streamwal.VChannel
	rng     *rand.Rand
	history []appended
	// archived is the archive's end the truncations so far must leave.
	archived messages.MessageID
}

// testArchive: with an archive, truncation loses nothing. After rounds of
// appends, truncations (inside the stream, below the archive's end, beyond
// the tail) and reopens under higher terms from other backends, a read
// from Earliest delivers every message ever appended exactly once and in
// order, filtered too; reads from inside the archive and at its boundary
// continue on the stream without a gap or a repeat; State reports the
// truncation point while Earliest still starts at 1; a read that crosses
// the archive while truncations move its end misses nothing; Get reaches
// archived messages; Close and cancellation stop a scanner in the archive.
func (e *env) testArchive(t *testing.T) {
	if !e.h.Archive {
		t.Skip("the backend keeps no archive")
	}
	ctx := testContext(t)
	p := e.pchannel(t, "arch")
	seed := uint64(pchannelSeq.Load())
	r := &archiveRun{e: e, ctx: ctx, t: t, b: e.backend(t), p: p,
		v1: vchannel(t, p, 1), v2: vchannel(t, p, 2), rng: rand.New(rand.NewPCG(seed, 7))}
	t.Logf("seed %d", seed)
	var w jetstream.Writer
	for round := 1; round <= archiveRounds; round++ {
		w = r.reopen(w, uint64(round))
		r.appendSome(w, 30+r.rng.IntN(40), round)
		r.truncate(r.pickTruncation(), fmt.Sprint("round ", round))
		r.checkEarliest(fmt.Sprint("round ", round))
	}
	if r.archived <= 1 || len(r.history) == 0 || r.history[0].id != 1 {
		t.Fatalf("the rounds archived below %d of %d messages", r.archived, len(r.history))
	}
	t.Run("Filters", func(t *testing.T) { r.withT(t).checkFilters() })
	t.Run("Boundary", func(t *testing.T) { r.withT(t).checkBoundary() })
	t.Run("Get", func(t *testing.T) { r.withT(t).checkGet() })
	t.Run("ReadWhileTruncating", func(t *testing.T) { r.withT(t).checkMovingEnd(w) })
	t.Run("HandOffWhileTruncating", func(t *testing.T) { r.withT(t).checkHandOffRace(w) })
	t.Run("Lifecycle", func(t *testing.T) { r.withT(t).checkLifecycle() })
	t.Run("RestartServer", func(t *testing.T) {
		if e.h.RestartServer == nil {
			t.Skip("the harness cannot restart the server")
		}
		r.withT(t).checkRestart()
	})
}

// withT returns the run for a subtest: the same run (what a subtest
// appends and truncates stays in the history the later ones check),
// reporting to t until the subtest ends.
func (r *archiveRun) withT(t *testing.T) *archiveRun {
	prev := r.t
	r.t = t
	t.Cleanup(func() { r.t = prev })
	return r
}

// reopen opens p under term, from a new backend every other round, which
// fences the previous writer.
func (r *archiveRun) reopen(prev jetstream.Writer, term uint64) jetstream.Writer {
	r.t.Helper()
	b := r.b
	if term%2 == 0 {
		b = r.e.backend(r.t)
	}
	w := openWriter(r.ctx, r.t, b, r.p, term)
	if prev != nil {
		_ = prev.Close()
	}
	r.history = append(r.history, appended{id: w.Barrier().ID(), kind: "p", term: term})
	return w
}

// appendSome appends n messages in appends of one to four, mixing the two
// VChannels and PChannel-level time ticks.
func (r *archiveRun) appendSome(w jetstream.Writer, n, round int) {
	r.t.Helper()
	for i := 0; i < n; {
		k := min(1+r.rng.IntN(4), n-i)
		msgs := make([]*messages.MutableMessage, k)
		recs := make([]appended, k)
		for j := range msgs {
			msgs[j], recs[j] = r.message(round, i+j, w.Term())
		}
		for j, id := range appendOne(r.ctx, r.t, w, msgs...) {
			recs[j].id = id
		}
		r.history, i = append(r.history, recs...), i+k
	}
}

// message builds message i of a round.
func (r *archiveRun) message(round, i int, term uint64) (*messages.MutableMessage, appended) {
	r.t.Helper()
	rec := appended{term: term, payload: fmt.Sprintf("round %d #%d", round, i), msgID: fmt.Sprintf("arch-%d-%d", round, i)}
	switch r.rng.IntN(5) {
	case 0:
		rec.kind, rec.payload, rec.msgID = "p", "", ""
		return r.e.timeTick(r.t, r.p), rec
	case 1, 2:
		rec.kind = "v2"
		return r.e.insert(r.t, r.v2, rec.payload, rec.msgID), rec
	}
	rec.kind = "v1"
	return r.e.insert(r.t, r.v1, rec.payload, rec.msgID), rec
}

// pickTruncation chooses where to truncate: mostly inside what the stream
// holds, sometimes below the archive's end (nothing to do) or beyond the
// tail.
func (r *archiveRun) pickTruncation() messages.MessageID {
	last := r.history[len(r.history)-1].id
	from := max(r.archived, 1)
	switch r.rng.IntN(6) {
	case 0:
		return max(from/2, 1)
	case 1:
		return last + 1 + messages.MessageID(r.rng.IntN(50))
	}
	return from + messages.MessageID(r.rng.IntN(int(last-from)+1))
}

// truncate truncates below id and checks State.
func (r *archiveRun) truncate(below messages.MessageID, what string) {
	r.t.Helper()
	if err := r.b.Truncate(r.ctx, r.p, below); err != nil {
		r.t.Fatalf("%s: truncate below %d: %v", what, below, err)
	}
	last := r.history[len(r.history)-1].id
	r.archived = max(r.archived, min(below, last+1))
	want := jetstream.StreamState{First: last + 1, Last: last, ArchivedBelow: r.archived}
	if r.archived <= 1 {
		want.ArchivedBelow = 0 // nothing is archived below the first message
	}
	for _, a := range r.history {
		if a.id >= r.archived {
			want.First = min(want.First, a.id)
			want.Messages++
		}
	}
	r.e.checkState(r.ctx, r.t, r.b, r.p, fmt.Sprintf("%s, below %d", what, below), want)
}

// expected lists the history from `from` on that match, as the reads
// should deliver it.
func (r *archiveRun) expected(from messages.MessageID, match func(string) bool) []appended {
	var out []appended
	for _, a := range r.history {
		if a.id >= from && (match == nil || match(a.kind)) {
			out = append(out, a)
		}
	}
	return out
}

// read reads with opts through the last expected message and checks what
// it delivered against want: IDs, order, payloads, message IDs, terms.
func (r *archiveRun) read(what string, opts jetstream.ReadOptions, want []appended) {
	r.t.Helper()
	if len(want) == 0 {
		r.t.Fatalf("%s: nothing to read", what)
	}
	got := mustReadRange(r.ctx, r.t, r.b, r.p, opts, want[len(want)-1].id)
	r.same(what, got, want)
}

// same compares delivered messages with the history.
func (r *archiveRun) same(what string, got []*messages.ImmutableMessage, want []appended) {
	r.t.Helper()
	ids := make([]messages.MessageID, len(want))
	for i, a := range want {
		ids[i] = a.id
	}
	sameIDs(r.t, what, got, ids)
	if len(got) != len(want) {
		return
	}
	bad := 0
	for i, m := range got {
		a := want[i]
		if string(m.Payload()) != a.payload && a.kind != "p" || a.msgID != "" && m.MsgID() != a.msgID || m.Term() != a.term {
			if bad++; bad <= maxReported {
				r.t.Errorf("%s: message %d is %q (msg id %q, term %d), want %q (%q, term %d)",
					what, m.ID(), m.Payload(), m.MsgID(), m.Term(), a.payload, a.msgID, a.term)
			}
		}
	}
}

// checkEarliest reads everything from Earliest.
func (r *archiveRun) checkEarliest(what string) {
	r.t.Helper()
	r.read(what+": earliest", jetstream.ReadOptions{Start: jetstream.Earliest()}, r.expected(1, nil))
}

// checkFilters reads from Earliest and from inside the archive with the
// filters of one VChannel, of the PChannel level and of both VChannels.
func (r *archiveRun) checkFilters() {
	cl := r.e.codec.Cluster()
	inside := max(r.archived/3, 1)
	for _, c := range []struct {
		name    string
		filters []string
		match   func(string) bool
	}{
		{"vchannel 1", cl.VChannelFilter(r.v1), func(k string) bool { return k != "v2" }},
		{"vchannel 2", cl.VChannelFilter(r.v2), func(k string) bool { return k != "v1" }},
		{"pchannel level", []string{cl.PChannelLevelFilter(r.p)}, func(k string) bool { return k == "p" }},
		{"all vchannels", []string{cl.AllVChannelsFilter(r.p)}, func(k string) bool { return k != "p" }},
	} {
		for _, start := range []jetstream.StartPosition{jetstream.Earliest(), jetstream.From(inside)} {
			want := r.expected(startOf(start), c.match)
			r.read(c.name+" from "+start.String(), jetstream.ReadOptions{Start: start, Filters: c.filters}, want)
		}
	}
}

// startOf is the first ID a start position delivers.
func startOf(s jetstream.StartPosition) messages.MessageID {
	switch s.Kind {
	case jetstream.StartFrom:
		return s.ID
	case jetstream.StartAfter:
		return s.ID + 1
	}
	return 1
}

// checkBoundary reads from positions inside the archive and around its
// end A: From A-1 and A, After.
func (r *archiveRun) checkBoundary() {
	a := r.archived
	starts := []jetstream.StartPosition{jetstream.From(1), jetstream.After(1), jetstream.From(a / 2), jetstream.From(a - 1),
		jetstream.From(a), jetstream.After(a - 1), jetstream.After(max(a, 2) - 2)}
	for _, start := range starts {
		want := r.expected(startOf(start), nil)
		if len(want) == 0 {
			continue
		}
		r.read(start.String()+fmt.Sprintf(" (archive ends at %d)", a), jetstream.ReadOptions{Start: start}, want)
	}
	st, err := r.b.State(r.ctx, r.p)
	if err != nil {
		r.t.Fatal(err)
	}
	if st.First <= 1 || st.ArchivedBelow != a {
		r.t.Errorf("state %+v after truncating below %d: want First above 1", st, a)
	}
}

// checkGet reads archived messages and the boundary's with Get.
func (r *archiveRun) checkGet() {
	for _, a := range r.history {
		if a.id != 1 && a.id != r.archived-1 && a.id != r.archived && a.id%7 != 0 {
			continue
		}
		m, err := r.b.Get(r.ctx, r.p, a.id)
		if err != nil {
			r.t.Errorf("get %d (archive ends at %d): %v", a.id, r.archived, err)
			continue
		}
		r.same(fmt.Sprint("get ", a.id), []*messages.ImmutableMessage{m}, []appended{a})
	}
}

// checkMovingEnd reads from Earliest while truncations move the archive's
// end past the reader: it must still deliver everything once, in order.
func (r *archiveRun) checkMovingEnd(w jetstream.Writer) {
	r.appendSome(w, 120, archiveRounds+1)
	sc, err := r.b.Read(r.ctx, r.p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	if err != nil {
		r.t.Fatal(err)
	}
	defer func() { _ = sc.Close() }()
	want := r.expected(1, nil)
	got, err := readThrough(r.ctx, sc, r.archived/2)
	if err != nil {
		r.t.Fatal(err)
	}
	last := want[len(want)-1].id
	for i := 1; i <= 3; i++ {
		r.truncate(r.archived+(last-r.archived)*messages.MessageID(i)/4, "while reading")
	}
	rest, err := readThrough(r.ctx, sc, last)
	if err != nil {
		r.t.Fatal(err)
	}
	r.same("earliest while truncating", append(got, rest...), want)
}

// checkHandOffRace: a truncation far past the archive's end, made while a
// read is still in the archive (its scanner of the stream may already be
// open at the old end, and its consumer positioned there), loses nothing:
// the read continues in the archive through what that truncation moved
// there, filtered or not.
func (r *archiveRun) checkHandOffRace(w jetstream.Writer) {
	r.appendSome(w, 1500, archiveRounds+2)
	want := r.expected(1, nil)
	last := want[len(want)-1].id
	filters := r.e.codec.Cluster().VChannelFilter(r.v1)
	sc, err := r.b.Read(r.ctx, r.p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	if err != nil {
		r.t.Fatal(err)
	}
	defer func() { _ = sc.Close() }()
	fsc, err := r.b.Read(r.ctx, r.p, jetstream.ReadOptions{Start: jetstream.Earliest(), Filters: filters})
	if err != nil {
		r.t.Fatal(err)
	}
	defer func() { _ = fsc.Close() }()
	// Both reads take the archive's last message: their fetchers have
	// handed off to the stream at the archive's end.
	got, err := readThrough(r.ctx, sc, r.archived-1)
	if err != nil {
		r.t.Fatal(err)
	}
	fgot, err := readThrough(r.ctx, fsc, r.archived-1)
	if err != nil {
		r.t.Fatal(err)
	}
	r.truncate(last-10, "while a read is at the archive's end")
	rest, err := readThrough(r.ctx, sc, last)
	if err != nil {
		r.t.Fatal(err)
	}
	r.same("earliest across a far truncation", append(got, rest...), want)
	fwant := r.expected(1, func(kind string) bool { return kind != "v2" })
	frest, err := readThrough(r.ctx, fsc, fwant[len(fwant)-1].id)
	if err != nil {
		r.t.Fatal(err)
	}
	r.same("v1 across a far truncation", append(fgot, frest...), fwant)
}

// checkRestart: a read of the archive goes on through a restart of the
// server.
func (r *archiveRun) checkRestart() {
	sc, err := r.b.Read(r.ctx, r.p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	if err != nil {
		r.t.Fatal(err)
	}
	defer func() { _ = sc.Close() }()
	first, err := sc.Next(r.ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	r.e.h.RestartServer(r.t)
	want := r.expected(1, nil)
	rest, err := readThrough(r.ctx, sc, want[len(want)-1].id)
	if err != nil {
		r.t.Fatal(err)
	}
	r.same("earliest through a restart", append([]*messages.ImmutableMessage{first}, rest...), want)
}

// checkLifecycle: Close and cancellation stop a scanner reading the
// archive.
func (r *archiveRun) checkLifecycle() {
	sc, err := r.b.Read(r.ctx, r.p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := sc.Next(r.ctx); err != nil {
		r.t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(r.ctx)
	cancel()
	if _, err := sc.Next(cancelled); !errors.Is(err, context.Canceled) {
		r.t.Errorf("next with a cancelled context in the archive: %v", err)
	}
	if err := sc.Close(); err != nil {
		r.t.Errorf("close: %v", err)
	}
	_, err = sc.Next(r.ctx)
	expectCode(r.t, "next after close in the archive", err, streamwal.ErrClosed)
	if err := sc.Close(); err != nil {
		r.t.Errorf("second close: %v", err)
	}
}
