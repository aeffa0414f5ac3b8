// Package telemetry is how streamwal's components report what they do:
// small optional hook interfaces, in the style of franz-go's kgo hooks.
//
// A hook is any value; it implements only the interfaces of the events it
// cares about (AppendHook, OpenHook, ...). A component takes a Hooks list
// in its configuration and, at each event, calls the hooks of that list
// that implement the event's interface. An empty list costs a loop over
// nothing: no allocation, no lock. Hooks are called synchronously on the
// component's goroutine, so a hook must be quick and must not block;
// events are values, and a hook must not keep references into them
// beyond the call.
//
// Work that spans a call (a client's append, transaction or broadcast, a
// node's append of a message, a coordinator's broadcast callback) is
// followed through a context: its start hook returns the context the
// work runs under, and its end hook is given that context back (see
// trace.go). Without such a hook the component uses the context it had.
//
// The package carries no exporter: OpenTelemetry metrics and traces are
// adapters on these hooks (packages telemetry/otelmetrics and
// telemetry/oteltrace), wired by cmd/ and embedded/system; the client's
// WithTracerProvider is a shorthand that installs the tracing adapter.
package telemetry

import (
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// Hook is a value that implements one or more of the hook interfaces of
// this package; a value that implements none is ignored.
type Hook any

// Hooks is a list of hooks. It implements every hook interface by calling
// the hooks of the list that implement it, in order, so a Hooks may be
// one hook of another list. The nil Hooks calls nothing.
type Hooks []Hook

// AppendStartEvent is an append request a node began to serve.
type AppendStartEvent struct {
	// PChannel is the PChannel appended to.
	PChannel streamwal.PChannel
	// Messages counts the request's messages.
	Messages int
}

// AppendStartHook is called when a node begins to serve an append
// request: together with AppendHook it tells what is in flight.
type AppendStartHook interface {
	// OnAppendStart is called before the request's messages are appended.
	OnAppendStart(AppendStartEvent)
}

// AppendEvent is the outcome of messages of one append request that share
// a message type and a result. A request whose messages differ reports
// one event per run of equal (Type, Code); their Messages add up to the
// request's AppendStartEvent.Messages.
type AppendEvent struct {
	// PChannel is the PChannel appended to.
	PChannel streamwal.PChannel
	// Type is the messages' type name ("" when a message did not decode).
	Type string
	// Code is the result: "" when appended, else the error's code.
	Code streamwal.Code
	// Messages counts the messages of the run.
	Messages int
	// Latency is the whole request's time at the node.
	Latency time.Duration
}

// AppendHook is called when a node finished an append request.
type AppendHook interface {
	// OnAppend is called once per run of equal results of a request.
	OnAppend(AppendEvent)
}

// UnitEvent is one unit a WAL writer sent to JetStream: a plain publish
// or an atomic batch.
type UnitEvent struct {
	// PChannel is the PChannel written.
	PChannel streamwal.PChannel
	// Messages counts the unit's messages (re-sends included).
	Messages int
	// Batch says whether the unit is an atomic batch.
	Batch bool
}

// UnitHook is called when a writer sends a unit.
type UnitHook interface {
	// OnUnit is called on the writer's sequencer goroutine.
	OnUnit(UnitEvent)
}

// WriterRecoveryEvent is a writer resolving its tail after a unit's
// outcome was unknown (a lost ack, a refused expectation).
type WriterRecoveryEvent struct {
	// PChannel is the PChannel written.
	PChannel streamwal.PChannel
	// Term is the writer's term.
	Term uint64
}

// WriterRecoveryHook is called when a writer resolves its tail.
type WriterRecoveryHook interface {
	// OnWriterRecovery is called on the writer's sequencer goroutine.
	OnWriterRecovery(WriterRecoveryEvent)
}

// FenceEvent is a WAL that learnt that a newer owner fenced it.
type FenceEvent struct {
	// PChannel is the fenced PChannel.
	PChannel streamwal.PChannel
	// Node is the fenced node, Term its term.
	Node string
	Term uint64
}

// FenceHook is called when a node's WAL is fenced.
type FenceHook interface {
	// OnFence is called once per fenced WAL.
	OnFence(FenceEvent)
}

// OpenEvent is a node's open of a PChannel under a term.
type OpenEvent struct {
	// PChannel is the PChannel opened, Term the term asked for.
	PChannel streamwal.PChannel
	Term     uint64
	// Node is the node that opened it.
	Node string
	// Replayed counts the messages replayed to recover the WAL's state.
	Replayed int
	// Took is how long the open took.
	Took time.Duration
	// Err is why the open failed; nil when the node now serves the
	// PChannel.
	Err error
}

// OpenHook is called when a node finished opening a PChannel (an open of
// the term already served is no event).
type OpenHook interface {
	// OnOpen is called once per open.
	OnOpen(OpenEvent)
}

// CloseEvent is a node that stopped serving a PChannel.
type CloseEvent struct {
	// PChannel is the PChannel closed, Term the term it was open under.
	PChannel streamwal.PChannel
	Term     uint64
	// Node is the node that closed it.
	Node string
	// Reason is one of the Reason constants.
	Reason string
}

// The reasons of a CloseEvent (a bounded set, fit for a metric label).
const (
	// ReasonClosed: the coordinator closed it (a move, a rebalance).
	ReasonClosed = "closed"
	// ReasonSuperseded: an open under a newer term replaced it.
	ReasonSuperseded = "superseded"
	// ReasonFenced: a newer owner fenced it.
	ReasonFenced = "fenced"
	// ReasonFailed: its WAL failed.
	ReasonFailed = "failed"
	// ReasonShutdown: the node shut down.
	ReasonShutdown = "shutdown"
)

// CloseHook is called when a node stops serving a PChannel.
type CloseHook interface {
	// OnClose is called once per PChannel that stopped being served.
	OnClose(CloseEvent)
}

// AssignEvent is a change the coordinator made to a PChannel's
// assignment.
type AssignEvent struct {
	// PChannel is the PChannel, Node its owner ("" when it has none), Term
	// the assignment's term.
	PChannel streamwal.PChannel
	Node     string
	Term     uint64
	// State is the assignment's new state (ASSIGNING, ASSIGNED,
	// UNAVAILABLE, ...), Serving whether the owner confirmed it serves.
	State   string
	Serving bool
}

// AssignHook is called on every change of an assignment the active
// coordinator makes.
type AssignHook interface {
	// OnAssign is called on the coordinator's control goroutine.
	OnAssign(AssignEvent)
}

// HeartbeatEvent is a node's heartbeat.
type HeartbeatEvent struct {
	// Node is the node, Serving how many PChannels it serves.
	Node    string
	Serving int
	// Err is why the heartbeat was not written; nil when it was.
	Err error
}

// HeartbeatHook is called after each heartbeat of a node.
type HeartbeatHook interface {
	// OnHeartbeat is called on the node's heartbeat goroutine.
	OnHeartbeat(HeartbeatEvent)
}

// TSOEvent is a TimeTick allocation the coordinator's oracle served.
type TSOEvent struct {
	// Count is how many TimeTicks were asked for.
	Count uint32
	// Err is why the allocation was refused; nil when it was served.
	Err error
}

// TSOHook is called after each allocation request the oracle answered.
type TSOHook interface {
	// OnTSO is called on the request's goroutine.
	OnTSO(TSOEvent)
}

// BroadcastEvent is a broadcast the coordinator accepted and finished
// (appended to every target) or refused.
type BroadcastEvent struct {
	// Type is the broadcast message's type name.
	Type string
	// Targets counts the VChannels (or PChannels) it goes to.
	Targets int
	// Took is from the request to the last target's append.
	Took time.Duration
	// Err is why it was refused or failed; nil when done.
	Err error
}

// BroadcastHook is called when a broadcast is done or refused.
type BroadcastHook interface {
	// OnBroadcast is called once per broadcast request.
	OnBroadcast(BroadcastEvent)
}

// BroadcastStuckEvent counts the broadcasts that are stuck: a target
// refused them for good, and they keep their resource keys until an
// operator acts. The active coordinator reports it at each of its health
// checks (a few times a second), zero included, while it is active.
type BroadcastStuckEvent struct {
	// Stuck is how many broadcasts are stuck now.
	Stuck int
}

// BroadcastStuckHook is called with the number of stuck broadcasts.
type BroadcastStuckHook interface {
	// OnBroadcastStuck is called on the coordinator's control goroutine.
	OnBroadcastStuck(BroadcastStuckEvent)
}

// ClientRequestEvent is one request a client made to a PChannel's owner
// (through NATS, or its local bypass) with the messages of appends.
type ClientRequestEvent struct {
	// PChannel is the PChannel appended to.
	PChannel streamwal.PChannel
	// Messages counts the request's messages, Failed those the owner
	// refused or failed.
	Messages, Failed int
	// Code is the request's own error code ("" when it was answered).
	Code streamwal.Code
	// Latency is the request's round trip.
	Latency time.Duration
}

// ClientRequestHook is called after each append request of a client.
type ClientRequestHook interface {
	// OnClientRequest is called on the goroutine that made the request.
	OnClientRequest(ClientRequestEvent)
}

// StorageEvent is the state of one WAL's recovery storage, reported with
// each heartbeat of the node that serves it.
type StorageEvent struct {
	// PChannel is the WAL's PChannel.
	PChannel streamwal.PChannel
	// CheckpointAge is how far the last persisted checkpoint's TimeTick
	// lies in the past (0 before the first).
	CheckpointAge time.Duration
	// WatermarkLag is how far the TimeTick up to which the WAL consumed
	// its log (every message at or below it applied to its recovery
	// state) lies in the past (0 before the first).
	WatermarkLag time.Duration
	// Truncated is the MessageID truncation last applied (0: none).
	Truncated uint64
	// Growing, Sealed and Flushed count the segments in each state.
	Growing, Sealed, Flushed int
}

// StorageHook is called with the state of each served WAL's recovery
// storage.
type StorageHook interface {
	// OnStorage is called on the node's heartbeat goroutine.
	OnStorage(StorageEvent)
}

// ReplicationEvent is where the replication of one PChannel of a
// secondary stands, as its replicator knows it (DESIGN.md §11): the
// replicator reports it every checkpoint interval while its cluster is a
// secondary, whether replication progresses, idles, is stuck or cannot
// reach the primary, and once with Active false when it stops (the
// cluster is no longer a secondary, or its node no longer serves the
// PChannel).
type ReplicationEvent struct {
	// PChannel is the secondary's PChannel.
	PChannel streamwal.PChannel
	// Active says that the replicator runs for a secondary: false once it
	// stopped, when the other fields mean nothing.
	Active bool
	// Source is the primary cluster replicated from ("" before the
	// replicator knows it).
	Source streamwal.Cluster
	// Through is the source TimeTick through which the secondary holds
	// everything (0: unknown, nothing was replicated yet);
	// SourceTimeTick the latest source TimeTick the replicator knows of.
	Through, SourceTimeTick messages.TimeTick
	// Replicated counts the units the replicator appended since it
	// started.
	Replicated uint64
	// Err is why replication does not progress ("" when it does).
	Err string
}

// Lag is how far behind its source the secondary is at now: the time
// since Through (as wire.ReplicateCheckpoint.Lag). A hook that exports
// it should compute it when it is read, from the last event's Through,
// so that it grows while replication is stuck between two events; ok is
// false while Through is unknown or the replicator is not active.
func (e ReplicationEvent) Lag(now time.Time) (lag time.Duration, ok bool) {
	if !e.Active || e.Through == 0 {
		return 0, false
	}
	return max(now.Sub(e.Through.Physical()), 0), true
}

// ReplicationHook is told where the replication of each PChannel of a
// secondary stands.
type ReplicationHook interface {
	// OnReplication is called on the replicator's goroutines, one event
	// at a time per PChannel.
	OnReplication(ReplicationEvent)
}

// OnAppendStart implements AppendStartHook.
func (hs Hooks) OnAppendStart(e AppendStartEvent) {
	for _, h := range hs {
		if x, ok := h.(AppendStartHook); ok {
			x.OnAppendStart(e)
		}
	}
}

// OnAppend implements AppendHook.
func (hs Hooks) OnAppend(e AppendEvent) {
	for _, h := range hs {
		if x, ok := h.(AppendHook); ok {
			x.OnAppend(e)
		}
	}
}

// OnUnit implements UnitHook.
func (hs Hooks) OnUnit(e UnitEvent) {
	for _, h := range hs {
		if x, ok := h.(UnitHook); ok {
			x.OnUnit(e)
		}
	}
}

// OnWriterRecovery implements WriterRecoveryHook.
func (hs Hooks) OnWriterRecovery(e WriterRecoveryEvent) {
	for _, h := range hs {
		if x, ok := h.(WriterRecoveryHook); ok {
			x.OnWriterRecovery(e)
		}
	}
}

// OnFence implements FenceHook.
func (hs Hooks) OnFence(e FenceEvent) {
	for _, h := range hs {
		if x, ok := h.(FenceHook); ok {
			x.OnFence(e)
		}
	}
}

// OnOpen implements OpenHook.
func (hs Hooks) OnOpen(e OpenEvent) {
	for _, h := range hs {
		if x, ok := h.(OpenHook); ok {
			x.OnOpen(e)
		}
	}
}

// OnClose implements CloseHook.
func (hs Hooks) OnClose(e CloseEvent) {
	for _, h := range hs {
		if x, ok := h.(CloseHook); ok {
			x.OnClose(e)
		}
	}
}

// OnAssign implements AssignHook.
func (hs Hooks) OnAssign(e AssignEvent) {
	for _, h := range hs {
		if x, ok := h.(AssignHook); ok {
			x.OnAssign(e)
		}
	}
}

// OnHeartbeat implements HeartbeatHook.
func (hs Hooks) OnHeartbeat(e HeartbeatEvent) {
	for _, h := range hs {
		if x, ok := h.(HeartbeatHook); ok {
			x.OnHeartbeat(e)
		}
	}
}

// OnTSO implements TSOHook.
func (hs Hooks) OnTSO(e TSOEvent) {
	for _, h := range hs {
		if x, ok := h.(TSOHook); ok {
			x.OnTSO(e)
		}
	}
}

// OnBroadcast implements BroadcastHook.
func (hs Hooks) OnBroadcast(e BroadcastEvent) {
	for _, h := range hs {
		if x, ok := h.(BroadcastHook); ok {
			x.OnBroadcast(e)
		}
	}
}

// OnBroadcastStuck implements BroadcastStuckHook.
func (hs Hooks) OnBroadcastStuck(e BroadcastStuckEvent) {
	for _, h := range hs {
		if x, ok := h.(BroadcastStuckHook); ok {
			x.OnBroadcastStuck(e)
		}
	}
}

// OnClientRequest implements ClientRequestHook.
func (hs Hooks) OnClientRequest(e ClientRequestEvent) {
	for _, h := range hs {
		if x, ok := h.(ClientRequestHook); ok {
			x.OnClientRequest(e)
		}
	}
}

// OnStorage implements StorageHook.
func (hs Hooks) OnStorage(e StorageEvent) {
	for _, h := range hs {
		if x, ok := h.(StorageHook); ok {
			x.OnStorage(e)
		}
	}
}

// OnReplication implements ReplicationHook.
func (hs Hooks) OnReplication(e ReplicationEvent) {
	for _, h := range hs {
		if x, ok := h.(ReplicationHook); ok {
			x.OnReplication(e)
		}
	}
}

// IsFailure reports whether a request that ended with code failed
// (the server could not do it: worth a warning in its log) rather than
// was refused for what it asked (an invalid argument, a fenced term, a
// lifecycle rule: a debug line). "" (success) is neither.
func IsFailure(code streamwal.Code) bool {
	switch code {
	case streamwal.CodeInternal, streamwal.CodeUnavailable, streamwal.CodeUnknownOutcome,
		streamwal.CodeUnrecoverable, streamwal.CodeHistoryLost, streamwal.CodeShuttingDown:
		return true
	}
	return false
}
