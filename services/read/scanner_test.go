package read_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
)

// wal is one embedded server with a raw backend writer on PChannel p: the
// tests write messages with hand-set TimeTicks and transaction contexts,
// as a WAL would, and read them back through the read pipeline.
type wal struct {
	t      *testing.T
	nc     *nats.Conn
	codec  *messages.Codec
	be     jetstream.Backend
	w      jetstream.Writer
	p      streamwal.PChannel
	v1, v2 streamwal.VChannel
	tt     messages.TimeTick
}

func newWAL(t *testing.T) *wal {
	t.Helper()
	srv := embedded.StartTest(t)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	codec, err := messages.NewCodec("test", nil)
	require.NoError(t, err)
	be, err := jetstream.New(nc, codec, jetstream.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = be.Close() })
	p, err := streamwal.NewPChannel("p", 0)
	require.NoError(t, err)
	w, err := be.OpenWriter(context.Background(), p, 1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	v1, err := p.VChannel(1, 0)
	require.NoError(t, err)
	v2, err := p.VChannel(2, 0)
	require.NoError(t, err)
	return &wal{t: t, nc: nc, codec: codec, be: be, w: w, p: p, v1: v1, v2: v2, tt: ms(1000)}
}

// written is a message as appended: its ID and TimeTick.
type written struct {
	ID       messages.MessageID
	TimeTick messages.TimeTick
}

// append stamps msgs with the next TimeTicks and appends them.
func (e *wal) append(msgs ...*messages.MutableMessage) []written {
	e.t.Helper()
	for _, m := range msgs {
		e.tt += ms(1)
		m.SetTimeTick(e.tt)
	}
	got, err := e.w.Append(context.Background(), msgs...)
	require.NoError(e.t, err)
	out := make([]written, len(got))
	for i, id := range got {
		out[i] = written{ID: id, TimeTick: msgs[i].TimeTick()}
	}
	return out
}

func (e *wal) insert(v streamwal.VChannel, opts ...messages.Option) *messages.MutableMessage {
	e.t.Helper()
	m, err := e.codec.New(messages.TypeInsert, v, []byte("row"), opts...)
	require.NoError(e.t, err)
	return m
}

func (e *wal) body(typ *messages.Type, v streamwal.VChannel, body any, opts ...messages.Option) *messages.MutableMessage {
	e.t.Helper()
	m, err := e.codec.NewBody(typ, v, body, opts...)
	require.NoError(e.t, err)
	return m
}

func (e *wal) pbody(typ *messages.Type, body any) *messages.MutableMessage {
	e.t.Helper()
	m, err := e.codec.NewPChannelBody(typ, e.p, body)
	require.NoError(e.t, err)
	return m
}

// one appends a single message.
func (e *wal) one(m *messages.MutableMessage) written {
	e.t.Helper()
	return e.append(m)[0]
}

// open opens a scanner and closes it at the end of the test.
func (e *wal) open(o read.Options) *read.Scanner {
	e.t.Helper()
	o.Backend, o.Codec, o.PChannel = e.be, e.codec, e.p
	s, err := read.Open(context.Background(), o)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

// readUntil reads s until it delivers the message with ID last (which the
// test knows it delivers) and returns what it delivered.
func readUntil(t *testing.T, s *read.Scanner, last messages.MessageID) []*messages.ImmutableMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*messages.ImmutableMessage
	for {
		m, err := s.Next(ctx)
		require.NoError(t, err, "read until %d, got %v", last, ids(out))
		out = append(out, m)
		require.LessOrEqual(t, m.ID(), last, "read past %d: %v", last, ids(out))
		if m.ID() == last {
			return out
		}
	}
}

func wids(ws ...written) []messages.MessageID {
	out := make([]messages.MessageID, len(ws))
	for i, w := range ws {
		out[i] = w.ID
	}
	return out
}

