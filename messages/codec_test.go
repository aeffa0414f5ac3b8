package messages_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

const (
	testTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	testTraceState  = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
)

var collRef = messages.CollectionRef{DBName: "db1", CollectionName: "coll1", CollectionID: 42}

// realisticBodies are populated bodies of every built-in type the WAL
// interprets, keyed by type name.
func realisticBodies(t testing.TB) map[string]any {
	return map[string]any{
		"TimeTick":        messages.TimeTickBody{},
		"RecoveryBarrier": messages.RecoveryBarrierBody{Term: 7, Node: "node-1"},
		"CreateSegment":   messages.CreateSegmentBody{CollectionID: 42, PartitionID: 100, SegmentID: 1000},
		"Flush":           messages.FlushBody{CollectionID: 42, SegmentIDs: []int64{1000, 1001}, Reason: "size"},
		"ManualFlush":     messages.ManualFlushBody{CollectionID: 42},
		"BeginTxn":        messages.BeginTxnBody{},
		"CommitTxn":       messages.CommitTxnBody{},
		"RollbackTxn":     messages.RollbackTxnBody{},
		"CreateCollection": messages.CreateCollectionBody{
			CollectionRef: collRef, PartitionIDs: []int64{100},
			VChannels: []string{vch(t, 3, 1).String(), vch(t, 5, 0).String()},
			Schema:    json.RawMessage(`{"fields":[{"name":"id","type":"int64","primary":true},{"name":"v","type":"float_vector","dim":4}]}`),
		},
		"DropCollection":     messages.DropCollectionBody{CollectionRef: collRef},
		"AlterCollection":    messages.AlterCollectionBody{CollectionRef: collRef, SchemaVersion: 2, Schema: json.RawMessage(`{"fields":[]}`), Properties: map[string]string{"ttl": "3600"}},
		"TruncateCollection": messages.TruncateCollectionBody{CollectionRef: collRef},
		"CreatePartition":    messages.PartitionBody{CollectionRef: collRef, PartitionID: 101, PartitionName: "p1"},
		"DropPartition":      messages.PartitionBody{CollectionRef: collRef, PartitionID: 101, PartitionName: "p1"},
		"FlushAll":           messages.FlushAllBody{},
		"AlterReplicateConfig": messages.Star(
			messages.ReplicateMember{Cluster: "c1", URL: "nats://primary:4222", PChannels: []string{"pchan-0", "pchan-1"}},
			messages.ReplicateMember{Cluster: "c2", URL: "nats://secondary:4222", PChannels: []string{"pchan-0", "pchan-1"}}),
		"AlterWAL": messages.AlterWALBody{Settings: map[string]string{"sync": "always"}},
	}
}

// opaquePayload is the caller's bytes for a type without a body.
func opaquePayload(typ *messages.Type) []byte {
	return []byte(`{"kind":"` + typ.Name + `","bin":"` + "\x00\x01\xfe" + `"}`)
}

// expectation is one message to check after a round trip.
type expectation struct {
	msg     *messages.MutableMessage
	subject string
}

// buildRealistic builds the messages a writer (or the WAL) would append for
// typ: one message, or every replica of a broadcast.
func buildRealistic(t testing.TB, c *messages.Codec, typ *messages.Type, body any) []expectation {
	t.Helper()
	var payload []byte
	if typ.Body != nil {
		payload = mustBody(t, typ, body)
	} else {
		payload = opaquePayload(typ)
	}
	tick := mustTick(t, 1_764_000_000_000, 17)
	cl := c.Cluster()
	switch typ.Dispatch {
	case messages.DispatchPChannel:
		p := pch(t, 3)
		m, err := c.NewPChannelBody(typ, p, body)
		require.NoError(t, err)
		m.SetTimeTick(tick)
		m.SetLastConfirmed(41)
		m.SetTerm(5)
		return []expectation{{m, cl.PChannelSubject(p, typ.Token)}}
	case messages.DispatchVChannel:
		v := vch(t, 3, 1)
		var opts []messages.Option
		if !typ.Is(messages.FlagNotTraced) {
			opts = append(opts, messages.WithTrace(testTraceParent, testTraceState))
		}
		if typ.Is(messages.FlagTxnControl) || typ.Is(messages.FlagTxnBody) {
			opts = append(opts, messages.WithTxn(messages.TxnContext{ID: 88, Keepalive: 10 * time.Second}))
		}
		if typ.Is(messages.FlagTxnBody) {
			opts = append(opts, messages.WithDML(100, 3), messages.WithProperty("tenant", "acme"), messages.WithMsgID("cli-1-"+typ.Name))
		}
		var m *messages.MutableMessage
		var err error
		if typ.Body != nil {
			m, err = c.NewBody(typ, v, body, opts...)
		} else {
			m, err = c.New(typ, v, payload, opts...)
		}
		require.NoError(t, err)
		if typ == messages.TypeInsert {
			m.SetSegment(1000)
		}
		m.SetTimeTick(tick)
		m.SetLastConfirmed(40)
		m.SetTerm(5)
		return []expectation{{m, cl.VChannelSubject(v, typ.Token)}}
	}
	// Broadcast types.
	var tg messages.Targets
	switch typ.Dispatch {
	case messages.DispatchVChannelsAndCChannel:
		tg = messages.Targets{VChannels: []streamwal.VChannel{vch(t, 3, 1), vch(t, 5, 0)}, CChannel: cch(t)}
	case messages.DispatchCChannel:
		tg = messages.Targets{CChannel: cch(t)}
	case messages.DispatchVChannels:
		tg = messages.Targets{VChannels: []streamwal.VChannel{vch(t, 3, 1), vch(t, 5, 0)}}
	case messages.DispatchAllPChannels:
		tg = messages.Targets{PChannels: []streamwal.PChannel{pch(t, 0), pch(t, 1), pch(t, 2)}}
	default:
		t.Fatalf("no targets for %s", typ.Dispatch)
	}
	var opts []messages.Option
	if !typ.Is(messages.FlagNotTraced) {
		opts = append(opts, messages.WithTrace(testTraceParent, ""))
	}
	b, err := c.NewBroadcast(typ, tg, fullScope, payload, opts...)
	require.NoError(t, err)
	require.Same(t, typ, b.Type())
	require.Equal(t, payload, b.Payload())
	wantKeys, err := messages.ResourceKeys(typ, fullScope)
	require.NoError(t, err)
	require.Equal(t, wantKeys, b.Keys())
	require.Zero(t, b.Broadcast().ID)
	b.SetID(1234)
	bh := b.Broadcast()
	require.Equal(t, uint64(1234), bh.ID)
	wantV := slices.Clone(tg.VChannels)
	if !tg.CChannel.IsZero() {
		wantV = append(wantV, tg.CChannel)
	}
	require.Equal(t, wantV, bh.VChannels, "VChannels then the CChannel")
	require.Equal(t, tg.PChannels, bh.PChannels)
	require.Equal(t, wantKeys, bh.Keys)

	replicas := b.Split()
	require.Len(t, replicas, len(wantV)+len(tg.PChannels))
	var out []expectation
	for i, r := range replicas {
		h := r.Header()
		require.NotNil(t, h.Broadcast)
		require.Equal(t, bh, *h.Broadcast)
		require.Equal(t, messages.BroadcastMsgID(1234, h), r.MsgID())
		require.Equal(t, payload, r.Payload())
		require.Nil(t, r.Txn())
		r.SetTimeTick(tick + messages.TimeTick(i))
		r.SetLastConfirmed(messages.MessageID(30 + i))
		r.SetTerm(2)
		var subject string
		if i < len(wantV) {
			require.Equal(t, wantV[i], r.VChannel())
			require.Equal(t, wantV[i].PChannel(), r.PChannel())
			subject = cl.VChannelSubject(wantV[i], typ.Token)
		} else {
			p := tg.PChannels[i-len(wantV)]
			require.True(t, r.VChannel().IsZero())
			require.Equal(t, p, r.PChannel())
			subject = cl.PChannelSubject(p, typ.Token)
		}
		out = append(out, expectation{r, subject})
	}
	return out
}

