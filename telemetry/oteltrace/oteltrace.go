// Package oteltrace is the OpenTelemetry tracing adapter on the telemetry
// hooks (DESIGN.md §8): Hook turns the events of the client, the node and
// the coordinator into spans, and carries their context through WAL
// messages in the W3C traceparent and tracestate headers, written and
// read through the standard TraceContext propagator. The package also
// names the spans and attributes. It depends on the OpenTelemetry API
// only; the application chooses the SDK and exporter, and the components
// know only the hooks (cmd/ and embedded/system wire the adapter).
//
// Messages of types flagged messages.FlagNotTraced (TimeTick among them)
// never carry a trace context and never get a span.
package oteltrace

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"

	"github.com/streamwal/streamwal/messages"
)

// Span names (DESIGN.md §8).
const (
	// SpanAutocommit is a client's append of ordinary messages.
	SpanAutocommit = "wal.autocommit"
	// SpanTxn is a whole transaction, from its begin to its commit or
	// rollback.
	SpanTxn = "wal.txn"
	// SpanBroadcast is a broadcast task.
	SpanBroadcast = "wal.broadcast"
	// SpanDistAppend is the client's request to the remote node.
	SpanDistAppend = "wal.dist_append"
	// SpanAppend is one message's append at the node.
	SpanAppend = "wal.append"
	// SpanAppendImpl is the node's write of the message to JetStream.
	SpanAppendImpl = "wal.appendimpl"
	// SpanBroadcastCallback is a broadcast's callback.
	SpanBroadcastCallback = "wal.bc_callback"
	// SpanConsume marks a message read locally, linked to its producer's
	// context.
	SpanConsume = "wal.consume"
	// SpanDistConsume marks a message a remote reader (a client's Scanner)
	// read, linked to its producer's context.
	SpanDistConsume = "wal.dist_consume"
	// SpanReplicateSecondary is a secondary's re-append of a message (or
	// a whole transaction) of its primary, child of the context the
	// primary's message carries.
	SpanReplicateSecondary = "replicate.secondary"
)

// Attribute keys (DESIGN.md §8).
const (
	// AttrMessageType is the message's type name.
	AttrMessageType = attribute.Key("message.type")
	// AttrMessageVChannel is the message's VChannel.
	AttrMessageVChannel = attribute.Key("message.vchannel")
	// AttrMessageTimeTick is the TimeTick the WAL assigned.
	AttrMessageTimeTick = attribute.Key("message.timetick")
	// AttrMessageReplicate says whether the message was replicated from
	// another cluster.
	AttrMessageReplicate = attribute.Key("message.replicate")
	// AttrTxnID is the message's transaction ID.
	AttrTxnID = attribute.Key("txn.id")
	// AttrBroadcastID is the broadcast's ID.
	AttrBroadcastID = attribute.Key("broadcast.id")
	// AttrBroadcastVChannel lists the broadcast's target VChannels.
	AttrBroadcastVChannel = attribute.Key("broadcast.vchannels")
	// AttrReplicateSource is the cluster a replica comes from.
	AttrReplicateSource = attribute.Key("replicate.source")
	// AttrReplicateSourceMessageID and AttrReplicateSourceTimeTick are the
	// MessageID and TimeTick of the replicated message in its source's
	// log.
	AttrReplicateSourceMessageID = attribute.Key("replicate.source.message_id")
	AttrReplicateSourceTimeTick  = attribute.Key("replicate.source.timetick")
	// AttrReplicateDuplicate says that the secondary held the replica
	// already (a replicator that started again re-appended it).
	AttrReplicateDuplicate = attribute.Key("replicate.duplicate")
)

// Propagator is the W3C TraceContext propagator the messages' headers
// follow.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// headerCarrier is a TextMapCarrier on message headers, with the exact
// (lower-case) W3C keys that messages.Codec reads.
type headerCarrier map[string][]string

// Get implements propagation.TextMapCarrier.
func (c headerCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set implements propagation.TextMapCarrier.
func (c headerCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys implements propagation.TextMapCarrier.
func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes the span context of ctx into the headers of an encoded
// message of type t (a nats.Header), unless t is never traced, ctx has no
// valid span context, or the message carries a trace context already
// (the application's own wins).
func Inject(ctx context.Context, t *messages.Type, header map[string][]string) {
	if header == nil || t == nil || t.Is(messages.FlagNotTraced) {
		return
	}
	if _, ok := header[messages.HdrTraceParent]; ok {
		return
	}
	Propagator.Inject(ctx, headerCarrier(header))
}

// Extract returns ctx with the remote span context a message's header
// carries (ctx unchanged when it carries none).
func Extract(ctx context.Context, h messages.Header) context.Context {
	if h.TraceParent == "" {
		return ctx
	}
	c := headerCarrier{messages.HdrTraceParent: {h.TraceParent}}
	if h.TraceState != "" {
		c[messages.HdrTraceState] = []string{h.TraceState}
	}
	return Propagator.Extract(ctx, c)
}

// ExtractHeader returns ctx with the remote span context an encoded
// message's headers (a nats.Header) carry.
func ExtractHeader(ctx context.Context, header map[string][]string) context.Context {
	if _, ok := header[messages.HdrTraceParent]; !ok {
		return ctx
	}
	return Propagator.Extract(ctx, headerCarrier(header))
}

// Traced reports whether messages of type t are traced.
func Traced(t *messages.Type) bool { return t != nil && !t.Is(messages.FlagNotTraced) }

// MessageAttributes are the attributes of a span of one message: its
// type, VChannel (when it has one), TimeTick (once assigned), whether it
// was replicated, and its transaction's ID.
func MessageAttributes(t *messages.Type, h messages.Header) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 5)
	kv = append(kv, AttrMessageType.String(t.String()))
	if !h.VChannel.IsZero() {
		kv = append(kv, AttrMessageVChannel.String(h.VChannel.String()))
	}
	if h.TimeTick != 0 {
		kv = append(kv, AttrMessageTimeTick.Int64(int64(h.TimeTick)))
	}
	kv = append(kv, AttrMessageReplicate.Bool(h.Replicate != nil))
	if h.Txn != nil {
		kv = append(kv, AttrTxnID.Int64(int64(h.Txn.ID)))
	}
	return kv
}
