package oteltrace

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
)

// The instrumentation scopes of the spans, by the component that reports
// them.
const (
	scopeClient = "github.com/streamwal/streamwal/client"
	scopeNode   = "github.com/streamwal/streamwal/services/node"
	scopeCoord  = "github.com/streamwal/streamwal/services/coord"
)

// Hook is the OpenTelemetry adapter on the telemetry hooks: put it in a
// component's hooks (client.WithHooks, node.Config.Hooks,
// coord.Config.Hooks) and the component's work becomes spans of the
// tracer provider it was made with, their context carried from the
// client to the node and the coordinator in the messages' headers:
//
//   - a client's Append: wal.autocommit, and wal.dist_append within it,
//     whose context every message of the call carries;
//   - a client's transaction: wal.txn, from BeginTxn to its end, whose
//     context every message of the transaction carries;
//   - a client's Broadcast: wal.broadcast, whose context the broadcast's
//     replicas carry;
//   - a node's append of a message that carries a sampled context:
//     wal.append, child of that context, and wal.appendimpl (the write to
//     JetStream) within it; one that does not gets no span, as the
//     default parent-based sampler would decide, without the cost of
//     asking it;
//   - a coordinator's broadcast callback: wal.bc_callback, child of the
//     broadcast's context;
//   - a secondary's replicator re-appending a message of the primary (or
//     a whole transaction) whose headers carry a sampled context:
//     replicate.secondary, child of that context (the trace of the
//     write on the primary), with the message's attributes
//     (message.replicate true) and its source; the replica carries the
//     source's context on, for the secondary's readers to link to;
//   - each message read: wal.dist_consume (or wal.consume for a reader
//     in the process of the WAL) under the reader's context, linked to
//     the context its producer wrote into it.
//
// Messages of types flagged messages.FlagNotTraced carry no context and
// get no span. A Hook is safe for concurrent use.
type Hook struct {
	client, node, coord trace.Tracer
}

// New returns the adapter that traces into tp. With a nil tp it traces
// nothing but still carries the caller's trace context into the messages
// a client sends, for the nodes to continue.
func New(tp trace.TracerProvider) *Hook {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return &Hook{client: tp.Tracer(scopeClient), node: tp.Tracer(scopeNode), coord: tp.Tracer(scopeCoord)}
}

// The hook interfaces the adapter implements.
var (
	_ telemetry.InjectHook            = (*Hook)(nil)
	_ telemetry.AppendCallHook        = (*Hook)(nil)
	_ telemetry.TxnHook               = (*Hook)(nil)
	_ telemetry.BroadcastCallHook     = (*Hook)(nil)
	_ telemetry.ConsumeHook           = (*Hook)(nil)
	_ telemetry.MessageAppendHook     = (*Hook)(nil)
	_ telemetry.BroadcastCallbackHook = (*Hook)(nil)
	_ telemetry.ReplicateAppendHook   = (*Hook)(nil)
)

// spanKey is the context key under which a Hook keeps the spans of a
// piece of work, of one kind: its own, so that another hook's spans in
// the same context do not hide them.
type spanKey struct {
	h    *Hook
	kind spanKind
}

// spanKind tells apart the works a Hook keeps spans of.
type spanKind uint8

// The works a Hook keeps spans of.
const (
	kindAppendCall spanKind = iota
	kindTxn
	kindBroadcastCall
	kindMessageAppend
	kindCallback
	kindReplicate
)

// spanPair is an outer span and the inner one within it.
type spanPair struct{ outer, inner trace.Span }

// with returns ctx keeping v under k's kind.
func (h *Hook) with(ctx context.Context, kind spanKind, v any) context.Context {
	return context.WithValue(ctx, spanKey{h: h, kind: kind}, v)
}

// span returns the span h keeps in ctx under kind, if any.
func (h *Hook) span(ctx context.Context, kind spanKind) (trace.Span, bool) {
	s, ok := ctx.Value(spanKey{h: h, kind: kind}).(trace.Span)
	return s, ok
}

// pair returns the spans h keeps in ctx under kind, if any.
func (h *Hook) pair(ctx context.Context, kind spanKind) (*spanPair, bool) {
	p, ok := ctx.Value(spanKey{h: h, kind: kind}).(*spanPair)
	return p, ok
}

// OnInject writes ctx's span context into the headers of a message of
// type t about to be sent (see Inject).
func (h *Hook) OnInject(ctx context.Context, t *messages.Type, header map[string][]string) {
	Inject(ctx, t, header)
}

