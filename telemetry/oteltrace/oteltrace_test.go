package oteltrace_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/telemetry/oteltrace"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks).
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }

// traced is a cluster whose node and client trace into one in-memory
// exporter.
type traced struct {
	exp    *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	client *client.Client
	v      streamwal.VChannel
	col    client.Collection
	url    string
}

// startTraced starts a one-node cluster and a client that trace, and
// creates a collection of two shards (v is its first VChannel).
func startTraced(t *testing.T) *traced { t.Helper(); return startTracedVia(t, false) }

// startTracedVia is startTraced with a client that appends through the
// local bypass (local) or through NATS.
func startTracedVia(t *testing.T, local bool) *traced {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	sys, err := system.Start(ctx, system.Options{Cluster: "traces", ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Coord: coord.Config{PChannels: 2}, TracerProvider: tp})
	require.NoError(t, err)
	t.Cleanup(sys.Close)
	_, err = sys.WaitServing(ctx, false)
	require.NoError(t, err)
	bypass := client.WithoutLocalBypass()
	if local {
		bypass = client.WithLocal(sys.Local())
	}
	c, err := client.Connect(sys.Server.ClientURL(), client.WithCluster("traces"), bypass, client.WithTracerProvider(tp))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "db", Name: "traced", ID: 9, Shards: 2})
	require.NoError(t, err)
	require.Len(t, vs, 2)
	return &traced{exp: exp, tp: tp, client: c, v: vs[0], col: client.Collection{DBName: "db", Name: "traced", ID: 9, Shards: 2},
		url: sys.Server.ClientURL()}
}

// caller runs f under a span of the test's own, and returns its context
// and the spans recorded since the start of the call.
func (tr *traced) caller(t *testing.T, f func(ctx context.Context)) (trace.SpanContext, tracetest.SpanStubs) {
	t.Helper()
	tr.exp.Reset()
	ctx, span := tr.tp.Tracer("test").Start(context.Background(), "caller")
	f(ctx)
	span.End()
	return span.SpanContext(), tr.exp.GetSpans()
}

