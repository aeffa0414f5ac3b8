package replicate_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
	"github.com/streamwal/streamwal/telemetry/endpoint"
	"github.com/streamwal/streamwal/telemetry/oteltrace"
)

// replicationEvents records the replication events of a node's
// replicators.
type replicationEvents struct {
	mu    sync.Mutex
	last  map[string]telemetry.ReplicationEvent
	count map[string]int
}

// OnReplication implements telemetry.ReplicationHook.
func (r *replicationEvents) OnReplication(e telemetry.ReplicationEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[e.PChannel.String()] = e
	r.count[e.PChannel.String()]++
}

// snapshot is the last event and the count of events, by PChannel.
func (r *replicationEvents) snapshot() (map[string]telemetry.ReplicationEvent, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	last, count := make(map[string]telemetry.ReplicationEvent, len(r.last)), make(map[string]int, len(r.count))
	for k, v := range r.last {
		last[k], count[k] = v, r.count[k]
	}
	return last, count
}

// lags scrapes streamwal_replication_lag_seconds from e, by PChannel.
func lags(t *testing.T, e *endpoint.Endpoint) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + e.Addr() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	out := map[string]float64{}
	f := fams["streamwal_replication_lag_seconds"]
	if f == nil {
		return out
	}
	require.Equal(t, dto.MetricType_GAUGE, f.GetType())
	for _, m := range f.GetMetric() {
		require.Len(t, m.GetLabel(), 1, "labelled by pchannel alone")
		require.Equal(t, "pchannel", m.GetLabel()[0].GetName())
		out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
	}
	return out
}

// waitLags scrapes e until the lags satisfy ok, and returns them; it
// fails after 30 s with the last.
func waitLags(t *testing.T, e *endpoint.Endpoint, what string, ok func(map[string]float64) bool) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l := lags(t, e)
		if ok(l) {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, l)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// every reports whether l has each PChannel of the secondary, each
// satisfying ok.
func every(l map[string]float64, ok func(float64) bool) bool {
	if len(l) != pchannels {
		return false
	}
	for _, v := range l {
		if !ok(v) {
			return false
		}
	}
	return true
}