func TestOpenInvalid(t *testing.T) {
	e := newWAL(t)
	other, err := streamwal.NewPChannel("p", 1)
	require.NoError(t, err)
	foreign, err := other.VChannel(1, 0)
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		o    read.Options
	}{
		{"no backend", read.Options{Codec: e.codec, PChannel: e.p}},
		{"no codec", read.Options{Backend: e.be, PChannel: e.p}},
		{"no pchannel", read.Options{Backend: e.be, Codec: e.codec}},
		{"vchannel of another pchannel", read.Options{Backend: e.be, Codec: e.codec, PChannel: e.p, VChannel: foreign}},
		{"unknown start", read.Options{Backend: e.be, Codec: e.codec, PChannel: e.p, Start: read.Start{Position: jetstream.StartPosition{Kind: 99}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := read.Open(context.Background(), c.o)
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			require.Nil(t, s)
		})
	}
}

func TestVChannelScanner(t *testing.T) {
	e := newWAL(t)
	tc := messages.TxnContext{ID: 5, Keepalive: time.Minute}
	w := e.append(
		e.insert(e.v1), // 0
		e.insert(e.v2), // 1
		e.pbody(messages.TypeTimeTick, messages.TimeTickBody{}),                              // 2
		e.body(messages.TypeBeginTxn, e.v2, messages.BeginTxnBody{}, messages.WithTxn(tc)),   // 3
		e.insert(e.v2, messages.WithTxn(tc)),                                                 // 4
		e.body(messages.TypeCommitTxn, e.v2, messages.CommitTxnBody{}, messages.WithTxn(tc)), // 5
		e.insert(e.v1), // 6
		e.pbody(messages.TypeFlushAll, messages.FlushAllBody{}), // 7
	)
	last := w[7].ID
	types := []*messages.Type{messages.TypeInsert, messages.TypeTxn, messages.TypeTimeTick, messages.TypeFlushAll}

	got := readUntil(t, e.open(read.Options{VChannel: e.v1, Types: types}), last)
	require.Equal(t, wids(w[0], w[2], w[6], w[7]), ids(got), "a vchannel scanner sees its vchannel and the pchannel-level messages")
	for _, m := range got {
		if !m.VChannel().IsZero() {
			require.Equal(t, e.v1, m.VChannel())
		}
	}

	got = readUntil(t, e.open(read.Options{VChannel: e.v2, Types: types}), last)
	require.Equal(t, wids(w[1], w[2], w[5], w[7]), ids(got))
	require.Same(t, messages.TypeTxn, got[2].Type())
	require.Equal(t, wids(w[4]), ids(got[2].TxnBody()))

	got = readUntil(t, e.open(read.Options{Types: types}), last)
	require.Equal(t, wids(w[0], w[1], w[2], w[5], w[6], w[7]), ids(got), "a pchannel scanner sees everything")

	got = readUntil(t, e.open(read.Options{}), last)
	require.Equal(t, wids(w[0], w[1], w[5], w[6], w[7]), ids(got), "by default no TimeTick and no barrier")
}