func TestCodecRoundTripEveryBuiltin(t *testing.T) {
	c := newCodec(t)
	bodies := realisticBodies(t)
	for _, typ := range messages.Builtins() {
		if typ.Is(messages.FlagSynthetic) {
			continue
		}
		t.Run(typ.Name, func(t *testing.T) {
			body, hasBody := bodies[typ.Name]
			require.Equal(t, typ.Body != nil, hasBody, "test needs a realistic body for every body type")
			for i, e := range buildRealistic(t, c, typ, body) {
				id := messages.MessageID(500 + i)
				nm, im := roundTrip(t, c, e.msg, id)
				require.Equal(t, e.subject, nm.Subject)
				require.Equal(t, e.subject, c.Subject(e.msg))
				requireReadableHeaders(t, typ, e.msg, nm)
				requireBody(t, typ, body, im, e.msg)
				if typ.Is(messages.FlagUnreplicable) {
					require.True(t, im.Header().Unreplicable)
					require.Equal(t, "true", nm.Header.Get(messages.HdrUnreplicable))
				}
				if typ.Is(messages.FlagNotTraced) {
					require.Empty(t, nm.Header.Get(messages.HdrTraceParent))
				}
				// Encoding is deterministic apart from header order.
				nm2, err := c.Encode(e.msg)
				require.NoError(t, err)
				require.Equal(t, nm.Header, nm2.Header)
				// DecodeMutable gives back the same mutable message.
				mm, err := c.DecodeMutable(nm)
				require.NoError(t, err)
				require.Equal(t, e.msg.Header(), mm.Header())
				require.Same(t, typ, mm.Type())
			}
		})
	}
}

// requireReadableHeaders checks the human-readable header forms of §2.
func requireReadableHeaders(t *testing.T, typ *messages.Type, m *messages.MutableMessage, nm *nats.Msg) {
	t.Helper()
	h := m.Header()
	hdr := nm.Header
	require.Equal(t, "1", hdr.Get(messages.HdrVersion))
	require.Equal(t, typ.Name, hdr.Get(messages.HdrType))
	require.Equal(t, h.PChannel.String(), hdr.Get(messages.HdrPChannel))
	require.Equal(t, typ.Dispatch.PChannelLevel(), h.PChannelLevel())
	if h.VChannel.IsZero() {
		require.NotContains(t, hdr, messages.HdrVChannel)
	} else {
		require.Equal(t, h.VChannel.String(), hdr.Get(messages.HdrVChannel))
	}
	require.Equal(t, strconv.FormatUint(uint64(h.TimeTick), 10), hdr.Get(messages.HdrTimeTick))
	require.Equal(t, h.LastConfirmed.String(), hdr.Get(messages.HdrLastConfirmed))
	require.Equal(t, strconv.FormatUint(h.Term, 10), hdr.Get(messages.HdrTerm))
	require.Equal(t, h.MsgID, hdr.Get(messages.HdrMsgID))
	if h.Txn != nil {
		require.Equal(t, strconv.FormatUint(uint64(h.Txn.ID), 10), hdr.Get(messages.HdrTxnID))
		require.Equal(t, "10s", hdr.Get(messages.HdrTxnKeepalive))
	} else {
		require.NotContains(t, hdr, messages.HdrTxnID)
	}
	if b := h.Broadcast; b != nil {
		require.Equal(t, strconv.FormatUint(b.ID, 10), hdr.Get(messages.HdrBroadcastID))
		var names []string
		for _, v := range b.VChannels {
			names = append(names, v.String())
		}
		for _, p := range b.PChannels {
			names = append(names, p.String())
		}
		require.Equal(t, strings.Join(names, ","), hdr.Get(messages.HdrBroadcastTargets))
		require.Equal(t, keyStrings(b.Keys), hdr.Values(messages.HdrBroadcastKey))
	} else {
		require.NotContains(t, hdr, messages.HdrBroadcastID)
	}
	if d := h.DML; d != nil {
		require.Equal(t, strconv.FormatInt(d.PartitionID, 10), hdr.Get(messages.HdrPartition))
		require.Equal(t, strconv.FormatUint(d.Rows, 10), hdr.Get(messages.HdrRows))
		require.Equal(t, strconv.FormatInt(d.SegmentID, 10), hdr.Get(messages.HdrSegment))
	}
	for k, v := range h.Props {
		require.Equal(t, v, hdr.Get(messages.HdrAppPrefix+k))
	}
	require.Equal(t, h.TraceParent, hdr.Get(messages.HdrTraceParent))
	require.Equal(t, h.TraceState, hdr.Get(messages.HdrTraceState))
	for k, vs := range hdr {
		for _, v := range vs {
			for i := 0; i < len(v); i++ {
				require.True(t, v[i] >= 0x20 && v[i] < 0x7f, "header %s=%q is not printable ASCII", k, v)
			}
		}
	}
}

