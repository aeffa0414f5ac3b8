package messages_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// Every bad input is an invalid-argument error with a specific cause, and
// never a panic.

func TestBuilderErrors(t *testing.T) {
	c := newCodec(t)
	small, err := messages.NewCodec(testCluster, nil, messages.WithMaxPayload(16))
	require.NoError(t, err)
	reg := messages.NewRegistry()
	foreign, err := reg.Register(messages.TypeSpec{Name: "Foreign", Dispatch: messages.DispatchVChannel})
	require.NoError(t, err)
	foreignBC, err := reg.Register(messages.TypeSpec{Name: "ForeignBC", Dispatch: messages.DispatchCChannel})
	require.NoError(t, err)
	copied := *messages.TypeInsert

	v := vch(t, 3, 1)
	v2 := vch(t, 5, 0)
	p := pch(t, 3)
	cc := cch(t)
	ccBody := mustBody(t, messages.TypeCreateCollection, messages.CreateCollectionBody{CollectionRef: collRef})
	txn := messages.WithTxn(messages.TxnContext{ID: 1, Keepalive: time.Second})

	cases := []struct {
		name  string
		cause error
		build func() error
	}{
		// Types.
		{"nil type New", messages.ErrUnknownType, func() error { _, err := c.New(nil, v, nil); return err }},
		{"nil type NewPChannel", messages.ErrUnknownType, func() error { _, err := c.NewPChannel(nil, p, nil); return err }},
		{"nil type NewBroadcast", messages.ErrUnknownType, func() error {
			_, err := c.NewBroadcast(nil, messages.Targets{CChannel: cc}, fullScope, nil)
			return err
		}},
		{"type of another registry", messages.ErrUnknownType, func() error { _, err := c.New(foreign, v, nil); return err }},
		{"broadcast type of another registry", messages.ErrUnknownType, func() error {
			_, err := c.NewBroadcast(foreignBC, messages.Targets{CChannel: cc}, fullScope, nil)
			return err
		}},
		{"copy of a built-in", messages.ErrUnknownType, func() error { _, err := c.New(&copied, v, nil); return err }},
		{"synthetic type", messages.ErrBadType, func() error { _, err := c.New(messages.TypeTxn, v, nil); return err }},
		{"synthetic type NewPChannel", messages.ErrBadType, func() error { _, err := c.NewPChannel(messages.TypeTxn, p, nil); return err }},
		{"synthetic type NewBroadcast", messages.ErrBadType, func() error {
			_, err := c.NewBroadcast(messages.TypeTxn, messages.Targets{VChannels: []streamwal.VChannel{v}}, fullScope, nil)
			return err
		}},

		// Targets of New / NewPChannel.
		{"vchannel type to zero vchannel", messages.ErrBadTarget, func() error {
			_, err := c.New(messages.TypeInsert, streamwal.VChannel{}, nil)
			return err
		}},
		{"vchannel type to the cchannel", messages.ErrBadTarget, func() error { _, err := c.New(messages.TypeInsert, cc, nil); return err }},
		{"txn control to the cchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewBody(messages.TypeBeginTxn, cc, messages.BeginTxnBody{}, txn)
			return err
		}},
		{"vchannels-only type to the cchannel", messages.ErrBadTarget, func() error { _, err := c.New(messages.TypeImport, cc, nil); return err }},
		{"pchannel type via New", messages.ErrBadTarget, func() error {
			_, err := c.New(messages.TypeTimeTick, v, []byte("{}"))
			return err
		}},
		{"cluster barrier via New", messages.ErrBadTarget, func() error {
			_, err := c.NewBody(messages.TypeFlushAll, v, messages.FlushAllBody{})
			return err
		}},
		{"cchannel type to a data vchannel", messages.ErrBadTarget, func() error {
			_, err := c.New(messages.TypeCreateDatabase, v, nil)
			return err
		}},
		{"vchannel type via NewPChannel", messages.ErrBadTarget, func() error { _, err := c.NewPChannel(messages.TypeInsert, p, nil); return err }},
		{"cchannel type via NewPChannel", messages.ErrBadTarget, func() error {
			_, err := c.NewPChannel(messages.TypeCreateDatabase, p, nil)
			return err
		}},
		{"pchannel type to zero pchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewPChannelBody(messages.TypeTimeTick, streamwal.PChannel{}, messages.TimeTickBody{})
			return err
		}},

		// Broadcast targets.
		{"non-broadcast type", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeInsert, messages.Targets{VChannels: []streamwal.VChannel{v}}, fullScope, nil)
			return err
		}},
		{"pchannel type broadcast", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeTimeTick, messages.Targets{PChannels: []streamwal.PChannel{p}}, fullScope, []byte("{}"))
			return err
		}},
		{"ddl missing cchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{v}}, fullScope, ccBody)
			return err
		}},
		{"ddl missing vchannels", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{CChannel: cc}, fullScope, ccBody)
			return err
		}},
		{"ddl cchannel is a data vchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{v}, CChannel: v2}, fullScope, ccBody)
			return err
		}},
		{"ddl cchannel among vchannels", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{v, cc}, CChannel: cc}, fullScope, ccBody)
			return err
		}},
		{"ddl duplicate vchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{v, v2, v}, CChannel: cc}, fullScope, ccBody)
			return err
		}},
		{"ddl zero vchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{v, {}}, CChannel: cc}, fullScope, ccBody)
			return err
		}},
		{"ddl with pchannels", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{v}, CChannel: cc, PChannels: []streamwal.PChannel{p}}, fullScope, ccBody)
			return err
		}},
		{"cchannel-only type with vchannels", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateIndex, messages.Targets{VChannels: []streamwal.VChannel{v}, CChannel: cc}, fullScope, nil)
			return err
		}},
		{"cchannel-only type without cchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateIndex, messages.Targets{}, fullScope, nil)
			return err
		}},
		{"cchannel-only type to data vchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeAlterUser, messages.Targets{CChannel: v}, fullScope, nil)
			return err
		}},
		{"import with cchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeImport, messages.Targets{VChannels: []streamwal.VChannel{v}, CChannel: cc}, fullScope, nil)
			return err
		}},
		{"import without vchannels", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeImport, messages.Targets{}, fullScope, nil)
			return err
		}},
		{"import duplicate", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeImport, messages.Targets{VChannels: []streamwal.VChannel{v, v}}, fullScope, nil)
			return err
		}},
		{"pchannels on a vchannel type", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeImport, messages.Targets{VChannels: []streamwal.VChannel{v}, PChannels: []streamwal.PChannel{p}}, fullScope, nil)
			return err
		}},
		{"barrier without pchannels", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeAlterWAL, messages.Targets{}, fullScope, mustBody(t, messages.TypeAlterWAL, messages.AlterWALBody{}))
			return err
		}},
		{"barrier with vchannels", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeAlterWAL, messages.Targets{VChannels: []streamwal.VChannel{v}, PChannels: []streamwal.PChannel{p}}, fullScope, mustBody(t, messages.TypeAlterWAL, messages.AlterWALBody{}))
			return err
		}},
		{"barrier with cchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeAlterWAL, messages.Targets{CChannel: cc, PChannels: []streamwal.PChannel{p}}, fullScope, mustBody(t, messages.TypeAlterWAL, messages.AlterWALBody{}))
			return err
		}},
		{"barrier duplicate pchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeAlterWAL, messages.Targets{PChannels: []streamwal.PChannel{p, pch(t, 1), p}}, fullScope, mustBody(t, messages.TypeAlterWAL, messages.AlterWALBody{}))
			return err
		}},
		{"barrier zero pchannel", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeAlterWAL, messages.Targets{PChannels: []streamwal.PChannel{p, {}}}, fullScope, mustBody(t, messages.TypeAlterWAL, messages.AlterWALBody{}))
			return err
		}},
		{"broadcast missing scope", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{v}, CChannel: cc}, messages.KeyScope{DBName: "db"}, ccBody)
			return err
		}},
		{"broadcast in a transaction", messages.ErrBadTarget, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{v}, CChannel: cc}, fullScope, ccBody, txn)
			return err
		}},

		// Payload limits.
		{"payload over default limit", messages.ErrPayloadTooLarge, func() error {
			_, err := c.New(messages.TypeInsert, v, make([]byte, messages.DefaultMaxPayload+1))
			return err
		}},
		{"payload over custom limit", messages.ErrPayloadTooLarge, func() error {
			_, err := small.New(messages.TypeInsert, v, make([]byte, 17))
			return err
		}},
		{"body over custom limit", messages.ErrPayloadTooLarge, func() error {
			_, err := small.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{CollectionRef: collRef})
			return err
		}},
		{"broadcast over custom limit", messages.ErrPayloadTooLarge, func() error {
			_, err := small.NewBroadcast(messages.TypeCreateDatabase, messages.Targets{CChannel: cc}, fullScope, make([]byte, 17))
			return err
		}},
		{"pchannel message over custom limit", messages.ErrPayloadTooLarge, func() error {
			_, err := small.NewPChannelBody(messages.TypeRecoveryBarrier, p, messages.RecoveryBarrierBody{Term: 1, Node: strings.Repeat("n", 20)})
			return err
		}},

		// Bodies.
		{"body type mismatch", messages.ErrBadBody, func() error {
			_, err := c.NewBody(messages.TypeCreateCollection, v, messages.DropCollectionBody{CollectionRef: collRef})
			return err
		}},
		{"body pointer instead of value", messages.ErrBadBody, func() error {
			_, err := c.NewBody(messages.TypeCreateCollection, v, &messages.CreateCollectionBody{})
			return err
		}},
		{"body for opaque type", messages.ErrBadBody, func() error {
			_, err := c.NewBody(messages.TypeInsert, v, messages.CreateCollectionBody{})
			return err
		}},
		{"nil body", messages.ErrBadBody, func() error {
			_, err := c.NewBody(messages.TypeCreateCollection, v, nil)
			return err
		}},
		{"pchannel body mismatch", messages.ErrBadBody, func() error {
			_, err := c.NewPChannelBody(messages.TypeRecoveryBarrier, p, messages.TimeTickBody{})
			return err
		}},
		{"malformed JSON body", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeCreateCollection, v, []byte(`{"db_name":`))
			return err
		}},
		{"wrongly typed JSON body", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeCreateCollection, v, []byte(`{"collection_id":"forty-two"}`))
			return err
		}},
		{"JSON body with trailing garbage", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeManualFlush, v, []byte(`{"collection_id":42} x`))
			return err
		}},
		{"empty body", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeManualFlush, v, nil)
			return err
		}},
		{"blank body", messages.ErrMalformed, func() error {
			_, err := c.NewPChannel(messages.TypeTimeTick, p, []byte(" \n"))
			return err
		}},
		{"malformed broadcast body", messages.ErrMalformed, func() error {
			_, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{v}, CChannel: cc}, fullScope, []byte("not json"))
			return err
		}},

		// Options.
		{"empty property key", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithProperty("", "v"))
			return err
		}},
		{"property key with dot", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithProperty("a.b", "v"))
			return err
		}},
		{"property key with colon", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithProperty("a:b", "v"))
			return err
		}},
		{"property key with space", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithProperty("a b", "v"))
			return err
		}},
		{"property key non-ASCII", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithProperty("clé", "v"))
			return err
		}},
		{"property key too long", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithProperty(strings.Repeat("k", messages.MaxPropKeyLen+1), "v"))
			return err
		}},
		{"property value with newline", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithProperty("k", "a\r\nInjected: 1"))
			return err
		}},
		{"property value with NUL", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithProperty("k", "a\x00"))
			return err
		}},
		{"property value with DEL", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithProperty("k", "\x7f"))
			return err
		}},
		{"property value too long", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithProperty("k", strings.Repeat("v", messages.MaxPropValueLen+1)))
			return err
		}},
		{"empty msg id", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithMsgID(""))
			return err
		}},
		{"msg id too long", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithMsgID(strings.Repeat("i", messages.MaxMsgIDLen+1)))
			return err
		}},
		{"msg id with newline", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithMsgID("a\nb"))
			return err
		}},
		{"trace with control character", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithTrace("00-\x01", ""))
			return err
		}},
		{"trace too long", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithTrace(strings.Repeat("0", 257), ""))
			return err
		}},
		{"trace state too long", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithTrace(testTraceParent, strings.Repeat("s", 513)))
			return err
		}},
		{"txn id zero", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithTxn(messages.TxnContext{Keepalive: time.Second}))
			return err
		}},
		{"txn keepalive below 1ms", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithTxn(messages.TxnContext{ID: 1, Keepalive: time.Millisecond - 1}))
			return err
		}},
		{"txn keepalive negative", messages.ErrMalformed, func() error {
			_, err := c.New(messages.TypeInsert, v, nil, messages.WithTxn(messages.TxnContext{ID: 1, Keepalive: -time.Second}))
			return err
		}},
		{"txn option on DDL", messages.ErrBadTarget, func() error {
			_, err := c.NewBody(messages.TypeManualFlush, v, messages.ManualFlushBody{CollectionID: 42}, txn)
			return err
		}},
		{"txn option on self-controlled", messages.ErrBadTarget, func() error {
			_, err := c.NewBody(messages.TypeCreateSegment, v, messages.CreateSegmentBody{}, txn)
			return err
		}},
		{"txn option on pchannel message", messages.ErrBadTarget, func() error {
			_, err := c.NewPChannelBody(messages.TypeTimeTick, p, messages.TimeTickBody{}, txn)
			return err
		}},
		{"txn option on opaque app-like type", messages.ErrBadTarget, func() error {
			_, err := c.New(messages.TypeImport, v, nil, txn)
			return err
		}},
		{"SetMsgID bad", messages.ErrMalformed, func() error {
			m, err := c.New(messages.TypeInsert, v, nil)
			require.NoError(t, err)
			err = m.SetMsgID("bad\x00")
			require.Empty(t, m.MsgID(), "a refused SetMsgID changes nothing")
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = tc.build() })
			requireInvalid(t, err, tc.cause)
		})
	}
}

