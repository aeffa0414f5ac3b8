package read_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
)

// stream builds the immutable messages of one PChannel by hand: IDs are
// handed out in push order, TimeTicks are whatever the test says.
type stream struct {
	t      tb
	c      *messages.Codec
	p      streamwal.PChannel
	v1, v2 streamwal.VChannel
	id     messages.MessageID
}

// tb is what the helpers need of a *testing.T or a *rapid.T.
type tb interface {
	require.TestingT
	Helper()
	Fatalf(format string, args ...any)
}

func newStream(t tb) *stream {
	t.Helper()
	c, err := messages.NewCodec("test", nil)
	require.NoError(t, err)
	p, err := streamwal.NewPChannel("p", 0)
	require.NoError(t, err)
	v1, err := p.VChannel(1, 0)
	require.NoError(t, err)
	v2, err := p.VChannel(2, 0)
	require.NoError(t, err)
	return &stream{t: t, c: c, p: p, v1: v1, v2: v2}
}

// ms is the TimeTick at physical millisecond n (logical 0).
func ms(n int64) messages.TimeTick { return messages.TimeTick(n) << messages.LogicalBits }

// freeze stamps m with tt and the next MessageID; its LastConfirmed is lc,
// or its own ID when lc is zero.
func (s *stream) freeze(m *messages.MutableMessage, tt messages.TimeTick, lc messages.MessageID) *messages.ImmutableMessage {
	s.t.Helper()
	s.id++
	m.SetTimeTick(tt)
	if lc == 0 {
		lc = s.id
	}
	m.SetLastConfirmed(lc)
	return m.Freeze(s.id)
}

// msg builds a VChannel message of typ with payload (raw types) or body
// (body types), in txn tc when not nil.
func (s *stream) msg(typ *messages.Type, v streamwal.VChannel, tt messages.TimeTick, tc *messages.TxnContext) *messages.ImmutableMessage {
	s.t.Helper()
	var m *messages.MutableMessage
	var err error
	switch typ {
	case messages.TypeBeginTxn:
		m, err = s.c.NewBody(typ, v, messages.BeginTxnBody{})
	case messages.TypeCommitTxn:
		m, err = s.c.NewBody(typ, v, messages.CommitTxnBody{})
	case messages.TypeRollbackTxn:
		m, err = s.c.NewBody(typ, v, messages.RollbackTxnBody{})
	case messages.TypeManualFlush:
		m, err = s.c.NewBody(typ, v, messages.ManualFlushBody{CollectionID: v.CollectionID()})
	case messages.TypeCreatePartition:
		m, err = s.c.NewBody(typ, v, messages.PartitionBody{CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: "c", CollectionID: v.CollectionID()}, PartitionID: 7})
	default:
		m, err = s.c.New(typ, v, fmt.Appendf(nil, "%s@%d", typ.Name, tt))
	}
	require.NoError(s.t, err)
	if tc != nil {
		require.NoError(s.t, m.SetTxn(tc))
	}
	return s.freeze(m, tt, 0)
}

func (s *stream) insert(v streamwal.VChannel, tt messages.TimeTick) *messages.ImmutableMessage {
	return s.msg(messages.TypeInsert, v, tt, nil)
}

// pmsg builds a PChannel-level message of typ.
func (s *stream) pmsg(typ *messages.Type, tt messages.TimeTick) *messages.ImmutableMessage {
	s.t.Helper()
	var body any
	switch typ {
	case messages.TypeTimeTick:
		body = messages.TimeTickBody{}
	case messages.TypeRecoveryBarrier:
		body = messages.RecoveryBarrierBody{Term: 1, Node: "n1"}
	case messages.TypeFlushAll:
		body = messages.FlushAllBody{}
	default:
		s.t.Fatalf("no body for %s", typ)
	}
	m, err := s.c.NewPChannelBody(typ, s.p, body)
	require.NoError(s.t, err)
	return s.freeze(m, tt, 0)
}

// txn is one transaction's messages as the WAL writes them.
type txn struct {
	s  *stream
	v  streamwal.VChannel
	tc messages.TxnContext
}