func requireBody(t *testing.T, typ *messages.Type, body any, im *messages.ImmutableMessage, mm *messages.MutableMessage) {
	t.Helper()
	if typ.Body == nil {
		var anyBody messages.CreateCollectionBody
		requireInvalid(t, im.Body(&anyBody), messages.ErrBadBody)
		return
	}
	out := reflect.New(typ.Body)
	require.NoError(t, im.Body(out.Interface()))
	require.Equal(t, body, out.Elem().Interface())
	out = reflect.New(typ.Body)
	require.NoError(t, mm.Body(out.Interface()))
	require.Equal(t, body, out.Elem().Interface())
	// Wrong destinations are refused.
	requireInvalid(t, im.Body(out.Elem().Interface()), messages.ErrBadBody)
	requireInvalid(t, im.Body(nil), messages.ErrBadBody)
	var wrong struct{ X int }
	requireInvalid(t, im.Body(&wrong), messages.ErrBadBody)
}

func TestCodecBasics(t *testing.T) {
	c := newCodec(t)
	require.Equal(t, testCluster, c.Cluster())
	require.Equal(t, messages.DefaultMaxPayload, c.MaxPayload())
	require.Equal(t, 1<<20, messages.DefaultMaxPayload)
	require.NotNil(t, c.Registry())
	c2, err := messages.NewCodec("c2", nil, messages.WithMaxPayload(10))
	require.NoError(t, err)
	require.Equal(t, 10, c2.MaxPayload())
	require.Equal(t, 1, messages.Version)
	require.Equal(t, 10*time.Second, messages.DefaultKeepalive, "DESIGN §9")
	require.Equal(t, time.Millisecond, messages.MinKeepalive, "DESIGN §9: below 1 ms is invalid")

	for _, bad := range []streamwal.Cluster{"", "a.b", "a b", "-a", streamwal.Cluster(strings.Repeat("c", 33)), "wal>"} {
		_, err := messages.NewCodec(bad, nil)
		requireInvalid(t, err, nil)
	}
	for _, n := range []int{0, -1} {
		_, err := messages.NewCodec(testCluster, nil, messages.WithMaxPayload(n))
		requireInvalid(t, err, nil)
	}
}

func TestPropertiesAndTraceSurvive(t *testing.T) {
	c := newCodec(t)
	v := vch(t, 5, 0)
	long := strings.Repeat("v", messages.MaxPropValueLen)
	opts := []messages.Option{
		messages.WithProperty("k", "v"),
		messages.WithProperty("Mixed-Case_Key9", "with spaces and: colons, commas=equals"),
		messages.WithProperty("empty", ""),
		messages.WithProperty("long", long),
		messages.WithProperty("k", "overwritten"),
		messages.WithTrace(testTraceParent, testTraceState),
		messages.WithUnreplicable(),
		messages.WithMsgID("client-7/req-99"),
	}
	for i := 0; i < messages.MaxProps-4; i++ {
		opts = append(opts, messages.WithProperty("p"+strconv.Itoa(i), strconv.Itoa(i)))
	}
	m, err := c.New(messages.TypeDelete, v, []byte("pk in (1,2,3)"), opts...)
	require.NoError(t, err)
	nm, im := roundTrip(t, c, m, 3)
	h := im.Header()
	require.Len(t, h.Props, messages.MaxProps)
	require.Equal(t, "overwritten", h.Props["k"])
	require.Equal(t, "with spaces and: colons, commas=equals", h.Props["Mixed-Case_Key9"])
	require.Equal(t, "", h.Props["empty"])
	require.Equal(t, long, h.Props["long"])
	got, ok := im.Property("long")
	require.True(t, ok)
	require.Equal(t, long, got)
	_, ok = im.Property("absent")
	require.False(t, ok)
	require.Equal(t, testTraceParent, h.TraceParent)
	require.Equal(t, testTraceState, h.TraceState)
	require.Equal(t, testTraceParent, nm.Header.Get("traceparent"), "W3C header name")
	require.Equal(t, testTraceState, nm.Header.Get("tracestate"))
	require.True(t, h.Unreplicable)
	require.Equal(t, "client-7/req-99", im.MsgID())
	require.Equal(t, "client-7/req-99", nm.Header.Get(nats.MsgIdHdr))
	require.Equal(t, "overwritten", nm.Header.Get("Wal-App-k"))

	// One property too many.
	_, err = c.New(messages.TypeDelete, v, nil, append(opts, messages.WithProperty("onemore", "x"))...)
	requireInvalid(t, err, messages.ErrMalformed)
}