// OnAppendCallStart starts wal.autocommit, child of ctx's span, and
// wal.dist_append within it, whose context the call's messages carry.
func (h *Hook) OnAppendCallStart(ctx context.Context, e telemetry.AppendCallEvent) context.Context {
	ctx, logical := h.client.Start(ctx, SpanAutocommit)
	if logical.IsRecording() {
		logical.SetAttributes(appendAttributes(e.Messages)...)
	}
	ctx, dist := h.client.Start(ctx, SpanDistAppend, trace.WithSpanKind(trace.SpanKindClient))
	return h.with(ctx, kindAppendCall, &spanPair{outer: logical, inner: dist})
}

// OnAppendCallEnd ends the call's spans with its outcome.
func (h *Hook) OnAppendCallEnd(ctx context.Context, err error) {
	if p, ok := h.pair(ctx, kindAppendCall); ok {
		endSpan(p.inner, err)
		endSpan(p.outer, err)
	}
}

// OnTxnStart starts wal.txn, child of ctx's span.
func (h *Hook) OnTxnStart(ctx context.Context, e telemetry.TxnStartEvent) context.Context {
	ctx, span := h.client.Start(ctx, SpanTxn, trace.WithAttributes(AttrMessageVChannel.String(e.VChannel.String())))
	return h.with(ctx, kindTxn, span)
}

// OnTxnAppend sends a message of the transaction under its wal.txn span,
// with ctx's deadline.
func (h *Hook) OnTxnAppend(ctx, txn context.Context) context.Context {
	if span, ok := h.span(txn, kindTxn); ok {
		return trace.ContextWithSpan(ctx, span)
	}
	return ctx
}

// OnTxnEnd ends wal.txn, with the transaction's ID and outcome.
func (h *Hook) OnTxnEnd(txn context.Context, e telemetry.TxnEndEvent) {
	span, ok := h.span(txn, kindTxn)
	if !ok {
		return
	}
	if e.ID != 0 {
		span.SetAttributes(AttrTxnID.Int64(int64(e.ID)))
	}
	endSpan(span, e.Err)
}

// OnBroadcastCallStart starts wal.broadcast, child of ctx's span, with
// the broadcast's type and VChannels.
func (h *Hook) OnBroadcastCallStart(ctx context.Context, e telemetry.BroadcastCallEvent) context.Context {
	ctx, span := h.client.Start(ctx, SpanBroadcast, trace.WithAttributes(broadcastAttributes(e)...))
	return h.with(ctx, kindBroadcastCall, span)
}

// OnBroadcastCallEnd ends wal.broadcast, with the broadcast's ID.
func (h *Hook) OnBroadcastCallEnd(ctx context.Context, e telemetry.BroadcastCallEndEvent) {
	span, ok := h.span(ctx, kindBroadcastCall)
	if !ok {
		return
	}
	if e.ID != 0 {
		span.SetAttributes(AttrBroadcastID.Int64(int64(e.ID)))
	}
	endSpan(span, e.Err)
}

// OnConsume marks a message read with a wal.dist_consume (or
// wal.consume) span under ctx's, linked to the span context its producer
// wrote into it (an assembled transaction carries its CommitTxn's).
// Untraced types get none, and nothing is read from the message unless
// the span records.
func (h *Hook) OnConsume(ctx context.Context, e telemetry.ConsumeEvent) {
	m := e.Message
	if m == nil || !Traced(m.Type()) {
		return
	}
	name := SpanConsume
	if e.Remote {
		name = SpanDistConsume
	}
	_, span := h.client.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer))
	defer span.End()
	if !span.IsRecording() {
		return
	}
	hd := m.Header()
	span.SetAttributes(MessageAttributes(m.Type(), hd)...)
	if sc := trace.SpanContextFromContext(Extract(context.Background(), hd)); sc.IsValid() {
		span.AddLink(trace.Link{SpanContext: sc})
	}
}

// OnMessageAppendStart starts, for a message whose headers carry a
// sampled context, a wal.append span child of that context and a
// wal.appendimpl span (the write to JetStream) within it; a message
// without one keeps ctx.
func (h *Hook) OnMessageAppendStart(ctx context.Context, e telemetry.MessageAppendEvent) context.Context {
	if _, ok := e.Header[messages.HdrTraceParent]; !ok || e.Message == nil || !Traced(e.Message.Type()) {
		return ctx
	}
	parent := ExtractHeader(ctx, e.Header)
	if !trace.SpanContextFromContext(parent).IsSampled() {
		return ctx
	}
	parent, s := h.node.Start(parent, SpanAppend, trace.WithSpanKind(trace.SpanKindServer))
	if s.IsRecording() {
		s.SetAttributes(MessageAttributes(e.Message.Type(), e.Message.Header())...)
	}
	parent, impl := h.node.Start(parent, SpanAppendImpl, trace.WithSpanKind(trace.SpanKindClient))
	return h.with(parent, kindMessageAppend, &spanPair{outer: s, inner: impl})
}