func TestStartPositions(t *testing.T) {
	e := newWAL(t)
	w := e.append(e.insert(e.v1), e.insert(e.v1), e.insert(e.v2), e.insert(e.v1), e.insert(e.v1))
	last := w[4].ID

	t.Run("earliest", func(t *testing.T) {
		got := readUntil(t, e.open(read.Options{Start: read.Earliest()}), last)
		require.Equal(t, wids(w...), ids(got))
	})
	t.Run("earliest with the barrier", func(t *testing.T) {
		got := readUntil(t, e.open(read.Options{Start: read.Earliest(), Types: []*messages.Type{messages.TypeRecoveryBarrier, messages.TypeInsert}}), last)
		require.Equal(t, e.w.Barrier().ID(), got[0].ID(), "the stream starts with the writer's barrier")
		require.Equal(t, wids(w...), ids(got[1:]))
	})
	t.Run("from", func(t *testing.T) {
		got := readUntil(t, e.open(read.Options{Start: read.From(w[2].ID)}), last)
		require.Equal(t, wids(w[2:]...), ids(got))
	})
	t.Run("after", func(t *testing.T) {
		got := readUntil(t, e.open(read.Options{Start: read.After(w[2].ID)}), last)
		require.Equal(t, wids(w[3:]...), ids(got))
	})
	t.Run("at timetick", func(t *testing.T) {
		got := readUntil(t, e.open(read.Options{Start: read.AtTimeTick(w[2].TimeTick)}), last)
		require.Equal(t, wids(w[2:]...), ids(got), "the first message with a TimeTick at or above t")
		got = readUntil(t, e.open(read.Options{Start: read.AtTimeTick(w[2].TimeTick - 1)}), last)
		require.Equal(t, wids(w[2:]...), ids(got), "t between two messages")
	})
	t.Run("min timetick", func(t *testing.T) {
		got := readUntil(t, e.open(read.Options{Start: read.From(w[1].ID), MinTimeTick: w[3].TimeTick}), last)
		require.Equal(t, wids(w[3:]...), ids(got))
		// The larger of AtTimeTick and MinTimeTick wins.
		got = readUntil(t, e.open(read.Options{Start: read.AtTimeTick(w[1].TimeTick), MinTimeTick: w[3].TimeTick}), last)
		require.Equal(t, wids(w[3:]...), ids(got))
		got = readUntil(t, e.open(read.Options{Start: read.AtTimeTick(w[3].TimeTick), MinTimeTick: w[1].TimeTick}), last)
		require.Equal(t, wids(w[3:]...), ids(got))
	})
	t.Run("vchannel from", func(t *testing.T) {
		got := readUntil(t, e.open(read.Options{VChannel: e.v1, Start: read.From(w[1].ID)}), last)
		require.Equal(t, wids(w[1], w[3], w[4]), ids(got))
	})
	t.Run("latest", func(t *testing.T) {
		s := e.open(read.Options{Start: read.Latest()})
		later := e.append(e.insert(e.v1), e.insert(e.v2))
		got := readUntil(t, s, later[1].ID)
		require.Equal(t, wids(later...), ids(got), "only what is appended after the scanner opened")
	})
}

// TestAtTimeTickTxn: a scanner starting at a TimeTick sees a transaction
// that began before it and commits after it, and not one that committed
// before it.
func TestAtTimeTickTxn(t *testing.T) {
	e := newWAL(t)
	x := messages.TxnContext{ID: 1, Keepalive: time.Minute}
	y := messages.TxnContext{ID: 2, Keepalive: time.Minute}
	w := e.append(
		e.body(messages.TypeBeginTxn, e.v1, messages.BeginTxnBody{}, messages.WithTxn(x)),   // 0
		e.body(messages.TypeBeginTxn, e.v1, messages.BeginTxnBody{}, messages.WithTxn(y)),   // 1
		e.insert(e.v1, messages.WithTxn(x)),                                                 // 2
		e.body(messages.TypeCommitTxn, e.v1, messages.CommitTxnBody{}, messages.WithTxn(y)), // 3
		e.insert(e.v1),                      // 4
		e.insert(e.v1, messages.WithTxn(x)), // 5
		e.body(messages.TypeCommitTxn, e.v1, messages.CommitTxnBody{}, messages.WithTxn(x)), // 6
	)
	got := readUntil(t, e.open(read.Options{VChannel: e.v1, Start: read.AtTimeTick(w[4].TimeTick)}), w[6].ID)
	require.Equal(t, wids(w[4], w[6]), ids(got))
	require.Equal(t, wids(w[2], w[5]), ids(got[1].TxnBody()))
	require.Equal(t, w[6].TimeTick, got[1].TimeTick())

	// Starting after the BeginTxn, the transaction is not seen at all.
	got = readUntil(t, e.open(read.Options{VChannel: e.v1, Start: read.From(w[1].ID)}), w[4].ID)
	require.Equal(t, wids(w[3], w[4]), ids(got))
	require.Empty(t, got[0].TxnBody())
}

func TestAllStopsOnCancel(t *testing.T) {
	e := newWAL(t)
	w := e.append(e.insert(e.v1), e.insert(e.v1), e.insert(e.v1))
	s := e.open(read.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	var got []messages.MessageID
	var last error
	pairs := 0
	for m, err := range s.All(cctx) {
		pairs++
		if err != nil {
			require.Nil(t, m)
			last = err
			continue // the error must be the last pair: the loop ends by itself
		}
		require.NoError(t, last, "a message after the error")
		got = append(got, m.ID())
		if len(got) == len(w) {
			stop()
		}
	}
	require.ErrorIs(t, last, context.Canceled)
	require.Equal(t, wids(w...), got)
	require.Equal(t, len(w)+1, pairs)

	// Breaking out of the loop early stops the iteration; the scanner
	// reads on afterwards.
	more := e.append(e.insert(e.v2), e.insert(e.v2))
	for m, err := range s.All(ctx) {
		require.NoError(t, err)
		require.Equal(t, more[0].ID, m.ID())
		break
	}
	m, err := s.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, more[1].ID, m.ID())
}