func TestDMLHeaderSurvives(t *testing.T) {
	c := newCodec(t)
	v := vch(t, 3, 1)
	m, err := c.New(messages.TypeInsert, v, []byte("rows"), messages.WithDML(-1, 1<<40))
	require.NoError(t, err)
	m.SetSegment(449573712345678901)
	_, im := roundTrip(t, c, m, 1)
	require.Equal(t, &messages.DMLHeader{PartitionID: -1, Rows: 1 << 40, SegmentID: 449573712345678901}, im.Header().DML)

	// SetSegment alone creates the DML header.
	m, err = c.New(messages.TypeInsert, v, []byte("rows"))
	require.NoError(t, err)
	require.Nil(t, m.Header().DML)
	m.SetSegment(7)
	_, im = roundTrip(t, c, m, 2)
	require.Equal(t, &messages.DMLHeader{SegmentID: 7}, im.Header().DML)

	// Upsert without any DML header keeps none.
	m, err = c.New(messages.TypeUpsert, v, []byte("rows"))
	require.NoError(t, err)
	nm, im := roundTrip(t, c, m, 3)
	require.Nil(t, im.Header().DML)
	require.NotContains(t, nm.Header, messages.HdrRows)
}

func TestEmptyAndMaximalPayloads(t *testing.T) {
	c := newCodec(t)
	v := vch(t, 3, 1)
	for _, payload := range [][]byte{nil, {}, make([]byte, messages.DefaultMaxPayload)} {
		m, err := c.New(messages.TypeInsert, v, payload)
		require.NoError(t, err)
		nm, err := c.Encode(m)
		require.NoError(t, err)
		im, err := c.Decode(nm, 1)
		require.NoError(t, err)
		require.Len(t, im.Payload(), len(payload))
	}
	small, err := messages.NewCodec(testCluster, nil, messages.WithMaxPayload(8))
	require.NoError(t, err)
	m, err := small.New(messages.TypeInsert, v, []byte("12345678"))
	require.NoError(t, err)
	roundTrip(t, small, m, 1)
	// A message built by a codec with a larger limit is refused on encode.
	big, err := c.New(messages.TypeInsert, v, []byte("123456789"))
	require.NoError(t, err)
	_, err = small.Encode(big)
	requireInvalid(t, err, messages.ErrPayloadTooLarge)
}

func TestMessagesDoNotShareState(t *testing.T) {
	c := newCodec(t)
	v := vch(t, 3, 1)
	m, err := c.New(messages.TypeInsert, v, []byte("x"), messages.WithProperty("k", "v"), messages.WithDML(1, 1),
		messages.WithTxn(messages.TxnContext{ID: 1, Keepalive: time.Second}))
	require.NoError(t, err)

	// Header() is a deep copy.
	h := m.Header()
	h.Props["k"] = "changed"
	h.DML.Rows = 99
	h.Txn.ID = 99
	require.Equal(t, "v", m.Header().Props["k"])
	require.Equal(t, uint64(1), m.Header().DML.Rows)
	require.Equal(t, messages.TxnID(1), m.Txn().ID)

	// SetTxn copies its argument.
	ctx := &messages.TxnContext{ID: 5, Keepalive: time.Second}
	m.SetTxn(ctx)
	ctx.ID = 6
	require.Equal(t, messages.TxnID(5), m.Txn().ID)

	// Clone and Freeze are independent of later changes.
	cl := m.Clone()
	im := m.Freeze(10)
	m.SetTimeTick(77)
	m.SetTxn(nil)
	require.NoError(t, m.SetMsgID("later"))
	require.Nil(t, m.Txn())
	require.Equal(t, "later", m.MsgID())
	require.Zero(t, cl.TimeTick())
	require.Zero(t, im.TimeTick())
	require.Equal(t, messages.TxnID(5), cl.Txn().ID)
	require.Equal(t, messages.TxnID(5), im.Txn().ID)
	require.Empty(t, im.MsgID())
	require.Equal(t, messages.MessageID(10), im.ID())

	// Immutable accessors hand out copies.
	it := im.Txn()
	it.ID = 1000
	require.Equal(t, messages.TxnID(5), im.Txn().ID)
	ih := im.Header()
	ih.Props["k"] = "x"
	v2, _ := im.Property("k")
	require.Equal(t, "v", v2)

	// Broadcast and replicate headers are copies too.
	b, err := c.NewBroadcast(messages.TypeCreateCollection, messages.Targets{VChannels: []streamwal.VChannel{v}, CChannel: cch(t)},
		fullScope, mustBody(t, messages.TypeCreateCollection, messages.CreateCollectionBody{CollectionRef: collRef}))
	require.NoError(t, err)
	bh := b.Broadcast()
	bh.VChannels[0] = streamwal.VChannel{}
	keys := b.Keys()
	keys[0].Exclusive = true
	require.Equal(t, v, b.Broadcast().VChannels[0])
	require.False(t, b.Keys()[0].Exclusive)
	b.SetID(3)
	r := b.Split()[0]
	ri := r.Freeze(4)
	rb := ri.Broadcast()
	rb.VChannels[0] = streamwal.VChannel{}
	require.Equal(t, v, ri.Broadcast().VChannels[0])
	require.Nil(t, im.Broadcast())
	require.Nil(t, im.Replicate())
}

func TestSizeEstimate(t *testing.T) {
	c := newCodec(t)
	v := vch(t, 3, 1)
	m, err := c.New(messages.TypeInsert, v, make([]byte, 1000), messages.WithProperty("k", strings.Repeat("x", 100)))
	require.NoError(t, err)
	nm, err := c.Encode(m)
	require.NoError(t, err)
	hdrBytes := len(wireHeader(nm.Header))
	require.GreaterOrEqual(t, m.Size(), 1000+100, "payload and properties are counted")
	require.GreaterOrEqual(t, m.Size(), len(nm.Data)+hdrBytes/2, "estimate should be in the order of the encoded size")
}

// --- Broadcast ---