func (s *stream) txn(id messages.TxnID, v streamwal.VChannel, keepalive time.Duration) *txn {
	return &txn{s: s, v: v, tc: messages.TxnContext{ID: id, Keepalive: keepalive}}
}

func (x *txn) begin(tt messages.TimeTick) *messages.ImmutableMessage {
	return x.s.msg(messages.TypeBeginTxn, x.v, tt, &x.tc)
}

func (x *txn) body(typ *messages.Type, tt messages.TimeTick) *messages.ImmutableMessage {
	return x.s.msg(typ, x.v, tt, &x.tc)
}

// commit builds the CommitTxn; its LastConfirmed is lc (as the WAL sets
// it: the BeginTxn of the oldest transaction open, its own included).
func (x *txn) commit(tt messages.TimeTick, lc messages.MessageID) *messages.ImmutableMessage {
	x.s.t.Helper()
	m, err := x.s.c.NewBody(messages.TypeCommitTxn, x.v, messages.CommitTxnBody{}, messages.WithTxn(x.tc))
	require.NoError(x.s.t, err)
	return x.s.freeze(m, tt, lc)
}

func (x *txn) rollback(tt messages.TimeTick) *messages.ImmutableMessage {
	return x.s.msg(messages.TypeRollbackTxn, x.v, tt, &x.tc)
}

// push feeds msgs to a and returns what it delivered.
func push(a *read.Assembler, msgs ...*messages.ImmutableMessage) []*messages.ImmutableMessage {
	var out []*messages.ImmutableMessage
	for _, m := range msgs {
		if d := a.Push(m); d != nil {
			out = append(out, d)
		}
	}
	return out
}

func ids(ms []*messages.ImmutableMessage) []messages.MessageID {
	out := make([]messages.MessageID, len(ms))
	for i, m := range ms {
		out[i] = m.ID()
	}
	return out
}

// requireTxn checks an assembled transaction against its parts.
func requireTxn(t testing.TB, got, begin *messages.ImmutableMessage, body []*messages.ImmutableMessage, commit *messages.ImmutableMessage) {
	t.Helper()
	require.NotNil(t, got)
	require.Same(t, messages.TypeTxn, got.Type())
	require.Equal(t, commit.ID(), got.ID())
	require.Equal(t, commit.TimeTick(), got.TimeTick())
	require.Equal(t, commit.LastConfirmed(), got.LastConfirmed())
	require.Equal(t, commit.VChannel(), got.VChannel())
	require.Equal(t, commit.Txn(), got.Txn())
	require.Same(t, begin, got.TxnBegin())
	require.Same(t, commit, got.TxnCommit())
	require.Equal(t, ids(body), ids(got.TxnBody()))
	for i, b := range got.TxnBody() {
		require.Same(t, body[i], b)
	}
}

func TestPlainInOrder(t *testing.T) {
	s := newStream(t)
	a := read.NewAssembler(read.Filter{})
	in := []*messages.ImmutableMessage{
		s.insert(s.v1, ms(1)),
		s.msg(messages.TypeDelete, s.v2, ms(2), nil),
		s.msg(messages.TypeUpsert, s.v1, ms(3), nil),
		s.insert(s.v2, ms(4)),
	}
	out := push(a, in...)
	require.Equal(t, ids(in), ids(out))
	for i := range in {
		require.Same(t, in[i], out[i], "a plain message is delivered as is")
	}
	require.Equal(t, in[3].ID(), a.Last())
	require.Zero(t, a.Open())
}

func TestWALMessagesFiltered(t *testing.T) {
	s := newStream(t)
	barrier := s.pmsg(messages.TypeRecoveryBarrier, ms(1))
	ins := s.insert(s.v1, ms(2))
	tick := s.pmsg(messages.TypeTimeTick, ms(3))
	in := []*messages.ImmutableMessage{barrier, ins, tick}

	out := push(read.NewAssembler(read.Filter{}), in...)
	require.Equal(t, ids([]*messages.ImmutableMessage{ins}), ids(out), "by default the WAL's own messages are not delivered")

	out = push(read.NewAssembler(read.Filter{Types: []*messages.Type{messages.TypeTimeTick, messages.TypeRecoveryBarrier}}), in...)
	require.Equal(t, ids([]*messages.ImmutableMessage{barrier, tick}), ids(out))

	out = push(read.NewAssembler(read.Filter{Types: []*messages.Type{messages.TypeTimeTick, messages.TypeInsert}}), in...)
	require.Equal(t, ids([]*messages.ImmutableMessage{ins, tick}), ids(out))
}