func TestOptionOrderDoesNotLeak(t *testing.T) {
	// A failing option stops the build; nothing is returned.
	c := newCodec(t)
	m, err := c.New(messages.TypeInsert, vch(t, 3, 1), nil, messages.WithProperty("ok", "1"), messages.WithProperty("", "x"))
	require.Nil(t, m)
	requireInvalid(t, err, messages.ErrMalformed)
}

func TestEncodeErrors(t *testing.T) {
	c := newCodec(t)
	var err error
	require.NotPanics(t, func() { _, err = c.Encode(&messages.MutableMessage{}) })
	requireInvalid(t, err, messages.ErrUnknownType)
}

// --- Decode of malformed NATS messages ---

// validInsert is a fully-populated insert, encoded.
func validInsert(t testing.TB, c *messages.Codec) *nats.Msg {
	t.Helper()
	m, err := c.New(messages.TypeInsert, vch(t, 3, 1), []byte("rows"), messages.WithProperty("k", "v"),
		messages.WithDML(100, 3), messages.WithTrace(testTraceParent, testTraceState), messages.WithMsgID("m1"),
		messages.WithTxn(messages.TxnContext{ID: 9, Keepalive: time.Second}))
	require.NoError(t, err)
	m.SetSegment(1000)
	m.SetTimeTick(mustTick(t, 1_764_000_000_000, 1))
	m.SetLastConfirmed(5)
	m.SetTerm(2)
	nm, err := c.Encode(m)
	require.NoError(t, err)
	return nm
}