func TestClose(t *testing.T) {
	e := newWAL(t)
	w := e.one(e.insert(e.v1))
	s := e.open(read.Options{Ticks: e.nc})
	readUntil(t, s, w.ID)

	// A Next blocked on an empty stream returns when the scanner closes.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Next(ctx)
		errc <- err
	}()
	require.NoError(t, s.Close())
	require.ErrorIs(t, <-errc, streamwal.ErrClosed)

	_, err := s.Next(ctx)
	require.ErrorIs(t, err, streamwal.ErrClosed)
	var pairs int
	for m, err := range s.All(ctx) {
		pairs++
		require.Nil(t, m)
		require.ErrorIs(t, err, streamwal.ErrClosed)
	}
	require.Equal(t, 1, pairs)
	require.NoError(t, s.Close(), "Close is idempotent")
}

// publishTick publishes a live tick of e's PChannel.
func (e *wal) publishTick(tt messages.TimeTick, covers messages.MessageID) {
	e.t.Helper()
	m, err := e.codec.EncodeLiveTick(messages.LiveTick{PChannel: e.p, TimeTick: tt, Covers: covers, Term: 1})
	require.NoError(e.t, err)
	require.NoError(e.t, e.nc.PublishMsg(m))
}

func TestLiveTicks(t *testing.T) {
	for _, v := range []string{"pchannel", "vchannel"} {
		t.Run(v, func(t *testing.T) {
			e := newWAL(t)
			o := read.Options{Ticks: e.nc}
			if v == "vchannel" {
				o.VChannel = e.v1
			}
			s := e.open(o)
			e.one(e.insert(e.v1))
			e.one(e.insert(e.v2))
			tick := e.one(e.pbody(messages.TypeTimeTick, messages.TimeTickBody{}))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			m, err := s.Next(ctx)
			require.NoError(t, err)
			require.Equal(t, e.v1, m.VChannel())
			if v == "pchannel" {
				m, err = s.Next(ctx)
				require.NoError(t, err)
				require.Equal(t, e.v2, m.VChannel())
			}
			// The TimeTick message is not delivered; a sentinel behind it
			// is, and by then the tick has been read.
			sentinel := e.one(e.pbody(messages.TypeFlushAll, messages.FlushAllBody{}))
			readUntil(t, s, sentinel.ID)
			require.Equal(t, sentinel.TimeTick, s.Watermark())
			require.Greater(t, sentinel.ID, tick.ID)

			// A live tick covering the last message read advances the
			// watermark though nothing is appended.
			e.publishTick(sentinel.TimeTick+ms(5), sentinel.ID)
			require.Eventually(t, func() bool { return s.Watermark() == sentinel.TimeTick+ms(5) }, 10*time.Second, time.Millisecond)

			// A tick covering a message not read yet waits for it. The
			// tick after it covers what was read: once that one shows,
			// the first has been taken in too, and did not apply.
			next := e.one(e.pbody(messages.TypeTimeTick, messages.TimeTickBody{}))
			e.publishTick(next.TimeTick+ms(10), next.ID)
			e.publishTick(sentinel.TimeTick+ms(6), sentinel.ID)
			require.Eventually(t, func() bool { return s.Watermark() == sentinel.TimeTick+ms(6) }, 10*time.Second, time.Millisecond)
			// Reading the covered message applies the waiting tick.
			after := e.one(e.pbody(messages.TypeFlushAll, messages.FlushAllBody{}))
			readUntil(t, s, after.ID)
			require.Equal(t, next.TimeTick+ms(10), s.Watermark(), "the waiting tick applied, above the messages read")
			require.Less(t, after.TimeTick, next.TimeTick+ms(10))

			// Garbage on the tick subject is ignored.
			require.NoError(t, e.nc.Publish(e.codec.Cluster().LiveTickSubject(e.p), []byte("junk")))
			e.publishTick(after.TimeTick+ms(20), after.ID)
			require.Eventually(t, func() bool { return s.Watermark() == after.TimeTick+ms(20) }, 10*time.Second, time.Millisecond)
		})
	}
}

