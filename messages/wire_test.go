package messages_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/messages"
)

// natsLoop publishes encoded messages through a real (embedded) NATS server
// and returns them as a subscriber receives them, so that the header
// encoding of nats.go and the server is part of the round trip.
type natsLoop struct {
	t   *testing.T
	nc  *nats.Conn
	sub *nats.Subscription
}

func newNATSLoop(t *testing.T) *natsLoop {
	t.Helper()
	s := embedded.StartTest(t)
	nc, err := s.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync("wal.>")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	return &natsLoop{t: t, nc: nc, sub: sub}
}

func (l *natsLoop) send(m *nats.Msg) *nats.Msg {
	l.t.Helper()
	require.NoError(l.t, l.nc.PublishMsg(m))
	got, err := l.sub.NextMsg(5 * time.Second)
	require.NoError(l.t, err)
	return got
}

func TestWireRoundTripThroughNATS(t *testing.T) {
	loop := newNATSLoop(t)
	c := newCodec(t)
	bodies := realisticBodies(t)
	for _, typ := range messages.Builtins() {
		if typ.Is(messages.FlagSynthetic) {
			continue
		}
		t.Run(typ.Name, func(t *testing.T) {
			for i, e := range buildRealistic(t, c, typ, bodies[typ.Name]) {
				nm, err := c.Encode(e.msg)
				require.NoError(t, err)
				got := loop.send(nm)
				require.Equal(t, e.subject, got.Subject)
				im, err := c.Decode(got, messages.MessageID(i+1))
				require.NoError(t, err)
				requireSameMessage(t, e.msg, im)
			}
		})
	}
	t.Run("replica and properties", func(t *testing.T) {
		for _, nm := range []*nats.Msg{validInsert(t, c), validReplica(t, c), validBroadcastReplica(t, c), validTimeTick(t, c)} {
			want, err := c.Decode(nm, 1)
			require.NoError(t, err)
			im, err := c.Decode(loop.send(cloneMsg(nm)), 1)
			require.NoError(t, err)
			require.Equal(t, want.Header(), im.Header())
			require.Equal(t, want.Payload(), im.Payload())
		}
	})
}

// TestWireKeepsSurroundingWhitespace: the builders accept values with
// leading or trailing spaces (printable() allows them) but a NATS header
// value loses them on the wire (nats.go trims values on publish and the
// parser skips leading blanks), so property values, msg ids, trace state and
// resource keys change between the writer and the reader.
func TestWireKeepsSurroundingWhitespace(t *testing.T) {
	loop := newNATSLoop(t)
	c := newCodec(t)
	v := vch(t, 3, 1)

	t.Run("property value", func(t *testing.T) {
		m, err := c.New(messages.TypeInsert, v, []byte("x"), messages.WithProperty("k", " padded "))
		if err != nil {
			requireInvalid(t, err, messages.ErrMalformed)
			return
		}
		nm, err := c.Encode(m)
		require.NoError(t, err)
		im, err := c.Decode(loop.send(nm), 1)
		require.NoError(t, err)
		got, _ := im.Property("k")
		require.Equal(t, " padded ", got)
	})
	t.Run("msg id", func(t *testing.T) {
		m, err := c.New(messages.TypeInsert, v, []byte("x"), messages.WithMsgID("id "))
		if err != nil {
			requireInvalid(t, err, messages.ErrMalformed)
			return
		}
		nm, err := c.Encode(m)
		require.NoError(t, err)
		im, err := c.Decode(loop.send(nm), 1)
		require.NoError(t, err)
		require.Equal(t, "id ", im.MsgID(), "the dedup identity changed on the wire")
	})
	t.Run("trace state", func(t *testing.T) {
		m, err := c.New(messages.TypeInsert, v, []byte("x"), messages.WithTrace(testTraceParent, " a=b"))
		if err != nil {
			requireInvalid(t, err, messages.ErrMalformed)
			return
		}
		nm, err := c.Encode(m)
		require.NoError(t, err)
		im, err := c.Decode(loop.send(nm), 1)
		require.NoError(t, err)
		require.Equal(t, " a=b", im.Header().TraceState)
	})
	t.Run("resource key", func(t *testing.T) {
		b, err := c.NewBroadcast(messages.TypeCreateDatabase, messages.Targets{CChannel: cch(t)},
			messages.KeyScope{DBName: "db "}, []byte("x"))
		if err != nil {
			requireInvalid(t, err, nil)
			return
		}
		b.SetID(1)
		r := b.Split()[0]
		nm, err := c.Encode(r)
		require.NoError(t, err)
		im, err := c.Decode(loop.send(nm), 1)
		require.NoError(t, err)
		require.Equal(t, b.Keys(), im.Broadcast().Keys, "the reader sees other resource keys than the coordinator locked")
	})
}
