package oteltrace_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
	"github.com/streamwal/streamwal/telemetry/oteltrace"
)

// replicaOf builds a message of cluster prim carrying traceparent (none
// when ""), as a replicator reads it, and its replica for cluster sec.
func replicaOf(t *testing.T, traceparent string) (*messages.ImmutableMessage, *messages.MutableMessage) {
	t.Helper()
	prim, err := messages.NewCodec("prim", nil)
	require.NoError(t, err)
	sec, err := messages.NewCodec("sec", prim.Registry())
	require.NoError(t, err)
	p, err := streamwal.NewPChannel("pchan", 1)
	require.NoError(t, err)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	var opts []messages.Option
	if traceparent != "" {
		opts = append(opts, messages.WithTrace(traceparent, ""))
	}
	m, err := prim.New(messages.TypeInsert, v, []byte("x"), opts...)
	require.NoError(t, err)
	m.SetTimeTick(messages.TimeTickAt(time.Now()))
	nm, err := prim.Encode(m)
	require.NoError(t, err)
	src, err := prim.Decode(nm, 7)
	require.NoError(t, err)
	rep, err := sec.NewReplicate(src, "prim", p)
	require.NoError(t, err)
	return src, rep
}

// TestReplicateSecondaryOutcomes: a re-append whose source carries a
// sampled context is a replicate.secondary span, child of it; a
// duplicate ends it without error (marked replicate.duplicate), a
// failure with one; a source without a context, or with an unsampled
// one, gets no span and keeps the context given.
func TestReplicateSecondaryOutcomes(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	h := oteltrace.New(tp)
	hooks := telemetry.Hooks{h}
	p, err := streamwal.NewPChannel("pchan", 1)
	require.NoError(t, err)
	_, parent := tp.Tracer("test").Start(context.Background(), "producer")
	parent.End()
	sc := parent.SpanContext()
	sampled := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"

	failed := streamwal.Errorf(streamwal.CodeUnavailable, "gone")
	for _, c := range []struct {
		name string
		err  error
		want codes.Code
		dup  bool
	}{
		{"landed", nil, codes.Unset, false},
		{"duplicate", streamwal.ErrDuplicate, codes.Unset, true},
		{"failed", failed, codes.Error, false},
	} {
		exp.Reset()
		src, rep := replicaOf(t, sampled)
		bg := context.Background()
		ctx := hooks.OnReplicateAppendStart(bg, telemetry.ReplicateAppendEvent{PChannel: p, Source: "prim", Message: src, Replicas: []*messages.MutableMessage{rep}})
		require.NotEqual(t, bg, ctx, c.name)
		hooks.OnReplicateAppendEnd(ctx, telemetry.ReplicateAppendEndEvent{Err: c.err})
		spans := exp.GetSpans()
		require.Len(t, spans, 1, c.name)
		s := spans[0]
		require.Equal(t, oteltrace.SpanReplicateSecondary, s.Name)
		require.Equal(t, sc.TraceID(), s.SpanContext.TraceID(), c.name)
		require.Equal(t, sc.SpanID(), s.Parent.SpanID(), c.name)
		require.Equal(t, c.want, s.Status.Code, c.name)
		dup, _ := attr(s, oteltrace.AttrReplicateDuplicate)
		require.Equal(t, c.dup, dup.AsBool(), c.name)
		rv, ok := attr(s, oteltrace.AttrMessageReplicate)
		require.True(t, ok)
		require.True(t, rv.AsBool(), c.name)
		id, _ := attr(s, oteltrace.AttrReplicateSourceMessageID)
		require.Equal(t, int64(7), id.AsInt64(), c.name)
	}

	for name, tp := range map[string]string{"no context": "", "unsampled": "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-00"} {
		exp.Reset()
		src, rep := replicaOf(t, tp)
		bg := context.Background()
		ctx := hooks.OnReplicateAppendStart(bg, telemetry.ReplicateAppendEvent{PChannel: p, Source: "prim", Message: src, Replicas: []*messages.MutableMessage{rep}})
		require.Equal(t, bg, ctx, name)
		hooks.OnReplicateAppendEnd(ctx, telemetry.ReplicateAppendEndEvent{})
		require.Empty(t, exp.GetSpans(), name)
	}
}