// TestReplicationLagMetric: a secondary node's replicators report where
// replication stands through its hooks, and the metrics adapter exports
// it as streamwal_replication_lag_seconds by PChannel: small while the
// secondary is idle and caught up, growing (between two reports too)
// while the primary is unreachable, and gone once the node no longer
// replicates.
func TestReplicationLagMetric(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := endpoint.Start(endpoint.Options{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	defer e.Close()
	events := &replicationEvents{last: map[string]telemetry.ReplicationEvent{}, count: map[string]int{}}
	prim := startCluster(t, "prim")
	sec := startClusterWith(t, "sec", func(o *system.Options) { o.Node.Hooks = telemetry.Hooks{e.Metrics(), events} })
	require.Empty(t, lags(t, e), "no lag before the cluster is a secondary")

	topo := messages.Star(prim.member(ctx), sec.member(ctx))
	_, err = prim.c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)
	_, err = sec.c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)
	w := newWorkload(t, ctx, prim.c, 1, 2)
	w.write(t, ctx, "first", 2, 5)
	waitCopy(t, ctx, prim, sec)

	const small = 1.5 // seconds
	waitLags(t, e, "a small lag", func(l map[string]float64) bool { return every(l, func(v float64) bool { return v < small }) })
	last, _ := events.snapshot()
	require.Len(t, last, pchannels)
	for p, ev := range last {
		require.True(t, ev.Active, p)
		require.Equal(t, streamwal.Cluster("prim"), ev.Source, p)
		require.NotZero(t, ev.Through, p)
		require.GreaterOrEqual(t, ev.SourceTimeTick, ev.Through, p)
	}

	// The primary goes away: Through stops, the replicators go on
	// reporting it, and the lag read from it grows, from one scrape to
	// the next too.
	prim.sys.Server.Shutdown()
	grown := waitLags(t, e, "a growing lag", func(l map[string]float64) bool { return every(l, func(v float64) bool { return v > 2*small }) })
	before, counts := events.snapshot()
	waitLags(t, e, "a lag growing between scrapes", func(l map[string]float64) bool {
		for p, v := range l {
			if v <= grown[p] {
				return false
			}
		}
		return len(l) == pchannels
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		after, more := events.snapshot()
		reported := true
		for p := range before {
			reported = reported && more[p] > counts[p]
		}
		if reported {
			now := time.Now()
			l := lags(t, e)
			for p, ev := range after {
				require.True(t, ev.Active, p)
				require.Equal(t, before[p].Through, ev.Through, "%s: Through moved with the primary down", p)
				lag, ok := ev.Lag(now)
				require.True(t, ok, p)
				require.InDelta(t, l[p], lag.Seconds(), 1, "%s: the hook's lag and the gauge's agree", p)
			}
			break
		}
		require.False(t, time.Now().After(deadline), "the replicators stopped reporting while stuck: %v, then %v", counts, more)
		time.Sleep(50 * time.Millisecond)
	}

	// The secondary's node stops: its replicators stop, say so, and the
	// gauge is gone.
	for _, n := range sec.sys.Nodes() {
		sec.sys.StopNode(n.ID(), false)
	}
	require.Empty(t, lags(t, e), "a node that replicates nothing exports no lag")
	last, _ = events.snapshot()
	for p, ev := range last {
		require.False(t, ev.Active, "%s: the replicator's last event says it stopped", p)
		_, ok := ev.Lag(time.Now())
		require.False(t, ok, p)
	}
}

// spansIn are the spans named name of trace id.
func spansIn(spans tracetest.SpanStubs, id trace.TraceID, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.SpanContext.TraceID() == id && s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// attrOf is the value of s's attribute key.
func attrOf(s tracetest.SpanStub, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// TestReplicateSecondarySpans: the secondary's re-append of a traced
// message of the primary, and of a traced transaction (whole, as one
// unit), is a replicate.secondary span, child of the context the
// primary's message carries (the client's wal.dist_append, its wal.txn),
// with the message's attributes, the replica's TimeTick on the secondary
// and where it comes from; the secondary traces nothing that carries no
// context.
func TestReplicateSecondarySpans(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	prim := startCluster(t, "prim")
	sec := startClusterWith(t, "sec", func(o *system.Options) { o.TracerProvider = tp })
	topo := messages.Star(prim.member(ctx), sec.member(ctx))
	_, err := prim.c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)
	_, err = sec.c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)
	w := newWorkload(t, ctx, prim.c, 1, 1)
	w.write(t, ctx, "untraced", 1, 3) // no trace context: no span

	tc, err := client.Connect(prim.sys.Server.ClientURL(), client.WithCluster("prim"), client.WithTracerProvider(tp))
	require.NoError(t, err)
	defer func() { _ = tc.Close() }()
	v := w.vs[0]
	appendCtx, appendSpan := tp.Tracer("test").Start(ctx, "append")
	m, err := tc.Codec().New(messages.TypeInsert, v, []byte("traced"), messages.WithDML(1, 1))
	require.NoError(t, err)
	landed, err := tc.Append(appendCtx, m)
	require.NoError(t, err)
	appendSpan.End()
	txnCtx, txnSpan := tp.Tracer("test").Start(ctx, "txn")
	tw := &workload{c: tc, col: w.col, vs: w.vs}
	require.NoError(t, tw.txn(txnCtx, v, "traced", false))
	txnSpan.End()
	waitCopy(t, ctx, prim, sec)

	// The spans end once the append returns: wait for them.
	deadline := time.Now().Add(30 * time.Second)
	var ofAppend, ofTxn []tracetest.SpanStub
	for {
		spans := exp.GetSpans()
		ofAppend = spansIn(spans, appendSpan.SpanContext().TraceID(), oteltrace.SpanReplicateSecondary)
		ofTxn = spansIn(spans, txnSpan.SpanContext().TraceID(), oteltrace.SpanReplicateSecondary)
		if len(ofAppend) > 0 && len(ofTxn) > 0 {
			break
		}
		require.False(t, time.Now().After(deadline), "no replicate.secondary spans: %d, %d", len(ofAppend), len(ofTxn))
		time.Sleep(50 * time.Millisecond)
	}
	spans := exp.GetSpans()
	require.Len(t, ofAppend, 1, "one span per replicated message")
	require.Len(t, ofTxn, 1, "a transaction replicates as one unit")

	dist := spansIn(spans, appendSpan.SpanContext().TraceID(), oteltrace.SpanDistAppend)
	require.Len(t, dist, 1)
	s := ofAppend[0]
	require.Equal(t, dist[0].SpanContext.SpanID(), s.Parent.SpanID(), "child of the context the message carries")
	require.Equal(t, trace.SpanKindConsumer, s.SpanKind)
	require.Equal(t, codes.Unset, s.Status.Code)
	require.Equal(t, "Insert", attrOf(s, oteltrace.AttrMessageType).AsString())
	require.True(t, attrOf(s, oteltrace.AttrMessageReplicate).AsBool())
	require.Equal(t, "prim", attrOf(s, oteltrace.AttrReplicateSource).AsString())
	require.Equal(t, int64(landed[0].ID), attrOf(s, oteltrace.AttrReplicateSourceMessageID).AsInt64())
	require.Equal(t, int64(landed[0].TimeTick), attrOf(s, oteltrace.AttrReplicateSourceTimeTick).AsInt64())
	tt := attrOf(s, oteltrace.AttrMessageTimeTick).AsInt64()
	require.NotZero(t, tt, "the TimeTick it landed at on the secondary")
	require.NotEqual(t, int64(landed[0].TimeTick), tt, "the secondary assigns its own TimeTick")
	vc := attrOf(s, oteltrace.AttrMessageVChannel).AsString()
	require.NotEmpty(t, vc)

	txn := spansIn(spans, txnSpan.SpanContext().TraceID(), oteltrace.SpanTxn)
	require.Len(t, txn, 1)
	s = ofTxn[0]
	require.Equal(t, txn[0].SpanContext.SpanID(), s.Parent.SpanID(), "child of the transaction's context")
	require.Equal(t, messages.TypeTxn.String(), attrOf(s, oteltrace.AttrMessageType).AsString())
	require.True(t, attrOf(s, oteltrace.AttrMessageReplicate).AsBool())
	require.Equal(t, attrOf(txn[0], oteltrace.AttrTxnID).AsInt64(), attrOf(s, oteltrace.AttrTxnID).AsInt64())
	require.NotZero(t, attrOf(s, oteltrace.AttrTxnID).AsInt64())

	// Nothing untraced became a span of its own.
	for _, s := range spans {
		if s.Name == oteltrace.SpanReplicateSecondary {
			require.True(t, s.Parent.IsValid(), "a replicate.secondary span with no parent: %v", s.Attributes)
		}
	}
}