func TestBroadcastMsgID(t *testing.T) {
	v := messages.Header{PChannel: pch(t, 3), VChannel: vch(t, 3, 1)}
	p := messages.Header{PChannel: pch(t, 3)}
	cc := messages.Header{PChannel: pch(t, 0), VChannel: cch(t)}
	id := messages.BroadcastMsgID(7, v)
	require.Equal(t, id, messages.BroadcastMsgID(7, v), "deterministic")
	require.Equal(t, "bc-7-pchan-3_42v1", id)
	require.Equal(t, "bc-7-pchan-3", messages.BroadcastMsgID(7, p))
	require.Equal(t, "bc-7-pchan-0_vcchan", messages.BroadcastMsgID(7, cc))
	seen := map[string]bool{}
	for _, bid := range []uint64{1, 7, 17, 71, 1 << 63} {
		for _, h := range []messages.Header{v, p, cc, {PChannel: pch(t, 31)}, {PChannel: pch(t, 3), VChannel: vch(t, 3, 11)}} {
			s := messages.BroadcastMsgID(bid, h)
			require.False(t, seen[s], "collision %s", s)
			seen[s] = true
			require.LessOrEqual(t, len(s), messages.MaxMsgIDLen)
		}
	}
}

func TestBroadcastWithoutIDHasNoMsgID(t *testing.T) {
	c := newCodec(t)
	b, err := c.NewBroadcast(messages.TypeCreateDatabase, messages.Targets{CChannel: cch(t)}, fullScope, []byte("db"),
		messages.WithMsgID("mine"))
	require.NoError(t, err)
	rs := b.Split()
	require.Len(t, rs, 1)
	require.Equal(t, "mine", rs[0].MsgID(), "without a broadcast id the writer's msg id stays")
	b.SetID(9)
	rs = b.Split()
	require.Equal(t, "bc-9-pchan-0_vcchan", rs[0].MsgID())
	// Split twice gives equal but independent replicas.
	again := b.Split()
	require.Equal(t, rs[0].Header(), again[0].Header())
	rs[0].SetTimeTick(5)
	require.Zero(t, again[0].TimeTick())
}

// --- Replication ---

func TestReplicate(t *testing.T) {
	primary, err := messages.NewCodec("primary", nil)
	require.NoError(t, err)
	secondary, err := messages.NewCodec("secondary", nil)
	require.NoError(t, err)
	srcP := pch(t, 3)
	srcV := vch(t, 3, 1)
	dstP, err := streamwal.NewPChannel("rep", 3)
	require.NoError(t, err)

	m, err := primary.New(messages.TypeInsert, srcV, []byte("rows"), messages.WithProperty("tenant", "acme"),
		messages.WithDML(100, 2), messages.WithTrace(testTraceParent, ""),
		messages.WithTxn(messages.TxnContext{ID: 4, Keepalive: time.Second}))
	require.NoError(t, err)
	m.SetTimeTick(mustTick(t, 1_764_000_000_000, 1))
	m.SetLastConfirmed(90)
	m.SetTerm(3)
	require.NoError(t, m.SetMsgID("orig"))
	nm, err := primary.Encode(m)
	require.NoError(t, err)
	src, err := primary.Decode(nm, 100)
	require.NoError(t, err)

	r, err := secondary.NewReplicate(src, "primary", dstP)
	require.NoError(t, err)
	require.Same(t, messages.TypeInsert, r.Type())
	require.Equal(t, src.Payload(), r.Payload())
	h := r.Header()
	require.Equal(t, dstP, h.PChannel)
	wantV, err := dstP.VChannel(42, 1)
	require.NoError(t, err)
	require.Equal(t, wantV, h.VChannel, "same collection and shard on the target pchannel")
	require.Equal(t, &messages.ReplicateHeader{Cluster: "primary", MessageID: 100, TimeTick: src.TimeTick(), LastConfirmed: 90}, h.Replicate)
	require.Zero(t, h.TimeTick, "the WAL assigns a new TimeTick")
	require.Zero(t, h.LastConfirmed)
	require.Zero(t, h.Term)
	require.Equal(t, src.Header().Props, h.Props)
	require.Equal(t, src.Header().DML, h.DML)
	require.Equal(t, src.Header().Txn, h.Txn)
	require.Equal(t, testTraceParent, h.TraceParent)
	require.Empty(t, h.MsgID, "a transaction's replica carries no message id: it replicates whole")

	// Outside a transaction, the replica has its own dedup identity.
	solo, err := primary.New(messages.TypeInsert, srcV, []byte("rows"), messages.WithMsgID("orig"))
	require.NoError(t, err)
	solo.SetTimeTick(mustTick(t, 1_764_000_000_000, 2))
	soloNM, err := primary.Encode(solo)
	require.NoError(t, err)
	soloSrc, err := primary.Decode(soloNM, 101)
	require.NoError(t, err)
	r1, err := secondary.NewReplicate(soloSrc, "primary", dstP)
	require.NoError(t, err)
	require.NotEqual(t, "orig", r1.MsgID(), "the replica has its own dedup identity")
	require.Contains(t, r1.MsgID(), "primary")
	r2, err := secondary.NewReplicate(soloSrc, "primary", dstP)
	require.NoError(t, err)
	require.Equal(t, r1.MsgID(), r2.MsgID(), "a retried replication dedups")

	r.SetTimeTick(mustTick(t, 1_764_000_000_005, 0))
	r.SetLastConfirmed(7)
	r.SetTerm(1)
	rnm, rim := roundTrip(t, secondary, r, 8)
	require.Equal(t, testClusterSubject("secondary").VChannelSubject(wantV, "insert"), rnm.Subject)
	require.Equal(t, "primary", rnm.Header.Get(messages.HdrReplicateCluster))
	require.Equal(t, "100", rnm.Header.Get(messages.HdrReplicateID))
	require.Equal(t, strconv.FormatUint(uint64(src.TimeTick()), 10), rnm.Header.Get(messages.HdrReplicateTimeTick))
	require.Equal(t, "90", rnm.Header.Get(messages.HdrReplicateLastConf))
	require.Equal(t, h.Replicate, rim.Replicate())
	rr := rim.Replicate()
	rr.MessageID = 1
	require.Equal(t, messages.MessageID(100), rim.Replicate().MessageID, "Replicate() returns a copy")

	// A replica is not replicated again.
	tertiary, err := messages.NewCodec("tertiary", nil)
	require.NoError(t, err)
	_, err = tertiary.NewReplicate(rim, "secondary", dstP)
	requireInvalid(t, err, messages.ErrBadTarget)

	// A cluster does not replicate into itself.
	_, err = primary.NewReplicate(src, "primary", srcP)
	requireInvalid(t, err, messages.ErrBadTarget)

	_, err = secondary.NewReplicate(nil, "primary", dstP)
	requireInvalid(t, err, messages.ErrMalformed)
}

