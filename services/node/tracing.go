package node

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry/oteltrace"
)

// tracerName is the instrumentation scope of the node's spans.
const tracerName = "github.com/streamwal/streamwal/services/node"

// messageSpans are the spans of one message's append at the node.
type messageSpans struct {
	append, impl trace.Span
}

// appendTrace holds the spans of an append request's traced messages, by
// their index in the request's decoded messages.
type appendTrace struct {
	spans []messageSpans
}

// traceAppend starts, for each message of msgs (decoded from the
// request's messages wms, msgs[i] from wms[index[i]]) whose context is
// sampled, a wal.append
// span child of that context and a wal.appendimpl span (the write to
// JetStream) child of it; nil when the node traces nothing. A message
// whose context is not sampled gets no span, as the default parent-based
// sampler would decide, without the cost of asking it.
func (n *Node) traceAppend(msgs []*messages.MutableMessage, wms []wire.Message, index []int) *appendTrace {
	if n.cfg.TracerProvider == nil {
		return nil
	}
	var t *appendTrace
	var tracer trace.Tracer
	for i, m := range msgs {
		header := wms[index[i]].Header
		if _, ok := header[messages.HdrTraceParent]; !ok || !oteltrace.Traced(m.Type()) {
			continue
		}
		ctx := oteltrace.ExtractHeader(context.Background(), header)
		if !trace.SpanContextFromContext(ctx).IsSampled() {
			continue
		}
		if t == nil {
			t = &appendTrace{spans: make([]messageSpans, len(msgs))}
			tracer = n.cfg.TracerProvider.Tracer(tracerName)
		}
		ctx, s := tracer.Start(ctx, oteltrace.SpanAppend, trace.WithSpanKind(trace.SpanKindServer))
		if s.IsRecording() {
			s.SetAttributes(oteltrace.MessageAttributes(m.Type(), m.Header())...)
		}
		_, impl := tracer.Start(ctx, oteltrace.SpanAppendImpl, trace.WithSpanKind(trace.SpanKindClient))
		t.spans[i] = messageSpans{append: s, impl: impl}
	}
	return t
}

// end ends the spans with each message's outcome: its TimeTick, or its
// error.
func (t *appendTrace) end(out []*messages.ImmutableMessage, errs []error) {
	if t == nil {
		return
	}
	for i, s := range t.spans {
		if s.append == nil {
			continue
		}
		if err := errs[i]; err != nil {
			for _, sp := range []trace.Span{s.impl, s.append} {
				sp.RecordError(err)
				sp.SetStatus(codes.Error, err.Error())
			}
		} else if m := out[i]; m != nil {
			tt := oteltrace.AttrMessageTimeTick.Int64(int64(m.TimeTick()))
			s.impl.SetAttributes(tt)
			s.append.SetAttributes(tt)
		}
		s.impl.End()
		s.append.End()
	}
}