// TestNoTicksWithoutConn: without Options.Ticks the watermark moves only
// with the messages read.
func TestNoTicksWithoutConn(t *testing.T) {
	e := newWAL(t)
	s := e.open(read.Options{})
	w := e.one(e.insert(e.v1))
	readUntil(t, s, w.ID)
	require.Equal(t, w.TimeTick, s.Watermark())
}

// TestLatestWatermark: a scanner opened at Latest on an idle WAL is a live
// reader like any other; the live ticks of the writer should advance its
// watermark.
func TestLatestWatermark(t *testing.T) {
	e := newWAL(t)
	tick := e.one(e.pbody(messages.TypeTimeTick, messages.TimeTickBody{}))
	s := e.open(read.Options{Ticks: e.nc, Start: read.Latest()})
	e.publishTick(tick.TimeTick+ms(5), tick.ID)
	require.Eventually(t, func() bool { return s.Watermark() == tick.TimeTick+ms(5) }, 5*time.Second, time.Millisecond)
}

// TestAfterWatermark: the same for a scanner started right after the
// stream's tail.
func TestAfterWatermark(t *testing.T) {
	e := newWAL(t)
	tick := e.one(e.pbody(messages.TypeTimeTick, messages.TimeTickBody{}))
	s := e.open(read.Options{Ticks: e.nc, Start: read.After(tick.ID)})
	e.publishTick(tick.TimeTick+ms(5), tick.ID)
	require.Eventually(t, func() bool { return s.Watermark() == tick.TimeTick+ms(5) }, 5*time.Second, time.Millisecond)
}

// TestConcurrentWatermark reads while ticks arrive and Watermark is
// polled (for the race detector).
func TestConcurrentWatermark(t *testing.T) {
	e := newWAL(t)
	s := e.open(read.Options{Ticks: e.nc})
	done := make(chan struct{})
	polled := make(chan error, 1)
	go func() {
		var prev messages.TimeTick
		for {
			select {
			case <-done:
				polled <- nil
				return
			default:
			}
			w := s.Watermark()
			if w < prev {
				polled <- errors.New("watermark went down")
				return
			}
			prev = w
		}
	}()
	for range 20 {
		last := e.one(e.pbody(messages.TypeTimeTick, messages.TimeTickBody{}))
		e.publishTick(last.TimeTick+1, last.ID)
		e.one(e.insert(e.v1))
	}
	sentinel := e.one(e.insert(e.v2))
	got := readUntil(t, s, sentinel.ID)
	require.Len(t, got, 21)
	close(done)
	require.NoError(t, <-polled)
	require.GreaterOrEqual(t, s.Watermark(), sentinel.TimeTick)
}

// TestOpenBackendError: when the backend cannot read, Open fails with its
// error and leaves no live-tick subscription behind.
func TestOpenBackendError(t *testing.T) {
	e := newWAL(t)
	be, err := jetstream.New(e.nc, e.codec, jetstream.Options{PChannels: []streamwal.PChannel{e.p}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = be.Close() })
	elsewhere, err := streamwal.NewPChannel("p", 9)
	require.NoError(t, err)
	before := e.nc.NumSubscriptions()
	s, err := read.Open(context.Background(), read.Options{Backend: be, Codec: e.codec, PChannel: elsewhere, Ticks: e.nc})
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "the backend does not serve %s", elsewhere)
	require.Nil(t, s)
	require.Equal(t, before, e.nc.NumSubscriptions())
}

// TestOpenTicksClosed: a live-tick connection that cannot subscribe fails
// Open as unavailable.
func TestOpenTicksClosed(t *testing.T) {
	e := newWAL(t)
	nc, err := nats.Connect(e.nc.ConnectedUrl())
	require.NoError(t, err)
	nc.Close()
	s, err := read.Open(context.Background(), read.Options{Backend: e.be, Codec: e.codec, PChannel: e.p, Ticks: nc})
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.Nil(t, s)
}