func validBroadcastReplica(t testing.TB, c *messages.Codec) *nats.Msg {
	t.Helper()
	b, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{vch(t, 3, 1)}, CChannel: cch(t)},
		fullScope, mustBody(t, messages.TypeCreateCollection, messages.CreateCollectionBody{CollectionRef: collRef}))
	require.NoError(t, err)
	b.SetID(5)
	r := b.Split()[0]
	r.SetTimeTick(9)
	nm, err := c.Encode(r)
	require.NoError(t, err)
	return nm
}

func validReplica(t testing.TB, c *messages.Codec) *nats.Msg {
	t.Helper()
	src, err := messages.NewCodec("c0", nil)
	require.NoError(t, err)
	m, err := src.New(messages.TypeInsert, vch(t, 3, 1), []byte("x"))
	require.NoError(t, err)
	m.SetTimeTick(50)
	m.SetLastConfirmed(40)
	r, err := c.NewReplicate(m.Freeze(41), "c0", pch(t, 3))
	require.NoError(t, err)
	r.SetTimeTick(60)
	nm, err := c.Encode(r)
	require.NoError(t, err)
	return nm
}

func validTimeTick(t testing.TB, c *messages.Codec) *nats.Msg {
	t.Helper()
	m, err := c.NewPChannelBody(messages.TypeTimeTick, pch(t, 3), messages.TimeTickBody{})
	require.NoError(t, err)
	m.SetTimeTick(70)
	m.SetLastConfirmed(7)
	nm, err := c.Encode(m)
	require.NoError(t, err)
	return nm
}