func testClusterSubject(c string) streamwal.Cluster { return streamwal.Cluster(c) }

func TestReplicateKeepsChannelKinds(t *testing.T) {
	primary := newCodec(t)
	secondary, err := messages.NewCodec("c2", nil)
	require.NoError(t, err)
	dst := pch(t, 0)

	// The CChannel maps to the CChannel.
	b, err := primary.NewBroadcast(messages.TypeCreateDatabase, messages.Targets{CChannel: cch(t)}, fullScope, []byte("db"))
	require.NoError(t, err)
	b.SetID(5)
	cm := b.Split()[0]
	cm.SetTimeTick(10)
	cm.SetLastConfirmed(9)
	src := cm.Freeze(9)
	r, err := secondary.NewReplicate(src, testCluster, dst)
	require.NoError(t, err)
	require.True(t, r.VChannel().IsControl())
	require.Equal(t, dst, r.VChannel().PChannel())
	require.NotNil(t, r.Header().Broadcast, "the broadcast header is kept")
	r.SetTimeTick(1)
	roundTrip(t, secondary, r, 1)

	// PChannel-level cluster barriers stay PChannel-level.
	fb, err := primary.NewBroadcast(messages.TypeFlushAll, messages.Targets{PChannels: []streamwal.PChannel{pch(t, 0)}}, fullScope,
		mustBody(t, messages.TypeFlushAll, messages.FlushAllBody{}))
	require.NoError(t, err)
	fb.SetID(6)
	fm := fb.Split()[0]
	fm.SetTimeTick(11)
	fm.SetLastConfirmed(10)
	r, err = secondary.NewReplicate(fm.Freeze(10), testCluster, dst)
	require.NoError(t, err)
	require.True(t, r.VChannel().IsZero())
	require.Equal(t, dst, r.PChannel())
	nm, _ := roundTrip(t, secondary, r, 2)
	require.Equal(t, streamwal.Cluster("c2").PChannelSubject(dst, "flushall"), nm.Subject)
}

func TestReplicateRefusesUnreplicable(t *testing.T) {
	primary := newCodec(t)
	secondary, err := messages.NewCodec("c2", nil)
	require.NoError(t, err)
	p := pch(t, 3)
	v := vch(t, 3, 1)

	tick, err := primary.NewPChannelBody(messages.TypeTimeTick, p, messages.TimeTickBody{})
	require.NoError(t, err)
	barrier, err := primary.NewPChannelBody(messages.TypeRecoveryBarrier, p, messages.RecoveryBarrierBody{Term: 1})
	require.NoError(t, err)
	rg, err := primary.NewBroadcast(messages.TypeAlterResourceGroup, messages.Targets{CChannel: cch(t)}, fullScope, []byte("rg"))
	require.NoError(t, err)
	rg.SetID(1)
	flagged, err := primary.New(messages.TypeInsert, v, []byte("x"), messages.WithUnreplicable())
	require.NoError(t, err)
	for name, m := range map[string]*messages.MutableMessage{
		"TimeTick": tick, "RecoveryBarrier": barrier, "AlterResourceGroup": rg.Split()[0], "WithUnreplicable": flagged,
	} {
		m.SetTimeTick(5)
		m.SetLastConfirmed(1)
		_, err := secondary.NewReplicate(m.Freeze(3), testCluster, p)
		requireInvalid(t, err, messages.ErrBadTarget)
		require.Error(t, err, name)
	}

	// A synthetic Txn message is not replicated as such.
	txn := assembleTxn(t, primary, v, 12)
	_, err = secondary.NewReplicate(txn, testCluster, p)
	requireInvalid(t, err, messages.ErrBadTarget)

	// Types unknown to the target registry are refused.
	reg := messages.NewRegistry()
	app, err := reg.Register(messages.TypeSpec{Name: "AppOnly", Dispatch: messages.DispatchVChannel})
	require.NoError(t, err)
	appCodec, err := messages.NewCodec(testCluster, reg)
	require.NoError(t, err)
	am, err := appCodec.New(app, v, []byte("x"))
	require.NoError(t, err)
	am.SetTimeTick(1)
	_, err = secondary.NewReplicate(am.Freeze(1), testCluster, p)
	requireInvalid(t, err, messages.ErrUnknownType)
}

// --- Transactions ---

// txnParts builds and appends (encode + decode) a small transaction on v.
func txnParts(t *testing.T, c *messages.Codec, v streamwal.VChannel, id messages.TxnID) (begin *messages.ImmutableMessage, body []*messages.ImmutableMessage, commit *messages.ImmutableMessage) {
	t.Helper()
	ctx := messages.TxnContext{ID: id, Keepalive: 2 * time.Second}
	seq := messages.MessageID(100)
	app := func(m *messages.MutableMessage) *messages.ImmutableMessage {
		seq++
		m.SetTimeTick(mustTick(t, 1_764_000_000_000, uint32(seq)))
		m.SetLastConfirmed(101)
		_, im := roundTrip(t, c, m, seq)
		return im
	}
	bm, err := c.NewBody(messages.TypeBeginTxn, v, messages.BeginTxnBody{}, messages.WithTxn(ctx))
	require.NoError(t, err)
	begin = app(bm)
	for _, typ := range []*messages.Type{messages.TypeInsert, messages.TypeDelete, messages.TypeUpsert} {
		m, err := c.New(typ, v, []byte(typ.Name), messages.WithTxn(ctx))
		require.NoError(t, err)
		body = append(body, app(m))
	}
	cm, err := c.NewBody(messages.TypeCommitTxn, v, messages.CommitTxnBody{}, messages.WithTxn(ctx))
	require.NoError(t, err)
	commit = app(cm)
	return begin, body, commit
}

