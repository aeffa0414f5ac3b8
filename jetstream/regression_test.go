package jetstream_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// Regression tests for the issues found in review: each asserts the fixed
// behaviour, so it fails on the behaviour before the fixes.

// regEnv is an embedded server, a codec and one PChannel.
type regEnv struct {
	srv   *embedded.Server
	codec *messages.Codec
	p     streamwal.PChannel
	v     streamwal.VChannel
}

func newRegEnv(t *testing.T, opts ...func(*embedded.Options)) *regEnv {
	t.Helper()
	srv := embedded.StartTest(t, opts...)
	codec, err := messages.NewCodec("reg", nil)
	require.NoError(t, err)
	p, err := streamwal.NewPChannel("pchan", 0)
	require.NoError(t, err)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	return &regEnv{srv: srv, codec: codec, p: p, v: v}
}

// connect opens a connection to the server (closed when the test ends);
// asynchronous errors are expected in these tests and not logged.
func (e *regEnv) connect(t *testing.T, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}, opts...)
	nc, err := e.srv.Connect(opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func (e *regEnv) backend(t *testing.T, nc *nats.Conn, opts jetstream.Options) *jetstream.JetStream {
	t.Helper()
	b, err := jetstream.New(nc, e.codec, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// msg builds an Insert on the env's VChannel; id is its caller message ID
// (none if empty).
func (e *regEnv) msg(t *testing.T, id string, payload []byte) *messages.MutableMessage {
	t.Helper()
	m, err := e.codec.New(messages.TypeInsert, e.v, payload)
	require.NoError(t, err)
	if id != "" {
		require.NoError(t, m.SetMsgID(id))
	}
	return m
}

// msgs builds one message per caller message ID.
func (e *regEnv) msgs(t *testing.T, payload []byte, ids ...string) []*messages.MutableMessage {
	t.Helper()
	out := make([]*messages.MutableMessage, len(ids))
	for i, id := range ids {
		out[i] = e.msg(t, id, payload)
	}
	return out
}

// lastSeq is the stream's last sequence, read from the server.
func (e *regEnv) lastSeq(t *testing.T, ctx context.Context, nc *nats.Conn) uint64 {
	t.Helper()
	js, err := njs.New(nc)
	require.NoError(t, err)
	s, err := js.Stream(ctx, e.codec.Cluster().StreamName(e.p))
	require.NoError(t, err)
	return s.CachedInfo().State.LastSeq
}

// contents reads the whole stream, in order, through the backend's scanner.
func (e *regEnv) contents(t *testing.T, ctx context.Context, b jetstream.Backend, nc *nats.Conn) []*messages.ImmutableMessage {
	t.Helper()
	last := e.lastSeq(t, ctx, nc)
	if last == 0 {
		return nil
	}
	sc, err := b.Read(ctx, e.p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	require.NoError(t, err)
	defer func() { _ = sc.Close() }()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out []*messages.ImmutableMessage
	for {
		m, err := sc.Next(rctx)
		require.NoError(t, err, "reading the stream up to %d (got %d messages)", last, len(out))
		out = append(out, m)
		if uint64(m.ID()) >= last {
			return out
		}
	}
}

// describe renders stream contents for failure messages.
func describe(ms []*messages.ImmutableMessage) string {
	var b bytes.Buffer
	for _, m := range ms {
		fmt.Fprintf(&b, "\n  %d: %s term %d msgid %q", m.ID(), m.Type().Name, m.Term(), m.MsgID())
	}
	return b.String()
}

// closeWithin closes w and fails the test if that takes longer than d.
func closeWithin(t *testing.T, w jetstream.Writer, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		_ = w.Close()
	}()
	select {
	case <-done:
		t.Logf("Close took %v", time.Since(start))
	case <-time.After(d):
		t.Errorf("Close did not return within %v", d)
		<-done // do not leak the goroutine
		t.Logf("Close eventually took %v", time.Since(start))
	}
}

// closeOnCleanup closes w when the test ends; a Close that hangs fails the
// test instead of hanging it.
func closeOnCleanup(t *testing.T, w jetstream.Writer) {
	t.Helper()
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = w.Close()
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("writer of term %d: Close hangs", w.Term())
		}
	})
}