// named returns the spans called name.
func named(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the only span called name.
func one(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	got := named(spans, name)
	require.Len(t, got, 1, "spans called %s", name)
	return got[0]
}

// attr returns the value of a span's attribute.
func attr(s tracetest.SpanStub, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// requireChild checks that child's parent is parent, in the same trace.
func requireChild(t *testing.T, parent trace.SpanContext, child tracetest.SpanStub) {
	t.Helper()
	require.Equal(t, parent.TraceID(), child.SpanContext.TraceID(), "%s is in its parent's trace", child.Name)
	require.Equal(t, parent.SpanID(), child.Parent.SpanID(), "%s's parent", child.Name)
}

// TestTraceOfAnAutocommitAppend: the caller's span reaches the node
// through the message's headers: caller → wal.autocommit →
// wal.dist_append (client) → wal.append → wal.appendimpl (node), with the
// message's type, VChannel and TimeTick; the same through the local
// bypass, where the client hands the message to the node in its process.
func TestTraceOfAnAutocommitAppend(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(map[bool]string{false: "remote", true: "local"}[local], func(t *testing.T) { testTraceOfAnAutocommitAppend(t, local) })
	}
}

// testTraceOfAnAutocommitAppend is TestTraceOfAnAutocommitAppend through
// the local bypass or not.
func testTraceOfAnAutocommitAppend(t *testing.T, local bool) {
	tr := startTracedVia(t, local)
	var res []client.AppendResult
	root, spans := tr.caller(t, func(ctx context.Context) {
		m, err := tr.client.Codec().New(messages.TypeInsert, tr.v, []byte("x"))
		require.NoError(t, err)
		res, err = tr.client.Append(ctx, m)
		require.NoError(t, err)
	})
	auto := one(t, spans, oteltrace.SpanAutocommit)
	requireChild(t, root, auto)
	dist := one(t, spans, oteltrace.SpanDistAppend)
	requireChild(t, auto.SpanContext, dist)
	app := one(t, spans, oteltrace.SpanAppend)
	requireChild(t, dist.SpanContext, app)
	impl := one(t, spans, oteltrace.SpanAppendImpl)
	requireChild(t, app.SpanContext, impl)

	typ, _ := attr(app, oteltrace.AttrMessageType)
	require.Equal(t, messages.TypeInsert.Name, typ.AsString())
	vc, _ := attr(app, oteltrace.AttrMessageVChannel)
	require.Equal(t, tr.v.String(), vc.AsString())
	tt, ok := attr(app, oteltrace.AttrMessageTimeTick)
	require.True(t, ok, "the TimeTick the WAL assigned")
	require.Equal(t, int64(res[0].TimeTick), tt.AsInt64())
	for _, s := range spans {
		typ, _ := attr(s, oteltrace.AttrMessageType)
		require.NotEqual(t, messages.TypeTimeTick.Name, typ.AsString(), "TimeTicks are never traced")
	}
}

// TestTraceOfATransaction: a transaction is one wal.txn span under the
// caller's, and each of its messages' appends at the node (begin, bodies,
// commit) is a child of it carrying the transaction's ID.
func TestTraceOfATransaction(t *testing.T) {
	tr := startTraced(t)
	var txnID messages.TxnID
	root, spans := tr.caller(t, func(ctx context.Context) {
		txn, err := tr.client.BeginTxn(ctx, tr.v, 0)
		require.NoError(t, err)
		txnID = txn.Context().ID
		var body []*messages.MutableMessage
		for _, p := range []string{"a", "b"} {
			m, err := tr.client.Codec().New(messages.TypeInsert, tr.v, []byte(p))
			require.NoError(t, err)
			body = append(body, m)
		}
		_, err = txn.Append(ctx, body...)
		require.NoError(t, err)
		_, err = txn.Commit(ctx)
		require.NoError(t, err)
	})
	txn := one(t, spans, oteltrace.SpanTxn)
	requireChild(t, root, txn)
	id, _ := attr(txn, oteltrace.AttrTxnID)
	require.Equal(t, int64(txnID), id.AsInt64())
	appends := named(spans, oteltrace.SpanAppend)
	require.Len(t, appends, 4, "BeginTxn, two bodies, CommitTxn")
	types := map[string]int{}
	for _, a := range appends {
		requireChild(t, txn.SpanContext, a)
		typ, _ := attr(a, oteltrace.AttrMessageType)
		types[typ.AsString()]++
		if typ.AsString() != messages.TypeBeginTxn.Name {
			id, ok := attr(a, oteltrace.AttrTxnID)
			require.True(t, ok, "%s carries the transaction's id", typ.AsString())
			require.Equal(t, int64(txnID), id.AsInt64())
		}
	}
	require.Equal(t, map[string]int{messages.TypeBeginTxn.Name: 1, messages.TypeInsert.Name: 2, messages.TypeCommitTxn.Name: 1}, types)
}

// TestTraceOfABroadcast: a broadcast to several VChannels (a new
// collection of two shards) is a wal.broadcast span under the caller's,
// naming its type, its target VChannels and the ID the coordinator gave
// it, and the append of each of its replicas at the node is a wal.append
// under it.
func TestTraceOfABroadcast(t *testing.T) {
	tr := startTraced(t)
	var vs []streamwal.VChannel
	root, spans := tr.caller(t, func(ctx context.Context) {
		var err error
		vs, err = tr.client.CreateCollection(ctx, client.Collection{DBName: "db", Name: "wide", ID: 10, Shards: 2})
		require.NoError(t, err)
	})
	bc := one(t, spans, oteltrace.SpanBroadcast)
	requireChild(t, root, bc)
	id, ok := attr(bc, oteltrace.AttrBroadcastID)
	require.True(t, ok)
	require.Positive(t, id.AsInt64())
	typ, _ := attr(bc, oteltrace.AttrMessageType)
	require.Equal(t, messages.TypeCreateCollection.Name, typ.AsString())
	got, _ := attr(bc, oteltrace.AttrBroadcastVChannel)
	require.Len(t, vs, 2)
	require.Equal(t, []string{vs[0].String(), vs[1].String()}, got.AsStringSlice())

	// Every replica carries the broadcast's context to its node: one
	// wal.append under wal.broadcast for each VChannel and the CChannel.
	targets := map[string]bool{}
	for _, a := range named(spans, oteltrace.SpanAppend) {
		requireChild(t, bc.SpanContext, a)
		typ, _ := attr(a, oteltrace.AttrMessageType)
		require.Equal(t, messages.TypeCreateCollection.Name, typ.AsString())
		v, _ := attr(a, oteltrace.AttrMessageVChannel)
		targets[v.AsString()] = true
	}
	require.Len(t, targets, 3, "the two VChannels and the CChannel: %v", targets)
	require.True(t, targets[vs[0].String()] && targets[vs[1].String()], "%v", targets)
}

// TestInjectAndExtract: a span context survives a message's headers; a
// TimeTick, or a message that carries its own context, is left alone.
func TestInjectAndExtract(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "s")
	defer span.End()

	h := map[string][]string{}
	oteltrace.Inject(ctx, messages.TypeInsert, h)
	require.Len(t, h[messages.HdrTraceParent], 1)
	got := trace.SpanContextFromContext(oteltrace.Extract(context.Background(), messages.Header{TraceParent: h[messages.HdrTraceParent][0]}))
	require.Equal(t, span.SpanContext().TraceID(), got.TraceID())
	require.Equal(t, span.SpanContext().SpanID(), got.SpanID())
	require.True(t, got.IsRemote())

	tick := map[string][]string{}
	oteltrace.Inject(ctx, messages.TypeTimeTick, tick)
	require.Empty(t, tick, "a TimeTick is never traced")
	own := map[string][]string{messages.HdrTraceParent: {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	oteltrace.Inject(ctx, messages.TypeInsert, own)
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", own[messages.HdrTraceParent][0], "the application's context wins")
	require.False(t, trace.SpanContextFromContext(oteltrace.Extract(context.Background(), messages.Header{})).IsValid())
}

// TestTraceOfAConsume: a message read is a wal.dist_consume span under
// the reader's span, linked to the context its producer wrote into it.
func TestTraceOfAConsume(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(map[bool]string{false: "remote", true: "local"}[local], func(t *testing.T) { testTraceOfAConsume(t, local) })
	}
}

// testTraceOfAConsume is TestTraceOfAConsume of a message appended
// through the local bypass or not: either way the stored message carries
// its producer's context.
func testTraceOfAConsume(t *testing.T, local bool) {
	tr := startTracedVia(t, local)
	_, produced := tr.caller(t, func(ctx context.Context) {
		m, err := tr.client.Codec().New(messages.TypeInsert, tr.v, []byte("x"))
		require.NoError(t, err)
		_, err = tr.client.Append(ctx, m)
		require.NoError(t, err)
	})
	dist := one(t, produced, oteltrace.SpanDistAppend)
	reader, spans := tr.caller(t, func(ctx context.Context) {
		s, err := tr.client.Read(ctx, client.ReadOptions{VChannel: tr.v, Start: client.Earliest(), UntilNow: true})
		require.NoError(t, err)
		defer s.Close()
		for m, err := range s.All(ctx) {
			require.NoError(t, err)
			require.NotNil(t, m)
		}
	})
	var consumed []tracetest.SpanStub
	for _, s := range named(spans, oteltrace.SpanDistConsume) {
		if typ, _ := attr(s, oteltrace.AttrMessageType); typ.AsString() == messages.TypeInsert.Name {
			consumed = append(consumed, s)
		}
	}
	require.Len(t, consumed, 1, "one span for the one insert read")
	requireChild(t, reader, consumed[0])
	require.Len(t, consumed[0].Links, 1)
	require.Equal(t, dist.SpanContext.SpanID(), consumed[0].Links[0].SpanContext.SpanID(), "linked to the producer's context")
	require.Equal(t, dist.SpanContext.TraceID(), consumed[0].Links[0].SpanContext.TraceID())
}

// TestTraceOfABroadcastCallback: the coordinator's callback of a
// broadcast (a dropped collection's) is a wal.bc_callback span under the
// broadcast's.
func TestTraceOfABroadcastCallback(t *testing.T) {
	tr := startTraced(t)
	_, spans := tr.caller(t, func(ctx context.Context) {
		require.NoError(t, tr.client.DropCollection(ctx, tr.col))
	})
	bc := one(t, spans, oteltrace.SpanBroadcast)
	cb := one(t, spans, oteltrace.SpanBroadcastCallback)
	requireChild(t, bc.SpanContext, cb)
	typ, _ := attr(cb, oteltrace.AttrMessageType)
	require.Equal(t, messages.TypeDropCollection.Name, typ.AsString())
	id, _ := attr(bc, oteltrace.AttrBroadcastID)
	cbID, _ := attr(cb, oteltrace.AttrBroadcastID)
	require.Equal(t, id.AsInt64(), cbID.AsInt64())
}

// TestTraceOfAConsumedTransaction: a transaction read back arrives
// assembled as one Txn message, which carries its CommitTxn's context:
// its wal.dist_consume span is linked to the transaction's span.
func TestTraceOfAConsumedTransaction(t *testing.T) {
	tr := startTraced(t)
	_, produced := tr.caller(t, func(ctx context.Context) {
		txn, err := tr.client.BeginTxn(ctx, tr.v, 0)
		require.NoError(t, err)
		m, err := tr.client.Codec().New(messages.TypeInsert, tr.v, []byte("a"))
		require.NoError(t, err)
		_, err = txn.Append(ctx, m)
		require.NoError(t, err)
		_, err = txn.Commit(ctx)
		require.NoError(t, err)
	})
	txn := one(t, produced, oteltrace.SpanTxn)
	_, spans := tr.caller(t, func(ctx context.Context) {
		s, err := tr.client.Read(ctx, client.ReadOptions{VChannel: tr.v, Start: client.Earliest(), UntilNow: true})
		require.NoError(t, err)
		defer s.Close()
		for _, err := range s.All(ctx) {
			require.NoError(t, err)
		}
	})
	var consumed []tracetest.SpanStub
	for _, s := range named(spans, oteltrace.SpanDistConsume) {
		if typ, _ := attr(s, oteltrace.AttrMessageType); typ.AsString() == messages.TypeTxn.Name {
			consumed = append(consumed, s)
		}
	}
	require.Len(t, consumed, 1, "the transaction arrives as one Txn message")
	require.Len(t, consumed[0].Links, 1)
	require.Equal(t, txn.SpanContext.SpanID(), consumed[0].Links[0].SpanContext.SpanID(), "linked to its CommitTxn's context, the transaction's span")
}

// TestTraceOfASubscription: a message a durable subscription delivers is
// a wal.dist_consume span under the span of the call to Next, linked to
// the context its producer wrote into it.
func TestTraceOfASubscription(t *testing.T) {
	tr := startTraced(t)
	_, produced := tr.caller(t, func(ctx context.Context) {
		m, err := tr.client.Codec().New(messages.TypeInsert, tr.v, []byte("x"))
		require.NoError(t, err)
		_, err = tr.client.Append(ctx, m)
		require.NoError(t, err)
	})
	dist := one(t, produced, oteltrace.SpanDistAppend)
	reader, spans := tr.caller(t, func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		sub, err := tr.client.Subscribe(ctx, "traced", client.SubscribeVChannel(tr.v), client.SubscribeTypes(messages.TypeInsert))
		require.NoError(t, err)
		defer sub.Close()
		d, err := sub.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, messages.TypeInsert, d.Message.Type())
	})
	consumed := one(t, spans, oteltrace.SpanDistConsume)
	requireChild(t, reader, consumed)
	require.Len(t, consumed.Links, 1)
	require.Equal(t, dist.SpanContext.SpanID(), consumed.Links[0].SpanContext.SpanID(), "linked to the producer's context")
	require.Equal(t, dist.SpanContext.TraceID(), consumed.Links[0].SpanContext.TraceID())
}