func TestDecodeValidFixtures(t *testing.T) {
	c := newCodec(t)
	for _, nm := range []*nats.Msg{validInsert(t, c), validBroadcastReplica(t, c), validReplica(t, c), validTimeTick(t, c)} {
		_, err := c.Decode(nm, 1)
		require.NoError(t, err)
	}
}

func TestDecodeErrors(t *testing.T) {
	c := newCodec(t)
	set := func(k, v string) func(*nats.Msg) { return func(m *nats.Msg) { m.Header.Set(k, v) } }
	del := func(k string) func(*nats.Msg) { return func(m *nats.Msg) { m.Header.Del(k) } }
	add := func(k, v string) func(*nats.Msg) { return func(m *nats.Msg) { m.Header.Add(k, v) } }
	subj := func(s string) func(*nats.Msg) { return func(m *nats.Msg) { m.Subject = s } }
	data := func(d string) func(*nats.Msg) { return func(m *nats.Msg) { m.Data = []byte(d) } }

	type tc struct {
		name   string
		base   func(testing.TB, *messages.Codec) *nats.Msg
		mutate func(*nats.Msg)
		cause  error
	}
	ins := validInsert
	cases := []tc{
		// TimeTick.
		{"timetick not decimal", ins, set(messages.HdrTimeTick, "abc"), messages.ErrMalformed},
		{"timetick leading zero", ins, set(messages.HdrTimeTick, "0123"), messages.ErrMalformed},
		{"timetick zero", ins, set(messages.HdrTimeTick, "0"), messages.ErrMalformed},
		{"timetick negative", ins, set(messages.HdrTimeTick, "-1"), messages.ErrMalformed},
		{"timetick plus", ins, set(messages.HdrTimeTick, "+1"), messages.ErrMalformed},
		{"timetick space", ins, set(messages.HdrTimeTick, " 1"), messages.ErrMalformed},
		{"timetick overflow", ins, set(messages.HdrTimeTick, "18446744073709551616"), messages.ErrMalformed},
		{"timetick hex", ins, set(messages.HdrTimeTick, "0x10"), messages.ErrMalformed},
		{"timetick repeated", ins, add(messages.HdrTimeTick, "5"), messages.ErrMalformed},
		{"last confirmed bad", ins, set(messages.HdrLastConfirmed, "1.0"), messages.ErrMalformed},
		{"last confirmed repeated", ins, add(messages.HdrLastConfirmed, "5"), messages.ErrMalformed},
		{"term negative", ins, set(messages.HdrTerm, "-2"), messages.ErrMalformed},
		{"term leading zero", ins, set(messages.HdrTerm, "02"), messages.ErrMalformed},

		// Type and version.
		{"unknown type", ins, set(messages.HdrType, "Nope"), messages.ErrUnknownType},
		{"type by token", ins, set(messages.HdrType, "insert"), messages.ErrUnknownType},
		{"missing type", ins, del(messages.HdrType), messages.ErrUnknownType},
		{"repeated type", ins, add(messages.HdrType, "Insert"), messages.ErrMalformed},
		{"type with control char", ins, set(messages.HdrType, "Insert\x00"), messages.ErrMalformed},
		{"version 2", ins, set(messages.HdrVersion, "2"), messages.ErrMalformed},
		{"version 0", ins, set(messages.HdrVersion, "0"), messages.ErrMalformed},
		{"version 01", ins, set(messages.HdrVersion, "01"), messages.ErrMalformed},
		{"version missing", ins, del(messages.HdrVersion), messages.ErrMalformed},
		{"version repeated", ins, add(messages.HdrVersion, "1"), messages.ErrMalformed},

		// Channels and subject.
		{"pchannel missing", ins, del(messages.HdrPChannel), messages.ErrMalformed},
		{"pchannel bad", ins, set(messages.HdrPChannel, "pchan-03"), messages.ErrMalformed},
		{"pchannel differs from subject", ins, func(m *nats.Msg) {
			m.Header.Set(messages.HdrPChannel, "pchan-5")
			m.Header.Set(messages.HdrVChannel, "pchan-5_42v1")
		}, messages.ErrMalformed},
		{"vchannel not on header pchannel", ins, set(messages.HdrVChannel, "pchan-5_42v1"), messages.ErrMalformed},
		{"vchannel malformed", ins, set(messages.HdrVChannel, "pchan-3_42x1"), messages.ErrMalformed},
		{"vchannel missing", ins, del(messages.HdrVChannel), messages.ErrMalformed},
		{"vchannel repeated", ins, add(messages.HdrVChannel, "pchan-3_42v1"), messages.ErrMalformed},
		{"subject vchannel differs", ins, subj(testCluster.VChannelSubject(vch(t, 3, 2), "insert")), messages.ErrMalformed},
		{"subject type differs", ins, subj(testCluster.VChannelSubject(vch(t, 3, 1), "delete")), messages.ErrMalformed},
		{"subject pchannel-level for vchannel message", ins, subj(testCluster.PChannelSubject(pch(t, 3), "insert")), messages.ErrMalformed},
		{"subject of another cluster", ins, subj(streamwal.Cluster("c2").VChannelSubject(vch(t, 3, 1), "insert")), messages.ErrMalformed},
		{"subject garbage", ins, subj("wal.c1"), messages.ErrMalformed},
		{"subject empty", ins, subj(""), messages.ErrMalformed},
		{"subject wildcard", ins, subj("wal.c1.pchan-3.v.*.insert"), messages.ErrMalformed},
		{"subject api root", ins, subj("walapi.c1.append.pchan-3"), messages.ErrMalformed},
		{"vchannel type on pchannel subject", ins, func(m *nats.Msg) {
			m.Subject = testCluster.PChannelSubject(pch(t, 3), "insert")
			m.Header.Del(messages.HdrVChannel)
		}, messages.ErrBadTarget},
		{"pchannel type on vchannel subject", validTimeTick, func(m *nats.Msg) {
			m.Subject = testCluster.VChannelSubject(vch(t, 3, 1), "timetick")
			m.Header.Set(messages.HdrVChannel, "pchan-3_42v1")
		}, messages.ErrBadTarget},

		// Broadcast.
		{"broadcast key malformed", validBroadcastReplica, add(messages.HdrBroadcastKey, "Q:Cluster:"), messages.ErrMalformed},
		{"broadcast key unknown domain", validBroadcastReplica, add(messages.HdrBroadcastKey, "S:Table:t"), messages.ErrMalformed},
		{"broadcast key cluster with key", validBroadcastReplica, add(messages.HdrBroadcastKey, "X:Cluster:x"), messages.ErrMalformed},
		{"broadcast key db without key", validBroadcastReplica, add(messages.HdrBroadcastKey, "S:DBName:"), messages.ErrMalformed},
		{"broadcast key control char", validBroadcastReplica, add(messages.HdrBroadcastKey, "S:DBName:a\x01"), messages.ErrMalformed},
		{"broadcast id zero", validBroadcastReplica, set(messages.HdrBroadcastID, "0"), messages.ErrMalformed},
		{"broadcast id not decimal", validBroadcastReplica, set(messages.HdrBroadcastID, "five"), messages.ErrMalformed},
		{"broadcast id repeated", validBroadcastReplica, add(messages.HdrBroadcastID, "6"), messages.ErrMalformed},
		{"broadcast id missing", validBroadcastReplica, del(messages.HdrBroadcastID), messages.ErrMalformed},
		{"broadcast targets empty", validBroadcastReplica, set(messages.HdrBroadcastTargets, ""), messages.ErrMalformed},
		{"broadcast targets missing", validBroadcastReplica, del(messages.HdrBroadcastTargets), messages.ErrMalformed},
		{"broadcast targets bad entry", validBroadcastReplica, set(messages.HdrBroadcastTargets, "pchan-3_42v1,,pchan-0_vcchan"), messages.ErrMalformed},
		{"broadcast targets spaces", validBroadcastReplica, set(messages.HdrBroadcastTargets, "pchan-3_42v1, pchan-0_vcchan"), messages.ErrMalformed},
		{"broadcast keys without id", ins, add(messages.HdrBroadcastKey, "S:Cluster:"), messages.ErrMalformed},
		{"broadcast targets without id", ins, set(messages.HdrBroadcastTargets, "pchan-3_42v1"), messages.ErrMalformed},

		// Transactions.
		{"keepalive not a duration", ins, set(messages.HdrTxnKeepalive, "soon"), messages.ErrMalformed},
		{"keepalive zero", ins, set(messages.HdrTxnKeepalive, "0s"), messages.ErrMalformed},
		{"keepalive below 1ms", ins, set(messages.HdrTxnKeepalive, "999us"), messages.ErrMalformed},
		{"keepalive negative", ins, set(messages.HdrTxnKeepalive, "-1s"), messages.ErrMalformed},
		{"keepalive missing", ins, del(messages.HdrTxnKeepalive), messages.ErrMalformed},
		{"keepalive repeated", ins, add(messages.HdrTxnKeepalive, "1s"), messages.ErrMalformed},
		{"txn id missing", ins, del(messages.HdrTxnID), messages.ErrMalformed},
		{"txn id zero", ins, set(messages.HdrTxnID, "0"), messages.ErrMalformed},
		{"txn id negative", ins, set(messages.HdrTxnID, "-9"), messages.ErrMalformed},

		// DML.
		{"rows negative", ins, set(messages.HdrRows, "-1"), messages.ErrMalformed},
		{"rows missing", ins, del(messages.HdrRows), messages.ErrMalformed},
		{"partition not a number", ins, set(messages.HdrPartition, "p1"), messages.ErrMalformed},
		{"partition plus sign", ins, set(messages.HdrPartition, "+100"), messages.ErrMalformed},
		{"partition missing", ins, del(messages.HdrPartition), messages.ErrMalformed},
		{"segment leading zero", ins, set(messages.HdrSegment, "01000"), messages.ErrMalformed},
		{"segment negative zero", ins, set(messages.HdrSegment, "-0"), messages.ErrMalformed},

		// Replication.
		{"replicate cluster bad", validReplica, set(messages.HdrReplicateCluster, "c 0"), messages.ErrMalformed},
		{"replicate id bad", validReplica, set(messages.HdrReplicateID, "0x29"), messages.ErrMalformed},
		{"replicate id zero", validReplica, set(messages.HdrReplicateID, "0"), messages.ErrMalformed},
		{"replicate timetick bad", validReplica, set(messages.HdrReplicateTimeTick, "50 "), messages.ErrMalformed},
		{"replicate repeated", validReplica, add(messages.HdrReplicateCluster, "c9"), messages.ErrMalformed},

		// Flags, identity, trace, properties.
		{"unreplicable not true", ins, set(messages.HdrUnreplicable, "yes"), messages.ErrMalformed},
		{"unreplicable upper case", ins, set(messages.HdrUnreplicable, "TRUE"), messages.ErrMalformed},
		{"unreplicable repeated", ins, func(m *nats.Msg) {
			m.Header.Add(messages.HdrUnreplicable, "true")
			m.Header.Add(messages.HdrUnreplicable, "true")
		}, messages.ErrMalformed},
		{"msg id too long", ins, set(messages.HdrMsgID, strings.Repeat("i", messages.MaxMsgIDLen+1)), messages.ErrMalformed},
		{"msg id control char", ins, set(messages.HdrMsgID, "a\x7f"), messages.ErrMalformed},
		{"msg id repeated", ins, add(messages.HdrMsgID, "m2"), messages.ErrMalformed},
		{"traceparent newline", ins, set(messages.HdrTraceParent, "00-abc\n"), messages.ErrMalformed},
		{"tracestate control char", ins, set(messages.HdrTraceState, "a=\x1b[31m"), messages.ErrMalformed},
		{"property value control char", ins, set("Wal-App-k", "v\x00"), messages.ErrMalformed},
		{"property value tab", ins, set("Wal-App-k", "a\tb"), messages.ErrMalformed},
		{"property value too long", ins, set("Wal-App-k", strings.Repeat("v", messages.MaxPropValueLen+1)), messages.ErrMalformed},
		{"property key empty", ins, set("Wal-App-", "v"), messages.ErrMalformed},
		{"property key bad char", ins, set("Wal-App-a.b", "v"), messages.ErrMalformed},
		{"property key too long", ins, set("Wal-App-"+strings.Repeat("k", messages.MaxPropKeyLen+1), "v"), messages.ErrMalformed},
		{"property repeated", ins, add("Wal-App-k", "w"), messages.ErrMalformed},
		{"too many properties", ins, func(m *nats.Msg) {
			for i := 0; i <= messages.MaxProps; i++ {
				m.Header.Set("Wal-App-p"+strings.Repeat("x", i%5)+string(rune('a'+i%26))+string(rune('a'+i/26)), "v")
			}
		}, messages.ErrMalformed},

		// Bodies.
		{"body malformed", validBroadcastReplica, data("{"), messages.ErrMalformed},
		{"body empty", validBroadcastReplica, data(""), messages.ErrMalformed},
		{"body wrong shape", validBroadcastReplica, data(`{"vchannels":"x"}`), messages.ErrMalformed},
		{"timetick body not JSON", validTimeTick, data("tick"), messages.ErrMalformed},

		// Nothing at all.
		{"no headers", ins, func(m *nats.Msg) { m.Header = nil }, messages.ErrMalformed},
		{"empty headers", ins, func(m *nats.Msg) { m.Header = nats.Header{} }, messages.ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nm := cloneMsg(tc.base(t, c))
			tc.mutate(nm)
			require.NotPanics(t, func() {
				im, err := c.Decode(nm, 7)
				require.Nil(t, im)
				requireInvalid(t, err, tc.cause)
				mm, err := c.DecodeMutable(nm)
				require.Nil(t, mm)
				requireInvalid(t, err, tc.cause)
			})
		})
	}
}