func TestTxnAssembled(t *testing.T) {
	s := newStream(t)
	a := read.NewAssembler(read.Filter{})
	x := s.txn(10, s.v1, time.Second)
	begin := x.begin(ms(1))
	require.Nil(t, a.Push(begin))
	require.Equal(t, 1, a.Open())
	b1 := x.body(messages.TypeInsert, ms(2))
	other := s.insert(s.v2, ms(3))
	b2 := x.body(messages.TypeDelete, ms(4))
	b3 := x.body(messages.TypeUpsert, ms(5))
	commit := x.commit(ms(6), begin.ID())
	after := s.insert(s.v1, ms(7))

	out := push(a, b1, other, b2, b3, commit, after)
	require.Len(t, out, 3)
	require.Same(t, other, out[0], "a plain message in the middle of a transaction is delivered at its place")
	requireTxn(t, out[1], begin, []*messages.ImmutableMessage{b1, b2, b3}, commit)
	require.Equal(t, begin.ID(), out[1].LastConfirmed())
	require.Same(t, after, out[2])
	require.Zero(t, a.Open())
}

func TestTxnEmpty(t *testing.T) {
	s := newStream(t)
	a := read.NewAssembler(read.Filter{})
	x := s.txn(1, s.v1, time.Second)
	begin := x.begin(ms(1))
	commit := x.commit(ms(2), begin.ID())
	out := push(a, begin, commit)
	require.Len(t, out, 1)
	requireTxn(t, out[0], begin, nil, commit)
}

func TestTxnInterleaved(t *testing.T) {
	s := newStream(t)
	a := read.NewAssembler(read.Filter{})
	x := s.txn(1, s.v1, time.Second)
	y := s.txn(2, s.v2, time.Second)
	z := s.txn(3, s.v1, time.Second)
	xb := x.begin(ms(1))
	yb := y.begin(ms(2))
	x1 := x.body(messages.TypeInsert, ms(3))
	zb := z.begin(ms(4))
	y1 := y.body(messages.TypeInsert, ms(5))
	z1 := z.body(messages.TypeInsert, ms(6))
	x2 := x.body(messages.TypeInsert, ms(7))
	yc := y.commit(ms(8), xb.ID())
	zr := z.rollback(ms(9))
	xc := x.commit(ms(10), xb.ID())
	out := push(a, xb, yb, x1, zb, y1, z1, x2, yc, zr, xc)
	require.Len(t, out, 2)
	requireTxn(t, out[0], yb, []*messages.ImmutableMessage{y1}, yc)
	requireTxn(t, out[1], xb, []*messages.ImmutableMessage{x1, x2}, xc)
}

func TestTxnRollback(t *testing.T) {
	s := newStream(t)
	a := read.NewAssembler(read.Filter{})
	x := s.txn(1, s.v1, time.Second)
	out := push(a, x.begin(ms(1)), x.body(messages.TypeInsert, ms(2)), x.rollback(ms(3)))
	require.Empty(t, out)
	require.Zero(t, a.Open())
	// A commit after the rollback (never written by a WAL) assembles nothing.
	require.Nil(t, a.Push(x.commit(ms(4), 0)))
}