// OnMessageAppendEnd ends the message's spans with its outcome: its
// TimeTick, or its error.
func (h *Hook) OnMessageAppendEnd(ctx context.Context, e telemetry.MessageAppendEndEvent) {
	p, ok := h.pair(ctx, kindMessageAppend)
	if !ok {
		return
	}
	if e.Err == nil && e.Message != nil {
		tt := AttrMessageTimeTick.Int64(int64(e.Message.TimeTick()))
		p.inner.SetAttributes(tt)
		p.outer.SetAttributes(tt)
	}
	endSpan(p.inner, e.Err)
	endSpan(p.outer, e.Err)
}

// OnBroadcastCallbackStart starts wal.bc_callback, child of the context
// the broadcast's caller gave it, with the broadcast's ID and type.
func (h *Hook) OnBroadcastCallbackStart(ctx context.Context, e telemetry.BroadcastCallbackEvent) context.Context {
	parent := Extract(ctx, messages.Header{TraceParent: e.TraceParent, TraceState: e.TraceState})
	ctx, span := h.coord.Start(parent, SpanBroadcastCallback,
		trace.WithAttributes(AttrBroadcastID.Int64(int64(e.ID)), AttrMessageType.String(e.Type)))
	return h.with(ctx, kindCallback, span)
}

// OnBroadcastCallbackEnd ends wal.bc_callback, with the errors of the
// attempts that failed and its outcome.
func (h *Hook) OnBroadcastCallbackEnd(ctx context.Context, e telemetry.BroadcastCallbackEndEvent) {
	span, ok := h.span(ctx, kindCallback)
	if !ok {
		return
	}
	for _, err := range e.Failures {
		span.RecordError(err)
	}
	if e.Err != nil {
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End()
}

// OnReplicateAppendStart starts, for a unit whose source message carries
// a sampled trace context, a replicate.secondary span child of that
// context, with the attributes of the unit's last replica (its
// CommitTxn for a transaction) under the source message's type, and the
// source cluster, MessageID and TimeTick; a unit without one keeps ctx.
func (h *Hook) OnReplicateAppendStart(ctx context.Context, e telemetry.ReplicateAppendEvent) context.Context {
	m := e.Message
	if m == nil || len(e.Replicas) == 0 || !Traced(m.Type()) {
		return ctx
	}
	hd := m.Header()
	if hd.TraceParent == "" {
		return ctx
	}
	parent := Extract(ctx, hd)
	if !trace.SpanContextFromContext(parent).IsSampled() {
		return ctx
	}
	ctx, s := h.node.Start(parent, SpanReplicateSecondary, trace.WithSpanKind(trace.SpanKindConsumer))
	if s.IsRecording() {
		s.SetAttributes(MessageAttributes(m.Type(), e.Replicas[len(e.Replicas)-1].Header())...)
		s.SetAttributes(AttrReplicateSource.String(string(e.Source)),
			AttrReplicateSourceMessageID.Int64(int64(m.ID())), AttrReplicateSourceTimeTick.Int64(int64(m.TimeTick())))
	}
	return h.with(ctx, kindReplicate, s)
}

// OnReplicateAppendEnd ends replicate.secondary with the unit's outcome:
// the TimeTick it landed at on the secondary, a duplicate (the secondary
// held it already: no error), or the error.
func (h *Hook) OnReplicateAppendEnd(ctx context.Context, e telemetry.ReplicateAppendEndEvent) {
	s, ok := h.span(ctx, kindReplicate)
	if !ok {
		return
	}
	switch {
	case errors.Is(e.Err, streamwal.ErrDuplicate):
		s.SetAttributes(AttrReplicateDuplicate.Bool(true))
		s.End()
		return
	case e.Err == nil && len(e.Messages) > 0:
		s.SetAttributes(AttrMessageTimeTick.Int64(int64(e.Messages[len(e.Messages)-1].TimeTick())))
	}
	endSpan(s, e.Err)
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
		kv = append(kv, AttrMessageType.String(msgs[0].Type().String()))
		if v := msgs[0].VChannel(); !v.IsZero() {
			kv = append(kv, AttrMessageVChannel.String(v.String()))
		}
	}
	return kv
}

// broadcastAttributes describe a broadcast request: its type and target
// VChannels.
func broadcastAttributes(e telemetry.BroadcastCallEvent) []attribute.KeyValue {
	vs := make([]string, len(e.VChannels))
	for i, v := range e.VChannels {
		vs[i] = v.String()
	}
	kv := make([]attribute.KeyValue, 0, 2)
	if e.Type != nil {
		kv = append(kv, AttrMessageType.String(e.Type.String()))
	}
	return append(kv, AttrBroadcastVChannel.StringSlice(vs))
}