func TestDecodeNilAndZeroID(t *testing.T) {
	c := newCodec(t)
	require.NotPanics(t, func() {
		_, err := c.Decode(nil, 1)
		requireInvalid(t, err, messages.ErrMalformed)
		_, err = c.DecodeMutable(nil)
		requireInvalid(t, err, messages.ErrMalformed)
		_, err = c.Decode(&nats.Msg{}, 1)
		requireInvalid(t, err, messages.ErrMalformed)
	})
	_, err := c.Decode(validInsert(t, c), 0)
	requireInvalid(t, err, nil)
}

func TestDecodeIgnoresForeignHeaders(t *testing.T) {
	// Headers outside the Wal- namespace (JetStream's own, for example) do
	// not disturb decoding.
	c := newCodec(t)
	nm := cloneMsg(validInsert(t, c))
	nm.Header.Set("Nats-Expected-Last-Sequence", "41")
	nm.Header.Set("X-Other", "x")
	im, err := c.Decode(nm, 42)
	require.NoError(t, err)
	require.Equal(t, "v", im.Header().Props["k"])
}

// TestNilTypeWithBodyBuilders: NewBody, NewPChannelBody and MarshalBody
// must refuse a nil type like New does, not panic.
func TestNilTypeWithBodyBuilders(t *testing.T) {
	c := newCodec(t)
	v := vch(t, 3, 1)
	p := pch(t, 3)
	for name, f := range map[string]func() error{
		"NewBody":         func() error { _, err := c.NewBody(nil, v, messages.ManualFlushBody{}); return err },
		"NewPChannelBody": func() error { _, err := c.NewPChannelBody(nil, p, messages.TimeTickBody{}); return err },
		"MarshalBody":     func() error { _, err := messages.MarshalBody(nil, messages.TimeTickBody{}); return err },
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = f() })
			requireInvalid(t, err, nil)
			require.True(t, isAny(err, messages.ErrUnknownType, messages.ErrBadBody), "%v", err)
		})
	}
}