// TestRegressionFenceCallerMsgID: a fenced writer's pipelined plain
// publishes are held on the wire while a newer owner opens the PChannel and
// appends a message whose caller-chosen ID is the one the old writer's next
// publish expects as last message ID. The expected-last-message-ID
// condition alone let that publish land after the newer barrier; the
// barrier condition must refuse it. None of the old writer's appends may
// land after the term-2 barrier, and each ends in ErrFenced or
// ErrUnknownOutcome.
func TestRegressionFenceCallerMsgID(t *testing.T) {
	e := newRegEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	proxy := newTCPProxy(t, e.srv.Addr())
	nc1, err := nats.Connect(proxy.URL(), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	require.NoError(t, err)
	t.Cleanup(nc1.Close)
	b1 := e.backend(t, nc1, jetstream.Options{})
	nc2 := e.connect(t)
	b2 := e.backend(t, nc2, jetstream.Options{})

	w1, err := b1.OpenWriter(ctx, e.p, 1)
	require.NoError(t, err)
	closeOnCleanup(t, w1)

	// W1's next three plain publishes reach the proxy and are held there.
	proxy.Pause()
	ids1 := []string{"z", "a", "b"}
	futs := make([]*jetstream.AppendFuture, len(ids1))
	for i, id := range ids1 {
		futs[i] = w1.AppendAsync(ctx, e.msg(t, id, []byte("old-"+id)))
	}
	proxy.WaitHeld(t, 10*time.Second, "w1's three publishes", func(held []byte) bool {
		return bytes.Count(held, []byte("HPUB ")) >= 3 && bytes.Contains(held, []byte("Nats-Msg-Id: b\r\n"))
	})

	// W2 takes over and appends "a" (a client retrying after a timeout).
	w2, err := b2.OpenWriter(ctx, e.p, 2)
	require.NoError(t, err)
	closeOnCleanup(t, w2)
	barrier2 := w2.Barrier().ID()
	ida, err := w2.Append(ctx, e.msg(t, "a", []byte("new-a")))
	require.NoError(t, err)
	require.Equal(t, []messages.MessageID{barrier2 + 1}, ida)

	proxy.Resume()
	results := make([]error, len(futs))
	seqs := make([][]messages.MessageID, len(futs))
	for i, f := range futs {
		wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
		seqs[i], results[i] = f.Wait(wctx)
		wcancel()
		t.Logf("w1 append %q: ids %v err %v", ids1[i], seqs[i], results[i])
	}
	all := e.contents(t, ctx, b2, nc2)
	t.Logf("stream:%s", describe(all))
	byID := map[messages.MessageID]*messages.ImmutableMessage{}
	for _, m := range all {
		byID[m.ID()] = m
		if m.ID() > barrier2 && m.Term() < 2 {
			t.Errorf("FENCE VIOLATION: message %d (%q) of term %d after the term-2 barrier at %d", m.ID(), m.MsgID(), m.Term(), barrier2)
		}
	}
	for i, err := range results {
		if err == nil {
			// Success only if it is really stored there, before the barrier.
			require.Len(t, seqs[i], 1)
			m := byID[seqs[i][0]]
			if m == nil || m.MsgID() != ids1[i] || m.Term() != 1 || m.ID() > barrier2 {
				t.Errorf("w1 append %q reported success at %v, which the stream does not hold as its message before the barrier", ids1[i], seqs[i])
			}
			continue
		}
		if !errors.Is(err, streamwal.ErrFenced) && !errors.Is(err, streamwal.ErrUnknownOutcome) {
			t.Errorf("w1 append %q: want ErrFenced or ErrUnknownOutcome, got %v", ids1[i], err)
		}
	}
	select {
	case <-w1.Done():
		require.ErrorIs(t, w1.Err(), streamwal.ErrFenced)
	case <-time.After(10 * time.Second):
		t.Error("the fenced writer did not stop")
	}
	// Everything of w1 was held until after the barrier: the stream is
	// exactly w1's barrier, w2's barrier and w2's "a".
	require.Len(t, all, 3, "stream:%s", describe(all))
	require.Equal(t, messages.TypeRecoveryBarrier, all[0].Type())
	require.Equal(t, uint64(1), all[0].Term())
	require.Equal(t, barrier2, all[1].ID())
	require.Equal(t, messages.TypeRecoveryBarrier, all[1].Type())
	require.Equal(t, "a", all[2].MsgID())
	require.Equal(t, uint64(2), all[2].Term())
}

// TestRegressionMaxPayload: with the server's max_payload at 1 MiB and the
// codec's payload limit at 1 MiB, an append too large for the connection
// used to be accepted and then wedge the writer. It must fail at once with
// ErrInvalidArgument, send nothing, and leave the writer working.
func TestRegressionMaxPayload(t *testing.T) {
	e := newRegEnv(t, func(o *embedded.Options) { o.MaxPayload = 1 << 20 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc := e.connect(t)
	require.Equal(t, int64(1<<20), nc.MaxPayload())
	require.Equal(t, 1<<20, e.codec.MaxPayload())
	b := e.backend(t, nc, jetstream.Options{})
	w, err := b.OpenWriter(ctx, e.p, 1)
	require.NoError(t, err)
	closeOnCleanup(t, w)
	before := e.lastSeq(t, ctx, nc)

	big := e.msg(t, "", bytes.Repeat([]byte{'x'}, e.codec.MaxPayload()))
	for _, batch := range [][]*messages.MutableMessage{
		{big},
		{e.msg(t, "", []byte("small")), big, e.msg(t, "", []byte("small"))},
	} {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		ids, err := w.Append(actx, batch...)
		acancel()
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "append of %d messages with one over max_payload", len(batch))
		require.Nil(t, ids)
	}
	require.Zero(t, w.Stats().Units, "an invalid append must send nothing")
	require.Equal(t, before, e.lastSeq(t, ctx, nc), "an invalid append must write nothing")
	require.NoError(t, w.Err())

	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	ids, err := w.Append(actx, e.msg(t, "", []byte("small")), e.msg(t, "", []byte("small")))
	acancel()
	require.NoError(t, err, "a small append after the refused one")
	require.Equal(t, []messages.MessageID{messages.MessageID(before + 1), messages.MessageID(before + 2)}, ids)
	closeWithin(t, w, 5*time.Second)
	require.ErrorIs(t, w.Err(), streamwal.ErrClosed)
}

// TestRegressionPermanentRefusal: the stream is full under DiscardNew, so
// the server refuses every publish. The writer used to retry at full speed
// forever; the append must fail with ErrUnrecoverable, after a bounded
// number of sends, and Close must return promptly. Covered for a plain
// publish and for an atomic batch.
func TestRegressionPermanentRefusal(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("msgs=%d", n), func(t *testing.T) {
			e := newRegEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			nc := e.connect(t)
			b := e.backend(t, nc, jetstream.Options{})
			w, err := b.OpenWriter(ctx, e.p, 1)
			require.NoError(t, err)
			closeOnCleanup(t, w)

			// The stream holds the barrier and may hold nothing else.
			js, err := njs.New(nc)
			require.NoError(t, err)
			st, err := js.Stream(ctx, e.codec.Cluster().StreamName(e.p))
			require.NoError(t, err)
			cfg := st.CachedInfo().Config
			cfg.MaxMsgs = 1
			_, err = js.UpdateStream(ctx, cfg)
			require.NoError(t, err)

			for round := range 2 {
				batch := make([]*messages.MutableMessage, n)
				for i := range batch {
					batch[i] = e.msg(t, "", []byte("x"))
				}
				start := time.Now()
				actx, acancel := context.WithTimeout(ctx, 8*time.Second)
				ids, err := w.Append(actx, batch...)
				acancel()
				t.Logf("round %d: append after %v: %v; stats %+v", round, time.Since(start), err, w.Stats())
				require.ErrorIs(t, err, streamwal.ErrUnrecoverable)
				require.Nil(t, ids)
			}
			st2 := w.Stats()
			require.LessOrEqual(t, st2.Units, uint64(6), "the writer re-sent a refused unit over and over: %+v", st2)
			require.LessOrEqual(t, st2.Recoveries, uint64(6), "stats %+v", st2)
			require.Equal(t, uint64(1), e.lastSeq(t, ctx, nc))
			closeWithin(t, w, 5*time.Second)
		})
	}
}