func TestTxnExpiry(t *testing.T) {
	const keepalive = 10 * time.Millisecond
	ka := messages.TimeTick(keepalive.Milliseconds()) << messages.LogicalBits
	t0 := ms(1000)
	deadline := t0 + ka

	t.Run("alive at the deadline", func(t *testing.T) {
		s := newStream(t)
		a := read.NewAssembler(read.Filter{})
		x := s.txn(1, s.v1, keepalive)
		begin := x.begin(t0)
		other := s.insert(s.v2, deadline-1)
		commit := x.commit(deadline, begin.ID())
		out := push(a, begin, other)
		require.Equal(t, 1, a.Open())
		out = append(out, push(a, commit)...)
		require.Len(t, out, 2)
		requireTxn(t, out[1], begin, nil, commit)
	})
	t.Run("another message at the deadline", func(t *testing.T) {
		s := newStream(t)
		a := read.NewAssembler(read.Filter{})
		x := s.txn(1, s.v1, keepalive)
		push(a, x.begin(t0), s.insert(s.v2, deadline))
		require.Equal(t, 1, a.Open(), "at exactly the deadline the transaction lives")
	})
	t.Run("expired by another message", func(t *testing.T) {
		s := newStream(t)
		a := read.NewAssembler(read.Filter{})
		x := s.txn(1, s.v1, keepalive)
		other := s.insert(s.v2, deadline+1)
		out := push(a, x.begin(t0), other)
		require.Equal(t, []messages.MessageID{other.ID()}, ids(out), "the message that expires a transaction is itself delivered")
		require.Zero(t, a.Open())
		require.Empty(t, push(a, x.body(messages.TypeInsert, deadline+2), x.commit(deadline+3, 0)))
	})
	t.Run("expired by its own commit", func(t *testing.T) {
		s := newStream(t)
		a := read.NewAssembler(read.Filter{})
		x := s.txn(1, s.v1, keepalive)
		require.Empty(t, push(a, x.begin(t0), x.body(messages.TypeInsert, t0+1), x.commit(t0+1+ka+1, 0)))
		require.Zero(t, a.Open())
	})
	t.Run("a body refreshes the deadline", func(t *testing.T) {
		s := newStream(t)
		a := read.NewAssembler(read.Filter{})
		x := s.txn(1, s.v1, keepalive)
		begin := x.begin(t0)
		body := x.body(messages.TypeInsert, t0+ms(8))
		other := s.insert(s.v2, deadline+1) // past the begin's deadline, not the body's
		commit := x.commit(t0+ms(8)+ka, begin.ID())
		out := push(a, begin, body, other, commit)
		require.Len(t, out, 2)
		requireTxn(t, out[1], begin, []*messages.ImmutableMessage{body}, commit)
	})
	t.Run("a body does not revive an expired transaction", func(t *testing.T) {
		s := newStream(t)
		a := read.NewAssembler(read.Filter{})
		x := s.txn(1, s.v1, keepalive)
		require.Empty(t, push(a, x.begin(t0), x.body(messages.TypeInsert, deadline+1), x.commit(deadline+2, 0)))
	})
	t.Run("each transaction has its own deadline", func(t *testing.T) {
		s := newStream(t)
		a := read.NewAssembler(read.Filter{})
		short := s.txn(1, s.v1, keepalive)
		long := s.txn(2, s.v1, 10*keepalive)
		lb := long.begin(t0 + 1)
		lc := long.commit(deadline+2, lb.ID())
		out := push(a, short.begin(t0), lb, s.insert(s.v2, deadline+1))
		require.Equal(t, 1, a.Open())
		out = append(out, push(a, short.commit(deadline+2, 0), lc)...)
		require.Len(t, out, 2)
		requireTxn(t, out[1], lb, nil, lc)
	})
	t.Run("expiry after the earliest deadline moved", func(t *testing.T) {
		// The earliest deadline first belongs to x; a body of x moves it
		// past y's, and y must still expire at its own.
		s := newStream(t)
		a := read.NewAssembler(read.Filter{})
		x := s.txn(1, s.v1, keepalive)
		y := s.txn(2, s.v2, keepalive)
		push(a, x.begin(t0), y.begin(t0+ms(2)), x.body(messages.TypeInsert, t0+ms(5)))
		require.Equal(t, 2, a.Open())
		push(a, s.insert(s.v1, t0+ms(2)+ka+1))
		require.Equal(t, 1, a.Open(), "y expired, x lives")
		require.Nil(t, a.Push(y.commit(t0+ms(13), 0)))
		require.NotNil(t, a.Push(x.commit(t0+ms(14), 0)))
	})
}