// TestEncodeNil: Decode(nil) is an error, so Encode(nil) should be one too.
func TestEncodeNil(t *testing.T) {
	c := newCodec(t)
	var err error
	require.NotPanics(t, func() { _, err = c.Encode(nil) })
	requireInvalid(t, err, nil)
}

// TestDecodeRefusesWhatBuildersRefuse: every message Decode accepts should
// be one the builders can produce. Each subtest takes a valid encoded
// message and changes it into one no builder would make.
func TestDecodeRefusesWhatBuildersRefuse(t *testing.T) {
	c := newCodec(t)
	cases := []struct {
		name   string
		msg    func(t *testing.T) *nats.Msg
		causes []error
	}{
		{"synthetic Txn type on the wire", func(t *testing.T) *nats.Msg {
			nm := cloneMsg(validInsert(t, c))
			nm.Subject = testCluster.VChannelSubject(vch(t, 3, 1), "txn")
			nm.Header.Set(messages.HdrType, "Txn")
			return nm
		}, []error{messages.ErrBadType, messages.ErrUnknownType, messages.ErrMalformed}},
		{"DML on the CChannel", func(t *testing.T) *nats.Msg {
			m, err := c.New(messages.TypeInsert, vch(t, 0, 0), []byte("x"))
			require.NoError(t, err)
			nm, err := c.Encode(m)
			require.NoError(t, err)
			nm.Subject = testCluster.VChannelSubject(cch(t), "insert")
			nm.Header.Set(messages.HdrVChannel, cch(t).String())
			return nm
		}, []error{messages.ErrBadTarget}},
		{"CChannel-only type on a data VChannel", func(t *testing.T) *nats.Msg {
			m, err := c.New(messages.TypeCreateDatabase, cch(t), []byte("db"))
			require.NoError(t, err)
			nm, err := c.Encode(m)
			require.NoError(t, err)
			v := vch(t, 0, 0)
			nm.Subject = testCluster.VChannelSubject(v, "createdatabase")
			nm.Header.Set(messages.HdrVChannel, v.String())
			return nm
		}, []error{messages.ErrBadTarget}},
		{"txn context on a DDL type", func(t *testing.T) *nats.Msg {
			nm := cloneMsg(validBroadcastReplica(t, c))
			nm.Header.Set(messages.HdrTxnID, "3")
			nm.Header.Set(messages.HdrTxnKeepalive, "1s")
			return nm
		}, []error{messages.ErrBadTarget, messages.ErrMalformed}},
		{"txn context on a TimeTick", func(t *testing.T) *nats.Msg {
			nm := cloneMsg(validTimeTick(t, c))
			nm.Header.Set(messages.HdrTxnID, "3")
			nm.Header.Set(messages.HdrTxnKeepalive, "1s")
			return nm
		}, []error{messages.ErrBadTarget, messages.ErrMalformed}},
		{"broadcast header on a non-broadcast type", func(t *testing.T) *nats.Msg {
			nm := cloneMsg(validInsert(t, c))
			nm.Header.Set(messages.HdrBroadcastID, "5")
			nm.Header.Set(messages.HdrBroadcastTargets, "pchan-3_42v1")
			nm.Header.Set(messages.HdrBroadcastKey, "S:Cluster:")
			return nm
		}, []error{messages.ErrBadTarget, messages.ErrMalformed}},
		{"broadcast replica not among its own targets", func(t *testing.T) *nats.Msg {
			nm := cloneMsg(validBroadcastReplica(t, c))
			nm.Header.Set(messages.HdrBroadcastTargets, "pchan-5_42v0,pchan-0_vcchan")
			return nm
		}, []error{messages.ErrBadTarget, messages.ErrMalformed}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nm := tc.msg(t)
			var err error
			require.NotPanics(t, func() { _, err = c.DecodeMutable(nm) })
			requireInvalid(t, err, nil)
			require.True(t, isAny(err, tc.causes...), "cause of %v", err)
		})
	}
}