// TestRegressionLatestAcrossRestart: a scanner reading from Latest whose
// ordered consumer is re-created (server restart) before it delivered
// anything used to re-create itself "from new" and skip what was appended
// in between. It must deliver exactly what was appended after Read
// returned, nothing before, nothing lost.
func TestRegressionLatestAcrossRestart(t *testing.T) {
	e := newRegEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	reconnecting := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(20 * time.Millisecond), nats.ReconnectJitter(0, 0)}
	bw := e.backend(t, e.connect(t, reconnecting...), jetstream.Options{})
	br := e.backend(t, e.connect(t, reconnecting...), jetstream.Options{})
	w, err := bw.OpenWriter(ctx, e.p, 1)
	require.NoError(t, err)
	closeOnCleanup(t, w)
	for i := range 3 {
		_, err := w.Append(ctx, e.msg(t, fmt.Sprint("before-", i), []byte("before")))
		require.NoError(t, err)
	}

	sc, err := br.Read(ctx, e.p, jetstream.ReadOptions{Start: jetstream.Latest()})
	require.NoError(t, err)
	defer func() { _ = sc.Close() }()
	require.NoError(t, e.srv.Restart())

	var want []messages.MessageID
	for i := range 5 {
		actx, acancel := context.WithTimeout(ctx, 15*time.Second)
		ids, err := w.Append(actx, e.msg(t, fmt.Sprint("after-", i), []byte("after")))
		acancel()
		require.NoError(t, err, "append %d after the restart", i)
		want = append(want, ids...)
	}
	// A last append marks the end: the scanner delivers it right after the
	// five, or something extra came in between.
	sentinel, err := w.Append(ctx, e.msg(t, "sentinel", []byte("end")))
	require.NoError(t, err)
	want = append(want, sentinel...)

	var got []messages.MessageID
	for len(got) < len(want) {
		nctx, ncancel := context.WithTimeout(ctx, 15*time.Second)
		m, err := sc.Next(nctx)
		ncancel()
		require.NoError(t, err, "scanner after delivering %v of %v", got, want)
		got = append(got, m.ID())
		if m.MsgID() == "sentinel" {
			break
		}
	}
	require.Equal(t, want, got, "a Latest scanner must deliver exactly what was appended after Read")
}

