package telemetry

import (
	"context"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// The hooks of this file follow a piece of work through a context, as
// franz-go's kgo hooks follow a record: a hook told that work starts gets
// the context it runs under and returns the context to use instead (its
// own, carrying what it needs, such as a span), and is told of the end
// with that context. A hook that keeps nothing returns the context it
// got. In a Hooks list each hook gets the context the one before it
// returned, and every hook gets the last one at the end, so a hook keeps
// its state under a context key of its own. Package telemetry/oteltrace
// implements them all with OpenTelemetry spans and the W3C trace context
// carried in message headers.

// InjectHook writes what travels with a message into its headers: a
// trace context.
type InjectHook interface {
	// OnInject is called with each message a client is about to send,
	// encoded (header is its nats.Header), under the context it is sent
	// in, and with the headers a broadcast request carries (the
	// broadcast's type, a header of its own). The client's own goroutine
	// calls it, once per message (retries included).
	OnInject(ctx context.Context, t *messages.Type, header map[string][]string)
}

// AppendCallEvent is a client's Append call.
type AppendCallEvent struct {
	// Messages are the call's messages, not to be changed.
	Messages []*messages.MutableMessage
}

// AppendCallHook follows a client's Append calls (not a transaction's
// messages: TxnHook follows those).
type AppendCallHook interface {
	// OnAppendCallStart is called as the call starts; the call's
	// messages are sent under the context returned.
	OnAppendCallStart(ctx context.Context, e AppendCallEvent) context.Context
	// OnAppendCallEnd is called when the call returns, with its error.
	OnAppendCallEnd(ctx context.Context, err error)
}

// TxnStartEvent is a client's BeginTxn.
type TxnStartEvent struct {
	// VChannel is the transaction's VChannel.
	VChannel streamwal.VChannel
}

// TxnEndEvent is the end of a client's transaction: committed, rolled
// back, or refused at its begin.
type TxnEndEvent struct {
	// ID is the transaction's ID (0 when its BeginTxn failed).
	ID messages.TxnID
	// Err is why it failed; nil when its CommitTxn or RollbackTxn landed.
	Err error
}

// TxnHook follows a client's transactions, from BeginTxn to the end.
type TxnHook interface {
	// OnTxnStart is called by BeginTxn; the context returned is the
	// transaction's, which the client keeps until the transaction ends
	// (its deadline is BeginTxn's, so only its values matter after).
	OnTxnStart(ctx context.Context, e TxnStartEvent) context.Context
	// OnTxnAppend is called for each message of the transaction
	// (BeginTxn, bodies, CommitTxn or RollbackTxn) with the context of
	// the call that appends it and the transaction's context; the
	// message is sent under the context returned.
	OnTxnAppend(ctx, txn context.Context) context.Context
	// OnTxnEnd is called once, with the transaction's context.
	OnTxnEnd(txn context.Context, e TxnEndEvent)
}

// BroadcastCallEvent is a client's Broadcast call.
type BroadcastCallEvent struct {
	// Type is the broadcast message's type (nil: the call is refused).
	Type *messages.Type
	// VChannels are the VChannels the caller named.
	VChannels []streamwal.VChannel
}

// BroadcastCallEndEvent is the outcome of a client's Broadcast call.
type BroadcastCallEndEvent struct {
	// ID is the broadcast's ID (0 when it failed).
	ID uint64
	// Err is why it failed; nil when done.
	Err error
}

// BroadcastCallHook follows a client's Broadcast calls.
type BroadcastCallHook interface {
	// OnBroadcastCallStart is called as the call starts; the request is
	// sent (its headers injected, see InjectHook) under the context
	// returned.
	OnBroadcastCallStart(ctx context.Context, e BroadcastCallEvent) context.Context
	// OnBroadcastCallEnd is called when the call returns.
	OnBroadcastCallEnd(ctx context.Context, e BroadcastCallEndEvent)
}

// ConsumeEvent is a message handed to a reader.
type ConsumeEvent struct {
	// Message is the message, not to be changed (a transaction arrives
	// assembled, carrying its CommitTxn's headers).
	Message *messages.ImmutableMessage
	// Remote says that the reader is not in the process that owns the
	// message's WAL (a client's Scanner or Subscription reads JetStream
	// itself): wal.dist_consume rather than wal.consume.
	Remote bool
}

// ConsumeHook is told of each message delivered to a reader.
type ConsumeHook interface {
	// OnConsume is called on the reader's goroutine, under the context
	// of the call that reads (Next), before the message is returned.
	OnConsume(ctx context.Context, e ConsumeEvent)
}

// MessageAppendEvent is one message of an append request a node serves.
type MessageAppendEvent struct {
	// PChannel is the PChannel appended to.
	PChannel streamwal.PChannel
	// Message is the decoded message, not to be changed.
	Message *messages.MutableMessage
	// Header is the message's encoded headers as the request carried
	// them (a nats.Header, with the W3C trace context the client
	// injected), not to be changed.
	Header map[string][]string
}

// MessageAppendEndEvent is the outcome of a message's append at a node.
type MessageAppendEndEvent struct {
	// Message is the message as it landed (its TimeTick, MessageID);
	// nil when it failed.
	Message *messages.ImmutableMessage
	// Err is why it failed.
	Err error
}

// MessageAppendHook follows each message of the append requests a node
// serves, from its decoding to its outcome. The node calls it for
// messages of every type: a hook leaves alone those it does not follow
// (TimeTicks are never traced).
type MessageAppendHook interface {
	// OnMessageAppendStart is called before the request's messages are
	// appended, with a context of the node's; the context returned is
	// the message's, given back at the end.
	OnMessageAppendStart(ctx context.Context, e MessageAppendEvent) context.Context
	// OnMessageAppendEnd is called once the request's messages resolved.
	OnMessageAppendEnd(ctx context.Context, e MessageAppendEndEvent)
}

// BroadcastCallbackEvent is a coordinator's run of a broadcast's
// callback (a dropped collection's release, ...).
type BroadcastCallbackEvent struct {
	// ID is the broadcast's ID, Type its type's name.
	ID   uint64
	Type string
	// TraceParent and TraceState are the W3C trace context the caller of
	// the broadcast gave it ("" when none).
	TraceParent, TraceState string
}

// MaxCallbackFailures bounds BroadcastCallbackEndEvent.Failures.
const MaxCallbackFailures = 16

// BroadcastCallbackEndEvent is the outcome of a broadcast's callback.
type BroadcastCallbackEndEvent struct {
	// Failures are the errors of the attempts that failed, in order, the
	// first MaxCallbackFailures of them (the callback is retried until it
	// succeeds).
	Failures []error
	// Err is why the callback did not succeed (the coordinator stopped);
	// nil when it did.
	Err error
}

// BroadcastCallbackHook follows the callbacks of broadcasts.
type BroadcastCallbackHook interface {
	// OnBroadcastCallbackStart is called before the callback's first
	// attempt, with the coordinator's context; the callback runs under
	// the context returned.
	OnBroadcastCallbackStart(ctx context.Context, e BroadcastCallbackEvent) context.Context
	// OnBroadcastCallbackEnd is called once the callback succeeded or
	// the coordinator gave up on it.
	OnBroadcastCallbackEnd(ctx context.Context, e BroadcastCallbackEndEvent)
}

// ReplicateAppendEvent is a unit a secondary's replicator re-appends
// into its WAL: one message of the primary, or a whole transaction.
type ReplicateAppendEvent struct {
	// PChannel is the secondary's PChannel appended to.
	PChannel streamwal.PChannel
	// Source is the primary cluster the unit comes from.
	Source streamwal.Cluster
	// Message is the primary's message as read, not to be changed (a
	// transaction arrives assembled, carrying its CommitTxn's headers and
	// with them the trace context its producer wrote).
	Message *messages.ImmutableMessage
	// Replicas are the messages re-appended, with their replicate
	// headers, not to be changed.
	Replicas []*messages.MutableMessage
}

// ReplicateAppendEndEvent is the outcome of a replicated unit's
// re-append.
type ReplicateAppendEndEvent struct {
	// Messages are the replicas as they landed (their TimeTicks on the
	// secondary); nil when the unit did not land.
	Messages []*messages.ImmutableMessage
	// Err is why it did not land: streamwal.ErrDuplicate when the
	// secondary held it already (which the replicator takes as done).
	Err error
}

// ReplicateAppendHook follows each unit a secondary's replicator
// re-appends, from before its append to its outcome.
type ReplicateAppendHook interface {
	// OnReplicateAppendStart is called before the unit is appended, with
	// a context of the replicator's; the context returned is the unit's,
	// given back at the end.
	OnReplicateAppendStart(ctx context.Context, e ReplicateAppendEvent) context.Context
	// OnReplicateAppendEnd is called once the unit's append resolved.
	OnReplicateAppendEnd(ctx context.Context, e ReplicateAppendEndEvent)
}

// Has reports whether h implements T, or is a Hooks one of whose hooks
// (at any depth) does: a component asks once, at its start, so that it
// skips the work of events nobody follows.
func Has[T any](h Hook) bool {
	if hs, ok := h.(Hooks); ok {
		for _, x := range hs {
			if Has[T](x) {
				return true
			}
		}
		return false
	}
	_, ok := h.(T)
	return ok
}

// OnInject implements InjectHook.
func (hs Hooks) OnInject(ctx context.Context, t *messages.Type, header map[string][]string) {
	for _, h := range hs {
		if x, ok := h.(InjectHook); ok {
			x.OnInject(ctx, t, header)
		}
	}
}

// OnAppendCallStart implements AppendCallHook.
func (hs Hooks) OnAppendCallStart(ctx context.Context, e AppendCallEvent) context.Context {
	for _, h := range hs {
		if x, ok := h.(AppendCallHook); ok {
			ctx = x.OnAppendCallStart(ctx, e)
		}
	}
	return ctx
}

// OnAppendCallEnd implements AppendCallHook.
func (hs Hooks) OnAppendCallEnd(ctx context.Context, err error) {
	for _, h := range hs {
		if x, ok := h.(AppendCallHook); ok {
			x.OnAppendCallEnd(ctx, err)
		}
	}
}

// OnTxnStart implements TxnHook.
func (hs Hooks) OnTxnStart(ctx context.Context, e TxnStartEvent) context.Context {
	for _, h := range hs {
		if x, ok := h.(TxnHook); ok {
			ctx = x.OnTxnStart(ctx, e)
		}
	}
	return ctx
}

// OnTxnAppend implements TxnHook.
func (hs Hooks) OnTxnAppend(ctx, txn context.Context) context.Context {
	for _, h := range hs {
		if x, ok := h.(TxnHook); ok {
			ctx = x.OnTxnAppend(ctx, txn)
		}
	}
	return ctx
}

// OnTxnEnd implements TxnHook.
func (hs Hooks) OnTxnEnd(txn context.Context, e TxnEndEvent) {
	for _, h := range hs {
		if x, ok := h.(TxnHook); ok {
			x.OnTxnEnd(txn, e)
		}
	}
}

// OnBroadcastCallStart implements BroadcastCallHook.
func (hs Hooks) OnBroadcastCallStart(ctx context.Context, e BroadcastCallEvent) context.Context {
	for _, h := range hs {
		if x, ok := h.(BroadcastCallHook); ok {
			ctx = x.OnBroadcastCallStart(ctx, e)
		}
	}
	return ctx
}

// OnBroadcastCallEnd implements BroadcastCallHook.
func (hs Hooks) OnBroadcastCallEnd(ctx context.Context, e BroadcastCallEndEvent) {
	for _, h := range hs {
		if x, ok := h.(BroadcastCallHook); ok {
			x.OnBroadcastCallEnd(ctx, e)
		}
	}
}

// OnConsume implements ConsumeHook.
func (hs Hooks) OnConsume(ctx context.Context, e ConsumeEvent) {
	for _, h := range hs {
		if x, ok := h.(ConsumeHook); ok {
			x.OnConsume(ctx, e)
		}
	}
}

// OnMessageAppendStart implements MessageAppendHook.
func (hs Hooks) OnMessageAppendStart(ctx context.Context, e MessageAppendEvent) context.Context {
	for _, h := range hs {
		if x, ok := h.(MessageAppendHook); ok {
			ctx = x.OnMessageAppendStart(ctx, e)
		}
	}
	return ctx
}

// OnMessageAppendEnd implements MessageAppendHook.
func (hs Hooks) OnMessageAppendEnd(ctx context.Context, e MessageAppendEndEvent) {
	for _, h := range hs {
		if x, ok := h.(MessageAppendHook); ok {
			x.OnMessageAppendEnd(ctx, e)
		}
	}
}

// OnBroadcastCallbackStart implements BroadcastCallbackHook.
func (hs Hooks) OnBroadcastCallbackStart(ctx context.Context, e BroadcastCallbackEvent) context.Context {
	for _, h := range hs {
		if x, ok := h.(BroadcastCallbackHook); ok {
			ctx = x.OnBroadcastCallbackStart(ctx, e)
		}
	}
	return ctx
}

// OnBroadcastCallbackEnd implements BroadcastCallbackHook.
func (hs Hooks) OnBroadcastCallbackEnd(ctx context.Context, e BroadcastCallbackEndEvent) {
	for _, h := range hs {
		if x, ok := h.(BroadcastCallbackHook); ok {
			x.OnBroadcastCallbackEnd(ctx, e)
		}
	}
}

// OnReplicateAppendStart implements ReplicateAppendHook.
func (hs Hooks) OnReplicateAppendStart(ctx context.Context, e ReplicateAppendEvent) context.Context {
	for _, h := range hs {
		if x, ok := h.(ReplicateAppendHook); ok {
			ctx = x.OnReplicateAppendStart(ctx, e)
		}
	}
	return ctx
}

// OnReplicateAppendEnd implements ReplicateAppendHook.
func (hs Hooks) OnReplicateAppendEnd(ctx context.Context, e ReplicateAppendEndEvent) {
	for _, h := range hs {
		if x, ok := h.(ReplicateAppendHook); ok {
			x.OnReplicateAppendEnd(ctx, e)
		}
	}
}