func TestExclusiveAborts(t *testing.T) {
	for _, typ := range []*messages.Type{messages.TypeManualFlush, messages.TypeCreatePartition} {
		t.Run(typ.Name, func(t *testing.T) {
			s := newStream(t)
			a := read.NewAssembler(read.Filter{})
			x := s.txn(1, s.v1, time.Second)
			y := s.txn(2, s.v2, time.Second)
			xb, yb := x.begin(ms(1)), y.begin(ms(2))
			x1, y1 := x.body(messages.TypeInsert, ms(3)), y.body(messages.TypeInsert, ms(4))
			ex := s.msg(typ, s.v1, ms(5), nil)
			out := push(a, xb, yb, x1, y1, ex)
			require.Equal(t, []messages.MessageID{ex.ID()}, ids(out), "the exclusive message is delivered")
			require.Equal(t, 1, a.Open(), "only the transactions of its vchannel end")
			yc := y.commit(ms(7), yb.ID())
			out = push(a, x.commit(ms(6), 0), yc)
			require.Len(t, out, 1)
			requireTxn(t, out[0], yb, []*messages.ImmutableMessage{y1}, yc)
		})
	}
	t.Run("shared does not abort", func(t *testing.T) {
		s := newStream(t)
		a := read.NewAssembler(read.Filter{})
		x := s.txn(1, s.v1, time.Second)
		push(a, x.begin(ms(1)), s.insert(s.v1, ms(2)), s.msg(messages.TypeDelete, s.v1, ms(3), nil))
		require.Equal(t, 1, a.Open())
	})
	t.Run("FlushAll", func(t *testing.T) {
		s := newStream(t)
		a := read.NewAssembler(read.Filter{})
		x := s.txn(1, s.v1, time.Second)
		y := s.txn(2, s.v2, time.Second)
		fa := s.pmsg(messages.TypeFlushAll, ms(3))
		out := push(a, x.begin(ms(1)), y.begin(ms(2)), fa)
		require.Equal(t, []messages.MessageID{fa.ID()}, ids(out))
		require.Zero(t, a.Open(), "a PChannel-exclusive message ends every transaction")
		require.Empty(t, push(a, x.commit(ms(4), 0), y.commit(ms(5), 0)))
	})
	t.Run("a transaction begun after the exclusive message lives", func(t *testing.T) {
		s := newStream(t)
		a := read.NewAssembler(read.Filter{})
		x := s.txn(1, s.v1, time.Second)
		ex := s.msg(messages.TypeManualFlush, s.v1, ms(1), nil)
		xb := x.begin(ms(2))
		xc := x.commit(ms(3), xb.ID())
		out := push(a, ex, xb, xc)
		require.Len(t, out, 2)
		requireTxn(t, out[1], xb, nil, xc)
	})
}

func TestTxnStartedMidway(t *testing.T) {
	s := newStream(t)
	x := s.txn(1, s.v1, time.Second)
	xb := x.begin(ms(1))
	rest := []*messages.ImmutableMessage{x.body(messages.TypeInsert, ms(2)), x.body(messages.TypeInsert, ms(3)), x.commit(ms(4), xb.ID())}
	// A reader that starts after the BeginTxn sees nothing of it.
	a := read.NewAssembler(read.Filter{})
	require.Empty(t, push(a, rest...))
	require.Zero(t, a.Open())
	// Nor of a rollback without a begin.
	require.Nil(t, a.Push(s.txn(2, s.v1, time.Second).rollback(ms(5))))
}

func TestTxnControlOnWrongVChannel(t *testing.T) {
	// A body or commit naming a transaction of another VChannel does not
	// join it (the WAL refuses them; the reader does not trust the stream).
	s := newStream(t)
	a := read.NewAssembler(read.Filter{})
	x := s.txn(1, s.v1, time.Second)
	stray := s.txn(1, s.v2, time.Second)
	xb := x.begin(ms(1))
	x1 := x.body(messages.TypeInsert, ms(2))
	require.Empty(t, push(a, xb, x1, stray.body(messages.TypeInsert, ms(3))))
	xc := x.commit(ms(4), xb.ID())
	out := push(a, xc)
	require.Len(t, out, 1)
	requireTxn(t, out[0], xb, []*messages.ImmutableMessage{x1}, xc)
}

