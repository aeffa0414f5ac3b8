package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// Deadlines of the suite. They bound waits for conditions; nothing waits
// for a fixed time.
const (
	// testBudget bounds one subtest.
	testBudget = 3 * time.Minute
	// readBudget bounds one read of a known range.
	readBudget = 45 * time.Second
	// promptly is how soon a blocked call must return after Close or a
	// cancelled context.
	promptly = 5 * time.Second
)

// pchannelSeq makes PChannel names unique within a process: backends made
// by one harness share one store.
var pchannelSeq atomic.Int64

// env is what every subtest shares.
type env struct {
	h     Harness
	codec *messages.Codec
}

// testContext returns a context bounded by the test's budget, cancelled
// when the test ends.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testBudget)
	t.Cleanup(cancel)
	return ctx
}

// backend returns a new backend closed when the test ends.
func (e *env) backend(t *testing.T) jetstream.Backend {
	t.Helper()
	b := e.h.New(t)
	if b == nil {
		t.Fatal("harness New returned a nil backend")
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// pchannel returns a PChannel no other test uses.
func (e *env) pchannel(t *testing.T, prefix string) streamwal.PChannel {
	t.Helper()
	p, err := streamwal.NewPChannel(prefix, int(pchannelSeq.Add(1)%streamwal.MaxPChannels))
	if err != nil {
		t.Fatalf("pchannel: %v", err)
	}
	return p
}

// vchannel returns a VChannel of p.
func vchannel(t *testing.T, p streamwal.PChannel, collection int64) streamwal.VChannel {
	t.Helper()
	v, err := p.VChannel(collection, 0)
	if err != nil {
		t.Fatalf("vchannel: %v", err)
	}
	return v
}

// openWriter opens p under term; the writer is closed when the test ends.
func openWriter(ctx context.Context, t *testing.T, b jetstream.Backend, p streamwal.PChannel, term uint64) jetstream.Writer {
	t.Helper()
	w, err := b.OpenWriter(ctx, p, term)
	if err != nil {
		t.Fatalf("open %s under term %d: %v", p, term, err)
	}
	t.Cleanup(func() { _ = w.Close() })
	checkBarrier(t, w, p, term)
	return w
}

// checkBarrier checks what a writer says about its RecoveryBarrier.
func checkBarrier(t *testing.T, w jetstream.Writer, p streamwal.PChannel, term uint64) {
	t.Helper()
	if w.PChannel() != p || w.Term() != term {
		t.Errorf("writer says pchannel %s term %d, opened as %s term %d", w.PChannel(), w.Term(), p, term)
	}
	b := w.Barrier()
	if b == nil {
		t.Fatalf("writer of %s term %d has no barrier", p, term)
	}
	if err := barrierProblem(b, term); err != nil {
		t.Errorf("writer's barrier: %v", err)
	}
}

// barrierProblem describes what is wrong with a RecoveryBarrier of term.
func barrierProblem(m *messages.ImmutableMessage, term uint64) error {
	if m.Type() != messages.TypeRecoveryBarrier {
		return fmt.Errorf("message %d is a %s, want a RecoveryBarrier", m.ID(), m.Type().Name)
	}
	var body messages.RecoveryBarrierBody
	if err := m.Body(&body); err != nil {
		return fmt.Errorf("barrier %d body: %v", m.ID(), err)
	}
	if m.Term() != term || body.Term != term {
		return fmt.Errorf("barrier %d has term header %d and body term %d, want %d", m.ID(), m.Term(), body.Term, term)
	}
	if m.ID() == 0 {
		return errors.New("barrier without a MessageID")
	}
	return nil
}

// newInsert builds an Insert on v with payload and, when msgID is not
// empty, a caller-chosen message ID.
func (e *env) newInsert(v streamwal.VChannel, payload, msgID string) (*messages.MutableMessage, error) {
	var opts []messages.Option
	if msgID != "" {
		opts = append(opts, messages.WithMsgID(msgID))
	}
	return e.codec.New(messages.TypeInsert, v, []byte(payload), opts...)
}

// insert is newInsert for the test goroutine.
func (e *env) insert(t *testing.T, v streamwal.VChannel, payload, msgID string) *messages.MutableMessage {
	t.Helper()
	m, err := e.newInsert(v, payload, msgID)
	if err != nil {
		t.Fatalf("build insert: %v", err)
	}
	return m
}

// timeTick builds a persisted, PChannel-level TimeTick.
func (e *env) timeTick(t *testing.T, p streamwal.PChannel) *messages.MutableMessage {
	t.Helper()
	m, err := e.codec.NewPChannelBody(messages.TypeTimeTick, p, messages.TimeTickBody{})
	if err != nil {
		t.Fatalf("build time tick: %v", err)
	}
	return m
}

// appendOne appends msgs on the test goroutine and checks the returned IDs
// are contiguous.
func appendOne(ctx context.Context, t *testing.T, w jetstream.Writer, msgs ...*messages.MutableMessage) []messages.MessageID {
	t.Helper()
	ids, err := w.Append(ctx, msgs...)
	if err != nil {
		t.Fatalf("append %d messages: %v", len(msgs), err)
	}
	if err := contiguous(ids, len(msgs)); err != nil {
		t.Fatalf("append: %v", err)
	}
	return ids
}

// contiguous checks that an append of n messages returned n consecutive
// MessageIDs.
func contiguous(ids []messages.MessageID, n int) error {
	if len(ids) != n {
		return fmt.Errorf("%d MessageIDs for %d messages", len(ids), n)
	}
	for i := range ids {
		if ids[i] == 0 || ids[i] != ids[0]+messages.MessageID(i) {
			return fmt.Errorf("MessageIDs %v of one append are not contiguous", ids)
		}
	}
	return nil
}

// readRange reads p from opts.Start until a message with an ID at or
// above last arrives, and returns everything delivered.
func readRange(ctx context.Context, b jetstream.Backend, p streamwal.PChannel, opts jetstream.ReadOptions, last messages.MessageID) ([]*messages.ImmutableMessage, error) {
	sc, err := b.Read(ctx, p, opts)
	if err != nil {
		return nil, fmt.Errorf("read %s from %s: %w", p, opts.Start, err)
	}
	defer func() { _ = sc.Close() }()
	out, err := readThrough(ctx, sc, last)
	if err != nil {
		return out, fmt.Errorf("read %s from %s: %w", p, opts.Start, err)
	}
	return out, nil
}

// readThrough reads sc until a message with an ID at or above last
// arrives, and returns everything delivered.
func readThrough(ctx context.Context, sc jetstream.Scanner, last messages.MessageID) ([]*messages.ImmutableMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, readBudget)
	defer cancel()
	var out []*messages.ImmutableMessage
	for {
		m, err := sc.Next(ctx)
		if err != nil {
			return out, fmt.Errorf("got %d messages (last %d) while waiting for %d: %w", len(out), lastID(out), last, err)
		}
		out = append(out, m)
		if m.ID() >= last {
			return out, nil
		}
	}
}

// mustReadRange is readRange for the test goroutine.
func mustReadRange(ctx context.Context, t *testing.T, b jetstream.Backend, p streamwal.PChannel, opts jetstream.ReadOptions, last messages.MessageID) []*messages.ImmutableMessage {
	t.Helper()
	out, err := readRange(ctx, b, p, opts, last)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// lastID is the ID of the last message, 0 if none.
func lastID(ms []*messages.ImmutableMessage) messages.MessageID {
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].ID()
}

// idsOf lists the IDs of ms.
func idsOf(ms []*messages.ImmutableMessage) []messages.MessageID {
	out := make([]messages.MessageID, len(ms))
	for i, m := range ms {
		out[i] = m.ID()
	}
	return out
}

// span lists the IDs from..to inclusive.
func span(from, to messages.MessageID) []messages.MessageID {
	var out []messages.MessageID
	for id := from; id <= to; id++ {
		out = append(out, id)
	}
	return out
}

// sameIDs reports whether a read delivered exactly want, in order.
func sameIDs(t *testing.T, what string, got []*messages.ImmutableMessage, want []messages.MessageID) {
	t.Helper()
	if g := idsOf(got); !slices.Equal(g, want) {
		t.Errorf("%s: delivered IDs %s, want %s", what, shortIDs(g), shortIDs(want))
	}
}

// shortIDs renders an ID list, eliding the middle of long ones.
func shortIDs(ids []messages.MessageID) string {
	render := func(ids []messages.MessageID) string {
		s := make([]string, len(ids))
		for i, id := range ids {
			s[i] = id.String()
		}
		return strings.Join(s, " ")
	}
	if len(ids) <= 24 {
		return "[" + render(ids) + "]"
	}
	return fmt.Sprintf("[%s ... %s] (%d)", render(ids[:10]), render(ids[len(ids)-10:]), len(ids))
}

// strictlyIncreasing returns an error for the first ID that does not grow.
func strictlyIncreasing(ms []*messages.ImmutableMessage) error {
	for i := 1; i < len(ms); i++ {
		if ms[i].ID() <= ms[i-1].ID() {
			return fmt.Errorf("MessageID %d delivered after %d", ms[i].ID(), ms[i-1].ID())
		}
	}
	return nil
}

// expectCode checks that err matches the sentinel want.
func expectCode(t *testing.T, what string, err, want error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want %v", what, want)
		return
	}
	if !errors.Is(err, want) {
		t.Errorf("%s: error %q (code %s), want %v", what, err, streamwal.CodeOf(err), want)
	}
}

