// Package broadcast is the coordinator's broadcaster (DESIGN.md §1
// "Broadcast", §5): one message appended atomically to several channels,
// every replica landing exactly once, in a consistent order, even when the
// coordinator crashes halfway.
//
// A broadcast takes its resource keys ([KeyLocks]: all or none, fair), is
// persisted as a PENDING task before anything is appended, and is then
// appended to every target (the append-first VChannel, if any, before the
// others), each replica carrying the broadcast header and a message ID
// derived from the broadcast ID and the target, so that a resumed append
// is deduplicated rather than written twice. Appends retry with backoff; a
// refusal that can never succeed is logged and counted, and the task keeps
// its keys (an operator must look). A target is acknowledged by its append
// result, or, for AckSyncUp types, by an explicit acknowledgement from the
// consuming side. When every target is acknowledged, the callback
// registered for the type runs (retried until it succeeds; callbacks are
// idempotent), in the order in which the CChannel acknowledgements arrived.
// The task then becomes a TOMBSTONE, persisted before its keys are
// released, and is garbage-collected after a retention window.
//
// A new active coordinator resumes every unfinished task: it re-takes their
// keys in broadcast ID order and carries on from what was persisted.
// Idempotency keys (scoped by the caller plus the message type) map a retry
// to its original task for as long as the task's tombstone is kept.
package broadcast

import (
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// State is where a task is.
type State string

// Task states.
const (
	// Pending: appending or waiting for acknowledgements or its callback.
	Pending State = "PENDING"
	// Stuck: a target refused the append for good; the task keeps its
	// keys until an operator intervenes.
	Stuck State = "STUCK"
	// Tombstone: done; kept for idempotency until garbage-collected.
	Tombstone State = "TOMBSTONE"
)

// Task is a broadcast as persisted.
type Task struct {
	ID    uint64 `json:"id"`
	State State  `json:"state"`
	// Type is the message type's name; Scope what its keys are about.
	Type  string            `json:"type"`
	Scope messages.KeyScope `json:"scope"`
	// VChannels are the VChannel targets, CChannel the control channel
	// when the type takes it, PChannels those of a cluster barrier.
	VChannels []string `json:"vchannels,omitempty"`
	CChannel  string   `json:"cchannel,omitempty"`
	PChannels []string `json:"pchannels,omitempty"`
	Payload   []byte   `json:"payload,omitempty"`
	// AppendFirst is the VChannel appended before every other target.
	AppendFirst string `json:"append_first,omitempty"`
	// IdemKey is the caller's idempotency key (with the type), if any.
	IdemKey string `json:"idem_key,omitempty"`
	// Appended are the targets' append results; Acked the targets
	// acknowledged.
	Appended map[string]wire.AppendResult `json:"appended,omitempty"`
	Acked    map[string]bool              `json:"acked,omitempty"`
	// Error and ErrorCode say why a stuck task is stuck, or why a
	// tombstone's broadcast was refused by its append-first target.
	Error     string         `json:"error,omitempty"`
	ErrorCode streamwal.Code `json:"error_code,omitempty"`
	Created   time.Time      `json:"created"`
	Finished  time.Time      `json:"finished,omitempty"`
	// TraceParent and TraceState are the caller's trace context, which
	// every replica carries.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// targets lists every target name, VChannels (with the CChannel) first.
func (t *Task) targets() []string {
	out := append([]string(nil), t.VChannels...)
	if t.CChannel != "" {
		out = append(out, t.CChannel)
	}
	return append(out, t.PChannels...)
}

// allAcked reports whether every target is acknowledged.
func (t *Task) allAcked() bool {
	for _, name := range t.targets() {
		if !t.Acked[name] {
			return false
		}
	}
	return true
}

// Result is what a broadcast call returns: the task's ID and where each
// target's replica landed.
type Result struct {
	ID       uint64                       `json:"id"`
	Appended map[string]wire.AppendResult `json:"appended"`
}