// TestPropagationWithoutClientSpans: a client whose adapter traces
// nothing (New(nil)) still carries the caller's context in the messages
// it sends, and the node's wal.append is a child of the caller's span.
func TestPropagationWithoutClientSpans(t *testing.T) {
	tr := startTraced(t)
	c, err := client.Connect(tr.url, client.WithCluster("traces"), client.WithoutLocalBypass(), client.WithHooks(oteltrace.New(nil)))
	require.NoError(t, err)
	defer c.Close()
	root, spans := tr.caller(t, func(ctx context.Context) {
		m, err := c.Codec().New(messages.TypeInsert, tr.v, []byte("x"))
		require.NoError(t, err)
		_, err = c.Append(ctx, m)
		require.NoError(t, err)
	})
	require.Empty(t, named(spans, oteltrace.SpanAutocommit), "the client records no span")
	require.Empty(t, named(spans, oteltrace.SpanDistAppend))
	requireChild(t, root, one(t, spans, oteltrace.SpanAppend))
}

// TestAdaptersInOneList: two adapters in one client's hooks, each into
// its own provider, both trace a whole append, neither hiding the
// other's spans.
func TestAdaptersInOneList(t *testing.T) {
	tr := startTraced(t)
	other := tracetest.NewInMemoryExporter()
	otherTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(other))
	defer func() { _ = otherTP.Shutdown(context.Background()) }()
	c, err := client.Connect(tr.url, client.WithCluster("traces"), client.WithoutLocalBypass(),
		client.WithTracerProvider(tr.tp), client.WithTracerProvider(otherTP))
	require.NoError(t, err)
	defer c.Close()
	_, spans := tr.caller(t, func(ctx context.Context) {
		m, err := c.Codec().New(messages.TypeInsert, tr.v, []byte("x"))
		require.NoError(t, err)
		_, err = c.Append(ctx, m)
		require.NoError(t, err)
	})
	for _, got := range []tracetest.SpanStubs{spans, other.GetSpans()} {
		auto := one(t, got, oteltrace.SpanAutocommit)
		requireChild(t, auto.SpanContext, one(t, got, oteltrace.SpanDistAppend))
		require.False(t, auto.EndTime.IsZero(), "ended")
	}
}