func assembleTxn(t *testing.T, c *messages.Codec, v streamwal.VChannel, id messages.TxnID) *messages.ImmutableMessage {
	t.Helper()
	begin, body, commit := txnParts(t, c, v, id)
	txn, err := messages.NewTxnMessage(begin, body, commit)
	require.NoError(t, err)
	return txn
}

func TestNewTxnMessage(t *testing.T) {
	c := newCodec(t)
	v := vch(t, 3, 1)
	begin, body, commit := txnParts(t, c, v, 21)
	txn, err := messages.NewTxnMessage(begin, body, commit)
	require.NoError(t, err)
	require.Same(t, messages.TypeTxn, txn.Type())
	require.Equal(t, commit.ID(), txn.ID())
	require.Equal(t, commit.TimeTick(), txn.TimeTick())
	require.Equal(t, commit.LastConfirmed(), txn.LastConfirmed())
	require.Equal(t, v, txn.VChannel())
	require.Equal(t, messages.TxnID(21), txn.Txn().ID)
	require.Same(t, begin, txn.TxnBegin())
	require.Same(t, commit, txn.TxnCommit())
	require.Equal(t, body, txn.TxnBody())
	got := txn.TxnBody()
	got[0] = nil
	require.NotNil(t, txn.TxnBody()[0], "TxnBody returns a copy")
	body[0] = nil
	require.NotNil(t, txn.TxnBody()[0], "NewTxnMessage keeps its own copy of the body slice")

	// Empty transactions are fine.
	empty, err := messages.NewTxnMessage(begin, nil, commit)
	require.NoError(t, err)
	require.Empty(t, empty.TxnBody())

	// Ordinary messages have no parts.
	require.Nil(t, commit.TxnBegin())
	require.Nil(t, commit.TxnBody())
	require.Nil(t, commit.TxnCommit())

	// The synthetic type cannot be built, encoded or appended by writers.
	_, err = c.New(messages.TypeTxn, v, nil)
	requireInvalid(t, err, messages.ErrBadType)
}

func TestNewTxnMessageRefusals(t *testing.T) {
	c := newCodec(t)
	v := vch(t, 3, 1)
	begin, body, commit := txnParts(t, c, v, 21)
	otherBegin, otherBody, otherCommit := txnParts(t, c, v, 22)
	_, vBody, vCommit := txnParts(t, c, vch(t, 3, 2), 21) // same id, other vchannel

	noTxn, err := c.New(messages.TypeInsert, v, []byte("x"))
	require.NoError(t, err)
	noTxnIm := noTxn.Freeze(1)
	ctx := messages.TxnContext{ID: 21, Keepalive: time.Second}
	rb, err := c.NewBody(messages.TypeRollbackTxn, v, messages.RollbackTxnBody{}, messages.WithTxn(ctx))
	require.NoError(t, err)
	rollback := rb.Freeze(2)
	// A message of a type that is not a body type, carrying the txn context.
	notBody := rollback

	for _, tc := range []struct {
		name          string
		begin, commit *messages.ImmutableMessage
		body          []*messages.ImmutableMessage
	}{
		{"nil begin", nil, commit, body},
		{"nil commit", begin, nil, body},
		{"begin is not BeginTxn", commit, commit, body},
		{"commit is not CommitTxn", begin, begin, body},
		{"rollback instead of commit", begin, rollback, body},
		{"mismatched txn ids", begin, otherCommit, body},
		{"mismatched begin", otherBegin, commit, body},
		{"body of another txn", begin, commit, otherBody},
		{"mixed body", begin, commit, []*messages.ImmutableMessage{body[0], otherBody[1]}},
		{"commit on other vchannel", begin, vCommit, body},
		{"body on other vchannel", begin, commit, vBody},
		{"body without txn context", begin, commit, []*messages.ImmutableMessage{noTxnIm}},
		{"non-body type in body", begin, commit, []*messages.ImmutableMessage{notBody}},
		{"begin in body", begin, commit, []*messages.ImmutableMessage{begin}},
		{"begin without txn", noTxnIm, commit, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NotPanics(t, func() {
				m, err := messages.NewTxnMessage(tc.begin, tc.body, tc.commit)
				require.Nil(t, m)
				requireInvalid(t, err, messages.ErrMalformed)
			})
		})
	}
}

// TestNewTxnMessageNilBodyElement: a nil body message is bad input, not a
// panic.
func TestNewTxnMessageNilBodyElement(t *testing.T) {
	c := newCodec(t)
	begin, body, commit := txnParts(t, c, vch(t, 3, 1), 21)
	var err error
	require.NotPanics(t, func() {
		_, err = messages.NewTxnMessage(begin, append(body, nil), commit)
	})
	requireInvalid(t, err, messages.ErrMalformed)
}

// TestReplicateRefusesZeroTarget: the target PChannel is not validated, so a
// PChannel-level or CChannel message is "retargeted" to no channel at all.
func TestReplicateRefusesZeroTarget(t *testing.T) {
	primary := newCodec(t)
	secondary, err := messages.NewCodec("c2", nil)
	require.NoError(t, err)
	fb, err := primary.NewBroadcast(messages.TypeAlterWAL, messages.Targets{PChannels: []streamwal.PChannel{pch(t, 0)}}, fullScope,
		mustBody(t, messages.TypeAlterWAL, messages.AlterWALBody{}))
	require.NoError(t, err)
	fb.SetID(1)
	db, err := primary.NewBroadcast(messages.TypeCreateDatabase, messages.Targets{CChannel: cch(t)}, fullScope, []byte("db"))
	require.NoError(t, err)
	db.SetID(2)
	for name, m := range map[string]*messages.MutableMessage{"pchannel-level": fb.Split()[0], "cchannel": db.Split()[0]} {
		t.Run(name, func(t *testing.T) {
			m.SetTimeTick(10)
			m.SetLastConfirmed(5)
			r, err := secondary.NewReplicate(m.Freeze(5), testCluster, streamwal.PChannel{})
			if err == nil {
				t.Logf("replica has pchannel %q, subject %q", r.PChannel(), secondary.Subject(r))
			}
			requireInvalid(t, err, messages.ErrBadTarget)
		})
	}
}