// TestRegressionRetryLandedBigAppend: retrying a landed 1000-message append
// with caller message IDs must resolve to the original MessageIDs quickly:
// O(n) messages sent, a few recoveries, not one recovery per message.
func TestRegressionRetryLandedBigAppend(t *testing.T) {
	e := newRegEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc := e.connect(t)
	b := e.backend(t, nc, jetstream.Options{})
	w, err := b.OpenWriter(ctx, e.p, 1)
	require.NoError(t, err)
	closeOnCleanup(t, w)
	const n = 1000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("big-", i)
	}
	orig, err := w.Append(ctx, e.msgs(t, make([]byte, 100), ids...)...)
	require.NoError(t, err)
	require.Len(t, orig, n)
	end := e.lastSeq(t, ctx, nc)

	before := w.Stats()
	start := time.Now()
	got, err := w.Append(ctx, e.msgs(t, make([]byte, 100), ids...)...)
	took := time.Since(start)
	require.NoError(t, err)
	delta := w.Stats()
	delta.Units -= before.Units
	delta.Batches -= before.Batches
	delta.Messages -= before.Messages
	delta.Recoveries -= before.Recoveries
	t.Logf("retry of a landed %d-message append took %v: %+v", n, took, delta)
	require.Equal(t, orig, got, "a retried append resolves to the original MessageIDs")
	require.Equal(t, end, e.lastSeq(t, ctx, nc), "a retried append writes nothing")
	// Today: the append once whole, once again alone, then message by
	// message (3n); the behaviour before the fix re-sent O(n^2).
	require.LessOrEqual(t, delta.Messages, uint64(3*n), "messages sent must stay O(n)")
	require.LessOrEqual(t, delta.Recoveries, uint64(4), "recoveries must not grow with n")
	require.Less(t, took, 10*time.Second)

	// The writer still works, right after the original.
	next, err := w.Append(ctx, e.msg(t, "", []byte("next")))
	require.NoError(t, err)
	require.Equal(t, []messages.MessageID{messages.MessageID(end + 1)}, next)
}