func TestFilterFrom(t *testing.T) {
	s := newStream(t)
	x := s.txn(1, s.v1, time.Second)
	y := s.txn(2, s.v1, time.Second)
	m1 := s.insert(s.v1, ms(1))
	xb := x.begin(ms(2))
	yb := y.begin(ms(3))
	x1 := x.body(messages.TypeInsert, ms(4))
	yc := y.commit(ms(5), xb.ID()) // commits before From
	m6 := s.insert(s.v2, ms(6))
	xc := x.commit(ms(7), xb.ID()) // begun before From, commits after
	m8 := s.insert(s.v1, ms(8))

	a := read.NewAssembler(read.Filter{From: ms(6)})
	out := push(a, m1, xb, yb, x1, yc, m6, xc, m8)
	require.Equal(t, []messages.MessageID{m6.ID(), xc.ID(), m8.ID()}, ids(out))
	requireTxn(t, out[1], xb, []*messages.ImmutableMessage{x1}, xc)

	// From is inclusive.
	s = newStream(t)
	in := []*messages.ImmutableMessage{s.insert(s.v1, ms(1)), s.insert(s.v1, ms(2)), s.insert(s.v1, ms(3))}
	require.Equal(t, ids(in[1:]), ids(push(read.NewAssembler(read.Filter{From: ms(2)}), in...)))
}

func TestFilterTypesTxn(t *testing.T) {
	build := func(t *testing.T) []*messages.ImmutableMessage {
		s := newStream(t)
		x := s.txn(1, s.v1, time.Second)
		xb := x.begin(ms(1))
		xi := x.body(messages.TypeInsert, ms(2))
		xu := x.body(messages.TypeUpsert, ms(3))
		del := s.msg(messages.TypeDelete, s.v1, ms(4), nil)
		xc := x.commit(ms(5), xb.ID())
		return []*messages.ImmutableMessage{xb, xi, xu, del, xc}
	}
	for _, c := range []struct {
		name  string
		types []*messages.Type
		want  []string // types delivered
	}{
		{"insert", []*messages.Type{messages.TypeInsert}, []string{"Txn"}},
		{"upsert", []*messages.Type{messages.TypeUpsert}, []string{"Txn"}},
		{"delete", []*messages.Type{messages.TypeDelete}, []string{"Delete"}},
		{"txn", []*messages.Type{messages.TypeTxn}, []string{"Txn"}},
		{"insert and delete", []*messages.Type{messages.TypeDelete, messages.TypeInsert}, []string{"Delete", "Txn"}},
		{"timetick", []*messages.Type{messages.TypeTimeTick}, nil},
		{"begin", []*messages.Type{messages.TypeBeginTxn, messages.TypeCommitTxn}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := build(t)
			var got []string
			for _, m := range push(read.NewAssembler(read.Filter{Types: c.types}), in...) {
				got = append(got, m.Type().Name)
			}
			require.Equal(t, c.want, got)
		})
	}
}

func TestWatermark(t *testing.T) {
	s := newStream(t)
	a := read.NewAssembler(read.Filter{Types: []*messages.Type{messages.TypeFlushAll}})
	require.Zero(t, a.Watermark())
	x := s.txn(1, s.v1, time.Second)
	for i, m := range []*messages.ImmutableMessage{
		s.insert(s.v1, ms(1)), x.begin(ms(2)), x.body(messages.TypeInsert, ms(3)),
		s.pmsg(messages.TypeTimeTick, ms(4)), x.rollback(ms(5)),
	} {
		a.Push(m)
		require.Equal(t, ms(int64(i+1)), a.Watermark(), "every message pushed counts, delivered or not")
	}
	// A TimeTick below the watermark (never in a real stream) does not
	// lower it.
	a.Push(s.insert(s.v2, ms(3)))
	require.Equal(t, ms(5), a.Watermark())
}