// nothingWritten checks that the stream of p did not grow since last: the
// next append of the (only) writer lands right after it.
func (e *env) nothingWritten(ctx context.Context, t *testing.T, what string, w jetstream.Writer, v streamwal.VChannel, last *messages.MessageID) {
	t.Helper()
	ids, err := w.Append(ctx, e.insert(t, v, "sentinel after "+what, ""))
	if err != nil {
		t.Fatalf("%s: sentinel append: %v", what, err)
	}
	if ids[0] != *last+1 {
		t.Errorf("%s wrote to %s: the next append landed at %d, want %d", what, w.PChannel(), ids[0], *last+1)
	}
	*last = ids[0]
}

// waitFor polls cond until it holds or d passes; it reports whether it
// held. The poll interval is short; this waits for a condition, it is not
// a synchronisation sleep.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return cond()
		case <-tick.C:
		}
	}
	return true
}

// closedWithin reports whether ch is closed within d.
func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ch:
		return true
	case <-timer.C:
		return false
	}
}

// maxBatch is the backend's append limit.
func maxBatch(b jetstream.Backend) int {
	if o, ok := b.(interface{ Options() jetstream.Options }); ok && o.Options().MaxBatch > 0 {
		return o.Options().MaxBatch
	}
	return jetstream.DefaultMaxBatch
}

// maxMsgSize is the backend's message size limit, 0 if unknown.
func maxMsgSize(b jetstream.Backend) int {
	if o, ok := b.(interface{ Options() jetstream.Options }); ok {
		return int(o.Options().MaxMsgSize)
	}
	return 0
}
