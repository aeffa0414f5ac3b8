package faulty_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/jetstream/faulty"
	"github.com/streamwal/streamwal/messages"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks).
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }

// env is a JetStream backend on an embedded server, and a faulty backend
// around it.
type env struct {
	t      *testing.T
	codec  *messages.Codec
	real   *jetstream.JetStream
	faulty *faulty.Backend
	p      streamwal.PChannel
	v      streamwal.VChannel
}

// newEnv starts a server for t; the faulty backend asks inj.
func newEnv(t *testing.T, inj faulty.Injector) *env {
	t.Helper()
	srv := embedded.StartTest(t)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	codec, err := messages.NewCodec("faulty", nil)
	require.NoError(t, err)
	js, err := jetstream.New(nc, codec, jetstream.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.Close() })
	p, err := streamwal.NewPChannel("p", 0)
	require.NoError(t, err)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	return &env{t: t, codec: codec, real: js, faulty: faulty.New(js, inj), p: p, v: v}
}

// open opens a faulty writer under term and closes it at the end.
func (e *env) open(term uint64) jetstream.Writer {
	e.t.Helper()
	w, err := e.faulty.OpenWriter(context.Background(), e.p, term)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = w.Close() })
	return w
}

// insert builds an insert carrying payload.
func (e *env) insert(payload string) *messages.MutableMessage {
	e.t.Helper()
	m, err := e.codec.New(messages.TypeInsert, e.v, []byte(payload))
	require.NoError(e.t, err)
	return m
}

// last is the MessageID of the stream's last message, read past the
// wrapper.
func (e *env) last() messages.MessageID {
	e.t.Helper()
	st, err := e.real.State(context.Background(), e.p)
	require.NoError(e.t, err)
	return st.Last
}

// payloadAt reads the payload stored at id, past the wrapper.
func (e *env) payloadAt(id messages.MessageID) string {
	e.t.Helper()
	m, err := e.real.Get(context.Background(), e.p, id)
	require.NoError(e.t, err)
	return string(m.Payload())
}

// TestAppendFailsBefore: an append failed without After never reaches
// the stream, through Append and AppendAsync alike, and the appends
// around it land as usual.
func TestAppendFailsBefore(t *testing.T) {
	ctx := context.Background()
	sw := faulty.NewSwitch(faulty.Fault{Err: faulty.Unavailable()}, faulty.OpAppend)
	e := newEnv(t, sw)
	w := e.open(1)
	ids, err := w.Append(ctx, e.insert("before"))
	require.NoError(t, err)
	tail := e.last()
	require.Equal(t, ids[0], tail)

	sw.On()
	_, err = w.Append(ctx, e.insert("refused"))
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.ErrorIs(t, err, faulty.ErrInjected)
	fut := w.AppendAsync(ctx, e.insert("refused async"))
	select {
	case <-fut.Done():
	default:
		t.Fatal("an append refused without a wait is not failed when AppendAsync returns")
	}
	_, err = fut.Result()
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.Equal(t, int64(2), sw.Injected())
	require.Equal(t, tail, e.last(), "nothing refused landed")

	sw.Off()
	ids, err = w.AppendAsync(ctx, e.insert("after")).Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, tail+1, ids[0])
	require.NoError(t, w.Err())
}

// TestAppendFailsAfter: an append failed with After lands, and its caller
// is told the outcome is unknown.
func TestAppendFailsAfter(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, faulty.AppendsOf(messages.TypeInsert, faulty.Fault{Err: faulty.UnknownOutcome(), After: true}))
	w := e.open(1)
	tail := e.last()

	_, err := w.Append(ctx, e.insert("sync"))
	require.ErrorIs(t, err, streamwal.ErrUnknownOutcome)
	require.Equal(t, tail+1, e.last())
	require.Equal(t, "sync", e.payloadAt(tail+1))

	fut := w.AppendAsync(ctx, e.insert("async"))
	_, err = fut.Wait(ctx)
	require.ErrorIs(t, err, streamwal.ErrUnknownOutcome)
	require.Equal(t, tail+2, e.last())
	require.Equal(t, "async", e.payloadAt(tail+2))
	require.Len(t, fut.MsgIDs(), 1, "the future carries the message ID it was stored under")
	stored, err := e.real.Get(ctx, e.p, tail+2)
	require.NoError(t, err)
	require.Equal(t, fut.MsgIDs()[0], stored.MsgID())
	require.NoError(t, w.Err(), "an unknown outcome does not stop the writer")
}