func TestPushTick(t *testing.T) {
	s := newStream(t)
	a := read.NewAssembler(read.Filter{})
	m1 := s.insert(s.v1, ms(10))
	m2 := s.pmsg(messages.TypeTimeTick, ms(20))
	a.Push(m1)
	require.Equal(t, ms(10), a.Watermark())

	// A tick covering a message not yet pushed waits for it.
	a.PushTick(messages.LiveTick{PChannel: s.p, TimeTick: ms(30), Covers: m2.ID(), Term: 1})
	require.Equal(t, ms(10), a.Watermark())
	a.Push(m2)
	require.Equal(t, ms(30), a.Watermark(), "the covered message arrived: the watermark jumps to the tick")

	// A tick covering what was pushed applies at once.
	a.PushTick(messages.LiveTick{PChannel: s.p, TimeTick: ms(40), Covers: m1.ID(), Term: 1})
	require.Equal(t, ms(40), a.Watermark())

	// Ticks at or below the watermark are ignored.
	a.PushTick(messages.LiveTick{PChannel: s.p, TimeTick: ms(40), Covers: m2.ID(), Term: 1})
	a.PushTick(messages.LiveTick{PChannel: s.p, TimeTick: ms(35), Covers: m2.ID(), Term: 1})
	require.Equal(t, ms(40), a.Watermark())

	// Several waiting ticks apply in turn as their messages arrive.
	m3 := s.insert(s.v1, ms(41))
	m4 := s.insert(s.v1, ms(42))
	m5 := s.pmsg(messages.TypeTimeTick, ms(43))
	a.PushTick(messages.LiveTick{PChannel: s.p, TimeTick: ms(60), Covers: m5.ID(), Term: 1})
	a.PushTick(messages.LiveTick{PChannel: s.p, TimeTick: ms(50), Covers: m4.ID(), Term: 1})
	require.Equal(t, ms(40), a.Watermark())
	a.Push(m3)
	require.Equal(t, ms(41), a.Watermark())
	a.Push(m4)
	require.Equal(t, ms(50), a.Watermark())
	a.Push(m5)
	require.Equal(t, ms(60), a.Watermark())
	// A message after the ticks does not lower the watermark.
	a.Push(s.insert(s.v1, ms(61)))
	require.Equal(t, ms(61), a.Watermark())
}

// delivered is what the model expects a reader to see of one message.
type delivered struct {
	ID     messages.MessageID
	Type   string
	Bodies []messages.MessageID
}

func describe(m *messages.ImmutableMessage) delivered {
	d := delivered{ID: m.ID(), Type: m.Type().Name}
	if m.Type() == messages.TypeTxn {
		d.Bodies = ids(m.TxnBody())
		if d.Bodies == nil {
			d.Bodies = []messages.MessageID{}
		}
	}
	return d
}

// modelTxn is a transaction as the model sees it.
type modelTxn struct {
	x        *txn
	begin    messages.MessageID
	bodies   []messages.MessageID
	deadline messages.TimeTick
}

