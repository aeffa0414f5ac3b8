package client

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
	"github.com/streamwal/streamwal/telemetry/oteltrace"
)

// traceAppend starts the spans of an append of msgs: wal.autocommit (the
// logical append, child of the caller's span) and wal.dist_append (the
// requests to the nodes) within it, whose context every message carries
// to its node (see newEntry). end ends both with the append's outcome.
func (c *Client) traceAppend(ctx context.Context, msgs []*messages.MutableMessage) (context.Context, func(error)) {
	ctx, logical := c.tracer.Start(ctx, oteltrace.SpanAutocommit, trace.WithAttributes(appendAttributes(msgs)...))
	ctx, dist := c.tracer.Start(ctx, oteltrace.SpanDistAppend, trace.WithSpanKind(trace.SpanKindClient))
	return ctx, func(err error) {
		endSpan(dist, err)
		endSpan(logical, err)
	}
}

// endSpan ends s, with err as its status when not nil.
func endSpan(s trace.Span, err error) {
	if err != nil {
		s.RecordError(err)
		s.SetStatus(codes.Error, err.Error())
	}
	s.End()
}

// appendAttributes describe an append: how many messages, and the type
// and VChannel of the first (the usual append has one of each).
func appendAttributes(msgs []*messages.MutableMessage) []attribute.KeyValue {
	kv := []attribute.KeyValue{attribute.Int("messages", len(msgs))}
	if len(msgs) > 0 && msgs[0] != nil {
		kv = append(kv, oteltrace.AttrMessageType.String(msgs[0].Type().String()))
		if v := msgs[0].VChannel(); !v.IsZero() {
			kv = append(kv, oteltrace.AttrMessageVChannel.String(v.String()))
		}
	}
	return kv
}

// broadcastAttributes describe a broadcast request: its type and target
// VChannels.
func broadcastAttributes(req BroadcastRequest) []attribute.KeyValue {
	vs := make([]string, len(req.VChannels))
	for i, v := range req.VChannels {
		vs[i] = v.String()
	}
	return []attribute.KeyValue{oteltrace.AttrMessageType.String(req.Type.String()), oteltrace.AttrBroadcastVChannel.StringSlice(vs)}
}

// traceConsume marks m as read with a wal.dist_consume span under ctx's,
// linked to the span context its producer wrote into it (an assembled
// transaction carries its CommitTxn's). Untraced types get none, and
// nothing is read from m unless the span records.
func traceConsume(ctx context.Context, tracer trace.Tracer, m *messages.ImmutableMessage) {
	if tracer == nil || !oteltrace.Traced(m.Type()) {
		return
	}
	_, span := tracer.Start(ctx, oteltrace.SpanDistConsume, trace.WithSpanKind(trace.SpanKindConsumer))
	defer span.End()
	if !span.IsRecording() {
		return
	}
	h := m.Header()
	span.SetAttributes(oteltrace.MessageAttributes(m.Type(), h)...)
	if sc := trace.SpanContextFromContext(oteltrace.Extract(context.Background(), h)); sc.IsValid() {
		span.AddLink(trace.Link{SpanContext: sc})
	}
}

// noteRequest reports an append request of n messages to the hooks.
func (c *Client) noteRequest(p streamwal.PChannel, n int, results []wire.AppendResult, err error, took time.Duration) {
	e := telemetry.ClientRequestEvent{PChannel: p, Messages: n, Code: streamwal.CodeOf(err), Latency: took}
	for _, r := range results {
		if r.Error != nil {
			e.Failed++
		}
	}
	c.opts.hooks.OnClientRequest(e)
}