// TestAppendAsyncHeld: a held append is handed on at once and its result
// delivered once the hold ends; a held failure without After never lands
// and fails once the hold ends.
func TestAppendAsyncHeld(t *testing.T) {
	ctx := context.Background()
	gate := make(chan struct{})
	e := newEnv(t, faulty.First(
		faulty.When(func(c faulty.Call) bool { return c.Op == faulty.OpAppend && string(c.Msgs[0].Payload()) == "lost" },
			faulty.Fault{Err: faulty.UnknownOutcome(), Hold: gate}),
		faulty.AppendsOf(messages.TypeInsert, faulty.Fault{Hold: gate}),
	))
	w := e.open(1)
	tail := e.last()

	lost := w.AppendAsync(ctx, e.insert("lost"))
	held := w.AppendAsync(ctx, e.insert("held"))
	deadline := time.Now().Add(20 * time.Second)
	for e.last() != tail+1 {
		require.True(t, time.Now().Before(deadline), "the held append did not land")
		time.Sleep(5 * time.Millisecond)
	}
	require.Equal(t, "held", e.payloadAt(tail+1), "the lost append was never sent")
	for _, f := range []*jetstream.AppendFuture{lost, held} {
		select {
		case <-f.Done():
			t.Fatal("a held append resolved before its hold ended")
		default:
		}
	}
	close(gate)
	_, err := lost.Wait(ctx)
	require.ErrorIs(t, err, streamwal.ErrUnknownOutcome)
	ids, err := held.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, []messages.MessageID{tail + 1}, ids)
}

// TestFencedAppendStopsWriter: an append failed as fenced stops the
// writer as fencing does: Err, Done and Fenced say so, and later appends
// are refused without reaching the stream even once the fault is gone.
func TestFencedAppendStopsWriter(t *testing.T) {
	ctx := context.Background()
	sw := faulty.NewSwitch(faulty.Fault{Err: faulty.Fenced()}, faulty.OpAppend)
	e := newEnv(t, sw)
	w := e.open(1)
	fenced, err := w.Fenced(ctx)
	require.NoError(t, err)
	require.False(t, fenced)
	tail := e.last()

	sw.On()
	_, err = w.AppendAsync(ctx, e.insert("fenced")).Wait(ctx)
	require.ErrorIs(t, err, streamwal.ErrFenced)
	sw.Off()
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a fenced writer is not done")
	}
	require.ErrorIs(t, w.Err(), streamwal.ErrFenced)
	fenced, err = w.Fenced(ctx)
	require.NoError(t, err)
	require.True(t, fenced)
	_, err = w.Append(ctx, e.insert("later"))
	require.ErrorIs(t, err, streamwal.ErrFenced)
	_, err = w.AppendAsync(ctx, e.insert("later async")).Result()
	require.ErrorIs(t, err, streamwal.ErrFenced)
	require.Equal(t, int64(1), sw.Injected())
	require.Equal(t, tail, e.last())
}

// TestOpenWriterFaults: an open failed before never lands a barrier; one
// failed after landed it, and a retry under the same term finds it (the
// real backend's answer to an open whose ack was lost) instead of landing
// another.
func TestOpenWriterFaults(t *testing.T) {
	ctx := context.Background()
	opens := func(f faulty.Fault) faulty.Injector {
		return faulty.When(func(c faulty.Call) bool { return c.Op == faulty.OpOpenWriter }, f)
	}
	e := newEnv(t, opens(faulty.Fault{Err: faulty.Unavailable()}))
	_, err := e.faulty.OpenWriter(ctx, e.p, 1)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.Equal(t, messages.MessageID(0), e.last(), "no barrier landed")

	e.faulty.SetInjector(opens(faulty.Fault{Err: faulty.Unavailable(), After: true}))
	_, err = e.faulty.OpenWriter(ctx, e.p, 1)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	landed := e.last()
	require.NotZero(t, landed, "the barrier landed")

	e.faulty.SetInjector(nil)
	w := e.open(1)
	require.Equal(t, landed, w.Barrier().ID())
	require.Equal(t, landed, e.last())
}