// TestNotTracedTypesCarryNoTrace: FlagNotTraced means "carries no trace
// context" (catalog.go); TimeTick messages are never traced (DESIGN §8). A
// trace option on such a type must be refused or dropped.
func TestNotTracedTypesCarryNoTrace(t *testing.T) {
	c := newCodec(t)
	m, err := c.NewPChannelBody(messages.TypeTimeTick, pch(t, 3), messages.TimeTickBody{},
		messages.WithTrace(testTraceParent, testTraceState))
	if err != nil {
		requireInvalid(t, err, nil)
		return
	}
	require.Empty(t, m.Header().TraceParent, "a TimeTick carries a trace context")
	require.Empty(t, m.Header().TraceState)
}

// TestEncodeOutputAlwaysDecodes: whatever the setters of MutableMessage
// accept, Encode must produce a message Decode accepts (or refuse to encode
// it).
func TestEncodeOutputAlwaysDecodes(t *testing.T) {
	c := newCodec(t)
	for name, ctx := range map[string]*messages.TxnContext{
		"zero keepalive": {ID: 3},
		"zero txn id":    {Keepalive: time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			m, err := c.New(messages.TypeInsert, vch(t, 3, 1), []byte("x"))
			require.NoError(t, err)
			m.SetTxn(ctx)
			nm, err := c.Encode(m)
			if err != nil {
				requireInvalid(t, err, nil)
				return
			}
			_, err = c.Decode(nm, 1)
			require.NoError(t, err, "Encode produced a message Decode refuses: %v", nm.Header)
		})
	}
}