// TestRegressionRetriedAppendsNotRetained: appends retried after they
// landed are resolved through per-message parts; once resolved, the writer
// must not keep them (they used to stay in a map for the writer's life).
func TestRegressionRetriedAppendsNotRetained(t *testing.T) {
	e := newRegEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b := e.backend(t, e.connect(t), jetstream.Options{})
	w, err := b.OpenWriter(ctx, e.p, 1)
	require.NoError(t, err)
	closeOnCleanup(t, w)
	const n = 100
	var refs []weak.Pointer[jetstream.AppendFuture]
	for i := range n {
		ids := []string{fmt.Sprint("r", i, "a"), fmt.Sprint("r", i, "b"), fmt.Sprint("r", i, "c")}
		orig, err := w.Append(ctx, e.msgs(t, make([]byte, 1024), ids...)...)
		require.NoError(t, err)
		f := w.AppendAsync(ctx, e.msgs(t, make([]byte, 1024), ids...)...)
		got, err := f.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, orig, got)
		refs = append(refs, weak.Make(f))
	}
	// The writer is still open: what it still references stays alive.
	runtime.GC()
	runtime.GC()
	alive := 0
	for _, r := range refs {
		if r.Value() != nil {
			alive++
		}
	}
	t.Logf("%d of %d resolved retried appends still reachable; stats %+v", alive, n, w.Stats())
	require.LessOrEqual(t, alive, 8, "the writer retains resolved retried appends")
}

// TestRegressionRepeatedMsgIDInAppend: one append carrying the same caller
// message ID twice is an invalid argument and writes nothing (the server
// would store one and drop the other as a duplicate). Covered for a small
// append and a large one (the repeat found past the first 16 messages).
func TestRegressionRepeatedMsgIDInAppend(t *testing.T) {
	e := newRegEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc := e.connect(t)
	b := e.backend(t, nc, jetstream.Options{})
	w, err := b.OpenWriter(ctx, e.p, 1)
	require.NoError(t, err)
	closeOnCleanup(t, w)
	before := e.lastSeq(t, ctx, nc)

	large := make([]string, 40)
	for i := range large {
		large[i] = fmt.Sprint("m", i)
	}
	large[37] = large[20]
	for _, ids := range [][]string{{"dup", "dup"}, {"x", "dup", "y", "dup"}, large} {
		got, err := w.Append(ctx, e.msgs(t, []byte("p"), ids...)...)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "append of %d messages repeating an ID", len(ids))
		require.Nil(t, got)
	}
	require.Zero(t, w.Stats().Units, "nothing may be sent")
	require.Equal(t, before, e.lastSeq(t, ctx, nc), "nothing may be written")
	require.NoError(t, w.Err())

	// Distinct IDs, and writer-made IDs mixed with caller IDs, are fine.
	got, err := w.Append(ctx, e.msg(t, "dup", []byte("p")), e.msg(t, "", []byte("p")), e.msg(t, "", []byte("p")))
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Equal(t, messages.MessageID(before+1), got[0])
}

// TestRegressionReopenSameTerm: barrier IDs are fixed per (pchannel, term,
// node). Reopening under the same term by the same node, when its barrier
// is still the stream's tail (its ack was lost, or the writer closed before
// writing), returns that same barrier; once anything was appended after
// it, or for another node, reopening under that term is ErrFenced.
func TestRegressionReopenSameTerm(t *testing.T) {
	e := newRegEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nc := e.connect(t)
	b := e.backend(t, nc, jetstream.Options{})

	w1, err := b.OpenWriter(ctx, e.p, 7, jetstream.WithNode("node-a"))
	require.NoError(t, err)
	barrier := w1.Barrier()
	require.NoError(t, w1.Close())
	require.Equal(t, uint64(barrier.ID()), e.lastSeq(t, ctx, nc))

	w2, err := b.OpenWriter(ctx, e.p, 7, jetstream.WithNode("node-a"))
	require.NoError(t, err, "reopening under the same term with our barrier at the tail")
	require.Equal(t, barrier.ID(), w2.Barrier().ID(), "the same barrier, not a second one")
	require.Equal(t, barrier.MsgID(), w2.Barrier().MsgID())
	require.Equal(t, uint64(barrier.ID()), e.lastSeq(t, ctx, nc), "no second barrier was written")

	_, err = b.OpenWriter(ctx, e.p, 7, jetstream.WithNode("node-b"))
	require.ErrorIs(t, err, streamwal.ErrFenced, "another node under the same term")

	ids, err := w2.Append(ctx, e.msg(t, "", []byte("after the barrier")))
	require.NoError(t, err)
	require.Equal(t, []messages.MessageID{barrier.ID() + 1}, ids)
	require.NoError(t, w2.Close())

	_, err = b.OpenWriter(ctx, e.p, 7, jetstream.WithNode("node-a"))
	require.ErrorIs(t, err, streamwal.ErrFenced, "reopening under the same term after more was written")
	_, err = b.OpenWriter(ctx, e.p, 6, jetstream.WithNode("node-a"))
	require.ErrorIs(t, err, streamwal.ErrFenced, "an older term")
	require.Equal(t, uint64(barrier.ID())+1, e.lastSeq(t, ctx, nc), "refused opens write nothing")

	w3, err := b.OpenWriter(ctx, e.p, 8, jetstream.WithNode("node-a"))
	require.NoError(t, err, "a newer term")
	require.Equal(t, barrier.ID()+2, w3.Barrier().ID())
	require.NoError(t, w3.Close())
}