// TestReplicateValidatesSourceCluster: the source cluster name ends up in
// the Wal-Replicate-Cluster header and in the msg id; an empty or invalid
// name makes a replica whose source identity is lost or undecodable.
func TestReplicateValidatesSourceCluster(t *testing.T) {
	secondary, err := messages.NewCodec("c2", nil)
	require.NoError(t, err)
	m, err := newCodec(t).New(messages.TypeInsert, vch(t, 3, 1), []byte("x"))
	require.NoError(t, err)
	m.SetTimeTick(10)
	m.SetLastConfirmed(5)
	src := m.Freeze(5)
	for _, bad := range []streamwal.Cluster{"", "bad name", "a.b"} {
		t.Run(string(bad), func(t *testing.T) {
			r, err := secondary.NewReplicate(src, bad, pch(t, 3))
			if err == nil {
				// Show what goes wrong downstream.
				nm, eerr := secondary.Encode(r)
				require.NoError(t, eerr)
				im, derr := secondary.Decode(nm, 1)
				t.Logf("decode: %v; replicate header after decode: %+v", derr, func() any {
					if im == nil {
						return nil
					}
					return im.Replicate()
				}())
			}
			requireInvalid(t, err, nil)
		})
	}
}

// TestReplicateOfMessageWithoutTimeTickDecodes: NewReplicate copies the
// source's TimeTick and LastConfirmed into the replicate header; encodeHeader
// writes them even when zero ("0"), and decode refuses "0" for these
// headers. A replica whose source has LastConfirmed 0 (or TimeTick 0) is
// therefore encoded into a message that cannot be decoded. The same bug was
// found by FuzzDecode (testdata/fuzz/FuzzDecode/2c7ff7975bac4fe6): a replica
// without Wal-Replicate-Message-Id decodes, but its re-encoding does not.
func TestReplicateOfMessageWithoutTimeTickDecodes(t *testing.T) {
	primary := newCodec(t)
	secondary, err := messages.NewCodec("c2", nil)
	require.NoError(t, err)
	for name, set := range map[string]func(*messages.MutableMessage){
		"no last confirmed": func(m *messages.MutableMessage) { m.SetTimeTick(10) },
		"no timetick":       func(m *messages.MutableMessage) { m.SetLastConfirmed(4) },
	} {
		t.Run(name, func(t *testing.T) {
			m, err := primary.New(messages.TypeInsert, vch(t, 3, 1), []byte("x"))
			require.NoError(t, err)
			set(m)
			nm, err := primary.Encode(m)
			require.NoError(t, err)
			src, err := primary.Decode(nm, 5)
			require.NoError(t, err, "the source message itself is a valid stored message")
			r, err := secondary.NewReplicate(src, testCluster, pch(t, 3))
			if err != nil {
				// Refusing such a source is a valid fix too.
				requireInvalid(t, err, nil)
				return
			}
			r.SetTimeTick(20)
			r.SetLastConfirmed(19)
			rnm, err := secondary.Encode(r)
			require.NoError(t, err)
			im, err := secondary.Decode(rnm, 20)
			require.NoError(t, err, "headers %v", rnm.Header)
			require.Equal(t, r.Header().Replicate, im.Replicate())
		})
	}
}

func TestBroadcastReplicasShareWriterProperties(t *testing.T) {
	c := newCodec(t)
	b, err := c.NewBroadcast(messages.TypeImport, messages.Targets{VChannels: []streamwal.VChannel{vch(t, 3, 1), vch(t, 5, 0), vch(t, 7, 2)}},
		fullScope, []byte("files"), messages.WithProperty("job", "42"), messages.WithTrace(testTraceParent, testTraceState),
		messages.WithUnreplicable())
	require.NoError(t, err)
	b.SetID(11)
	ids := map[string]bool{}
	for i, r := range b.Split() {
		h := r.Header()
		require.Equal(t, map[string]string{"job": "42"}, h.Props)
		require.Equal(t, testTraceParent, h.TraceParent)
		require.True(t, h.Unreplicable)
		require.False(t, ids[h.MsgID])
		ids[h.MsgID] = true
		r.SetTimeTick(messages.TimeTick(100 + i))
		roundTrip(t, c, r, messages.MessageID(i+1))
	}
	require.Len(t, ids, 3)
}

// TestSetTrace: SetTrace gives a built message a trace context that
// survives encoding, refuses one that is not a printable W3C header
// (keeping what the message had), and leaves a type that is never traced
// without one.
func TestSetTrace(t *testing.T) {
	c := newCodec(t)
	v := vch(t, 5, 0)
	m, err := c.New(messages.TypeInsert, v, []byte("x"))
	require.NoError(t, err)
	require.NoError(t, m.SetTrace(testTraceParent, testTraceState))
	parent, state := m.Trace()
	require.Equal(t, testTraceParent, parent)
	require.Equal(t, testTraceState, state)
	_, im := roundTrip(t, c, m, 1)
	require.Equal(t, testTraceParent, im.Header().TraceParent)
	require.Equal(t, testTraceState, im.Header().TraceState)

	err = m.SetTrace("bad\x00parent", "")
	require.ErrorIs(t, err, messages.ErrMalformed)
	parent, _ = m.Trace()
	require.Equal(t, testTraceParent, parent, "a refused trace context changes nothing")

	tick, err := c.NewPChannelBody(messages.TypeTimeTick, v.PChannel(), messages.TimeTickBody{})
	require.NoError(t, err)
	require.NoError(t, tick.SetTrace(testTraceParent, ""))
	parent, _ = tick.Trace()
	require.Empty(t, parent, "TimeTicks are never traced")
}