// TestScannerFaults: a failed Read opens no scanner; a failed Next ends
// All with the injected error, after the messages before it; a delayed
// read gives up when its context ends.
func TestScannerFaults(t *testing.T) {
	ctx := context.Background()
	sw := faulty.NewSwitch(faulty.Fault{Err: faulty.Unavailable()}, faulty.OpRead)
	e := newEnv(t, faulty.First(sw, faulty.Nth(faulty.OpNext, 3, faulty.Fault{Err: faulty.Unavailable()})))
	w := e.open(1)
	for _, p := range []string{"a", "b", "c"} {
		_, err := w.Append(ctx, e.insert(p))
		require.NoError(t, err)
	}
	sw.On()
	_, err := e.faulty.Read(ctx, e.p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	sw.Off()

	sc, err := e.faulty.Read(ctx, e.p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	require.NoError(t, err)
	defer sc.Close()
	var got []string
	for m, err := range sc.All(ctx) {
		if err != nil {
			require.ErrorIs(t, err, streamwal.ErrUnavailable)
			break
		}
		got = append(got, m.Type().Name+" "+string(m.Payload()))
	}
	require.Equal(t, []string{messages.TypeRecoveryBarrier.Name + ` {"term":1}`, messages.TypeInsert.Name + " a"}, got,
		"the barrier and the first insert, then the fault")
	m, err := sc.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, "b", string(m.Payload()), "the failed Next dropped nothing")

	e.faulty.SetInjector(faulty.When(func(c faulty.Call) bool { return c.Op == faulty.OpGet }, faulty.Fault{Delay: time.Hour}))
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = e.faulty.Get(short, e.p, m.ID())
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestTruncateFailsAfter: a truncation failed with After took effect.
func TestTruncateFailsAfter(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, faulty.When(func(c faulty.Call) bool { return c.Op == faulty.OpTruncate },
		faulty.Fault{Err: faulty.UnknownOutcome(), After: true}))
	w := e.open(1)
	var last messages.MessageID
	for _, p := range []string{"a", "b", "c"} {
		ids, err := w.Append(ctx, e.insert(p))
		require.NoError(t, err)
		last = ids[0]
	}
	require.ErrorIs(t, e.faulty.Truncate(ctx, e.p, last), streamwal.ErrUnknownOutcome)
	st, err := e.faulty.State(ctx, e.p)
	require.NoError(t, err)
	require.Equal(t, last, st.First, "the truncation happened")
}

// TestSegmentOpsNeedAStore: the segment and tier operations of a backend
// without them fail with an internal error; with them, they are faulty.
func TestSegmentOpsNeedAStore(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, faulty.When(func(c faulty.Call) bool { return c.Op == faulty.OpSegments }, faulty.Fault{Err: faulty.Unavailable()}))
	_, err := e.faulty.Segments(ctx, e.v)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	_, _, err = e.faulty.ReadSegment(ctx, e.v, 1)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "the real store answers: no such segment")

	bare := faulty.New(struct{ jetstream.Backend }{e.real}, nil)
	_, err = bare.Segments(ctx, e.v)
	require.ErrorIs(t, err, streamwal.ErrInternal)
	require.ErrorIs(t, bare.Advance(ctx, e.p, 1), streamwal.ErrInternal)
	require.Equal(t, jetstream.Options{}, bare.Options())
	require.Equal(t, e.real.Options(), e.faulty.Options())
}

// TestInjectors: the ready injectors decide as documented.
func TestInjectors(t *testing.T) {
	boom := faulty.Fault{Err: faulty.Unavailable()}
	app := faulty.Call{Op: faulty.OpAppend}
	get := faulty.Call{Op: faulty.OpGet}

	nth := faulty.Nth(faulty.OpAppend, 2, boom)
	require.Nil(t, nth.Inject(app).Err)
	require.Nil(t, nth.Inject(get).Err, "other kinds do not count")
	require.Equal(t, boom, nth.Inject(app))
	require.Nil(t, nth.Inject(app).Err)

	once := faulty.Once(faulty.When(func(c faulty.Call) bool { return c.Op == faulty.OpGet }, boom))
	require.Nil(t, once.Inject(app).Err)
	require.Equal(t, boom, once.Inject(get))
	require.Nil(t, once.Inject(get).Err)

	sw := faulty.NewSwitch(boom)
	require.Nil(t, sw.Inject(get).Err, "off")
	sw.On()
	require.Equal(t, boom, sw.Inject(get), "on, every kind")
	require.Equal(t, int64(1), sw.Injected())

	held := faulty.Fault{Delay: time.Second}
	first := faulty.First(faulty.Pass, faulty.Nth(faulty.OpGet, 1, held), faulty.NewSwitch(boom))
	require.Equal(t, held, first.Inject(get))

	require.Equal(t, "append", faulty.OpAppend.String())
	require.Equal(t, "op(200)", faulty.Op(200).String())
}

// TestRefusalStaysARefusal: an append the wrapped writer refuses at once
// (bad input) is refused at once through a wrapper that would hold or
// fail its result, with the wrapped writer's error.
func TestRefusalStaysARefusal(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, faulty.When(func(c faulty.Call) bool { return c.Op == faulty.OpAppend },
		faulty.Fault{Err: faulty.UnknownOutcome(), After: true, Delay: time.Hour}))
	w := e.open(1)
	other, err := streamwal.NewPChannel("other", 0)
	require.NoError(t, err)
	ov, err := other.VChannel(1, 0)
	require.NoError(t, err)
	m, err := e.codec.New(messages.TypeInsert, ov, []byte("elsewhere"))
	require.NoError(t, err)
	fut := w.AppendAsync(ctx, m)
	select {
	case <-fut.Done():
	default:
		t.Fatal("a refused append is pending")
	}
	_, err = fut.Result()
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}