// TestRegressionMaxPayloadBoundary: messages at the edge of the
// connection's max_payload, after messages with the longest caller IDs (so
// that the expectation headers the writer adds are longest), as plain
// publishes and as the first message of an atomic batch. Each append either
// lands where it says or fails with ErrInvalidArgument; none wedges the
// writer, and the appends after them land right behind.
func TestRegressionMaxPayloadBoundary(t *testing.T) {
	e := newRegEnv(t, func(o *embedded.Options) { o.MaxPayload = 1 << 20 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc := e.connect(t)
	b := e.backend(t, nc, jetstream.Options{})
	w, err := b.OpenWriter(ctx, e.p, 1)
	require.NoError(t, err)
	closeOnCleanup(t, w)
	long := func(c byte) string { return string(bytes.Repeat([]byte{c}, messages.MaxMsgIDLen)) }
	subject := e.codec.Subject(e.msg(t, "", nil))
	// boundary is as large as the writer's own size check lets through.
	boundary := func(id string) *messages.MutableMessage {
		return e.msg(t, id, make([]byte, int(nc.MaxPayload())-256-len(subject)-128-len(id)))
	}
	small := func(id string) *messages.MutableMessage { return e.msg(t, id, []byte("small")) }
	type step struct {
		msgs  []*messages.MutableMessage
		maybe bool // may fail with ErrInvalidArgument
	}
	stored := map[messages.MessageID]string{}
	for i, s := range []step{
		{msgs: []*messages.MutableMessage{small(long('a'))}},
		{msgs: []*messages.MutableMessage{boundary(long('b'))}, maybe: true},
		{msgs: []*messages.MutableMessage{small(long('c'))}},
		{msgs: []*messages.MutableMessage{boundary(long('d')), small(long('e'))}, maybe: true},
		{msgs: []*messages.MutableMessage{small("")}},
		{msgs: []*messages.MutableMessage{boundary("")}, maybe: true},
		{msgs: []*messages.MutableMessage{small(""), small("")}},
		{msgs: []*messages.MutableMessage{small("last")}},
	} {
		actx, acancel := context.WithTimeout(ctx, 8*time.Second)
		ids, err := w.Append(actx, s.msgs...)
		acancel()
		t.Logf("append %d: %v %v", i, ids, err)
		if s.maybe && err != nil {
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "append %d", i)
			continue
		}
		require.NoError(t, err, "append %d", i)
		require.Len(t, ids, len(s.msgs))
		for k, id := range ids {
			stored[id] = s.msgs[k].MsgID()
		}
	}
	all := e.contents(t, ctx, b, nc)
	require.Len(t, all, len(stored)+1, "the barrier and what was acknowledged, nothing else:%s", describe(all))
	for _, m := range all[1:] {
		want, ok := stored[m.ID()]
		require.True(t, ok, "message %d was not acknowledged", m.ID())
		if want != "" {
			require.Equal(t, want, m.MsgID(), "message %d", m.ID())
		}
	}
	closeWithin(t, w, 5*time.Second)
}