// TestDecodeEveryHeaderCorrupted corrupts each header of several real
// messages in turn: a control character or a second value in any of them is
// refused.
func TestDecodeEveryHeaderCorrupted(t *testing.T) {
	c := newCodec(t)
	for _, base := range []*nats.Msg{validInsert(t, c), validBroadcastReplica(t, c), validReplica(t, c), validTimeTick(t, c)} {
		for key, vals := range base.Header {
			t.Run(base.Header.Get(messages.HdrType)+"/"+key, func(t *testing.T) {
				for _, bad := range []string{"\x01", vals[0] + "\x00", "\x7f" + vals[0], vals[0] + "\n"} {
					nm := cloneMsg(base)
					nm.Header.Set(key, bad)
					require.NotPanics(t, func() {
						_, err := c.Decode(nm, 1)
						requireInvalid(t, err, nil)
					})
				}
				if key != messages.HdrBroadcastKey {
					nm := cloneMsg(base)
					nm.Header.Add(key, vals[0])
					require.NotPanics(t, func() {
						_, err := c.Decode(nm, 1)
						requireInvalid(t, err, messages.ErrMalformed)
					})
				}
				// Removing a header never panics; it may still decode (most
				// headers are optional) but then the message re-encodes the
				// same way.
				nm := cloneMsg(base)
				nm.Header.Del(key)
				require.NotPanics(t, func() { _, _ = c.Decode(nm, 1) })
			})
		}
	}
}

// TestZeroValueMessagesDoNotPanic: the message types are exported, so their
// zero values can reach the package's functions; they are bad input, not a
// reason to panic.
func TestZeroValueMessagesDoNotPanic(t *testing.T) {
	c := newCodec(t)
	secondary, err := messages.NewCodec("c2", nil)
	require.NoError(t, err)
	for name, f := range map[string]func() error{
		"Encode": func() error { _, err := c.Encode(&messages.MutableMessage{}); return err },
		"NewTxnMessage": func() error {
			_, err := messages.NewTxnMessage(&messages.ImmutableMessage{}, nil, &messages.ImmutableMessage{})
			return err
		},
		"NewReplicate": func() error {
			_, err := secondary.NewReplicate(&messages.ImmutableMessage{}, testCluster, pch(t, 3))
			return err
		},
		"Immutable.Body": func() error { var b messages.FlushBody; return (&messages.ImmutableMessage{}).Body(&b) },
		"Mutable.Body":   func() error { var b messages.FlushBody; return (&messages.MutableMessage{}).Body(&b) },
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = f() })
			requireInvalid(t, err, nil)
		})
	}
}