// TestAssemblerModel checks the assembler against a model on random
// interleavings of transactions (begun, given bodies, committed, rolled
// back, or abandoned by the writer) on two VChannels, plain inserts and
// exclusive ManualFlushes, with strictly increasing TimeTicks and IDs. The
// writer side (the generator) keeps writing to transactions that the
// reader must consider expired or aborted, as a crashed or confused
// writer would; the model says what a reader must deliver: plain messages
// at their place, each committed transaction as one Txn at its commit
// with its bodies in order, and nothing of rolled-back, abandoned,
// expired or aborted ones.
func TestAssemblerModel(t *testing.T) {
	keepalives := []time.Duration{time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond}
	rapid.Check(t, func(rt *rapid.T) {
		s := newStream(rt)
		vs := []streamwal.VChannel{s.v1, s.v2}
		a := read.NewAssembler(read.Filter{})
		var (
			tt      messages.TimeTick
			nextTxn messages.TxnID
			writing []*txn                           // transactions the generator may still write to
			open    = map[messages.TxnID]*modelTxn{} // what the model considers open
			want    []delivered
			got     []delivered
		)
		step := func(m *messages.ImmutableMessage) {
			if d := a.Push(m); d != nil {
				got = append(got, describe(d))
			}
			require.Equal(rt, m.TimeTick(), a.Watermark())
			require.Equal(rt, len(open), a.Open(), "open transactions after %d", m.ID())
		}
		// advance draws the next TimeTick and expires what it passes.
		advance := func() messages.TimeTick {
			next := tt + messages.TimeTick(rapid.Uint64Range(1, 2<<messages.LogicalBits).Draw(rt, "dt"))
			if len(open) > 0 && rapid.IntRange(0, 3).Draw(rt, "edge") == 0 {
				// Land exactly on, or just past, an open transaction's
				// deadline.
				ids := slices.Sorted(maps.Keys(open))
				d := open[rapid.SampledFrom(ids).Draw(rt, "edge txn")].deadline + messages.TimeTick(rapid.IntRange(0, 1).Draw(rt, "past"))
				if d > tt {
					next = d
				}
			}
			tt = next
			for id, o := range open {
				if tt > o.deadline {
					delete(open, id)
				}
			}
			return tt
		}
		deadline := func(tt messages.TimeTick, x *txn) messages.TimeTick {
			return tt + messages.TimeTick(x.tc.Keepalive.Milliseconds())<<messages.LogicalBits
		}
		pick := func() (*txn, int) {
			i := rapid.IntRange(0, len(writing)-1).Draw(rt, "txn")
			return writing[i], i
		}
		for range rapid.IntRange(1, 120).Draw(rt, "steps") {
			op := rapid.IntRange(0, 6).Draw(rt, "op")
			if op >= 2 && op <= 5 && len(writing) == 0 {
				op = 1
			}
			switch op {
			case 0: // plain insert
				v := rapid.SampledFrom(vs).Draw(rt, "v")
				m := s.insert(v, advance())
				want = append(want, describe(m))
				step(m)
			case 1: // begin
				nextTxn++
				x := s.txn(nextTxn, rapid.SampledFrom(vs).Draw(rt, "v"), rapid.SampledFrom(keepalives).Draw(rt, "keepalive"))
				m := x.begin(advance())
				open[x.tc.ID] = &modelTxn{x: x, begin: m.ID(), deadline: deadline(m.TimeTick(), x)}
				writing = append(writing, x)
				step(m)
			case 2: // body
				x, _ := pick()
				typ := rapid.SampledFrom([]*messages.Type{messages.TypeInsert, messages.TypeDelete, messages.TypeUpsert}).Draw(rt, "body")
				m := x.body(typ, advance())
				if o := open[x.tc.ID]; o != nil {
					o.bodies = append(o.bodies, m.ID())
					o.deadline = deadline(m.TimeTick(), x)
				}
				step(m)
			case 3: // commit
				x, i := pick()
				writing = slices.Delete(writing, i, i+1)
				tt := advance()
				o := open[x.tc.ID]
				var lc messages.MessageID
				if o != nil {
					lc = o.begin
				}
				m := x.commit(tt, lc)
				if o != nil {
					want = append(want, delivered{ID: m.ID(), Type: "Txn", Bodies: append([]messages.MessageID{}, o.bodies...)})
					delete(open, x.tc.ID)
				}
				step(m)
			case 4: // rollback
				x, i := pick()
				writing = slices.Delete(writing, i, i+1)
				m := x.rollback(advance())
				delete(open, x.tc.ID)
				step(m)
			case 5: // abandon: the writer never touches it again
				_, i := pick()
				writing = slices.Delete(writing, i, i+1)
			case 6: // an exclusive message on one VChannel
				v := rapid.SampledFrom(vs).Draw(rt, "v")
				m := s.msg(messages.TypeManualFlush, v, advance(), nil)
				for id, o := range open {
					if o.x.v == v {
						delete(open, id)
					}
				}
				want = append(want, describe(m))
				step(m)
			}
		}
		require.Equal(rt, want, got)
	})
}
