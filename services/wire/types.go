package wire

import (
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// TSORequest asks the coordinator for Count consecutive TimeTicks. A
// request of a PChannel's WAL names the PChannel and the term it is owned
// under: the coordinator refuses it (streamwal.CodeFenced) once it assigned
// the PChannel under a later term, so that a superseded owner draws no
// TimeTick above its successor's RecoveryBarrier. Without them (both
// absent) nothing is checked.
type TSORequest struct {
	Count    uint32             `json:"count"`
	PChannel streamwal.PChannel `json:"pchannel,omitzero"`
	Term     uint64             `json:"term,omitempty"`
}

// TSOReply is the first of them.
type TSOReply struct {
	First messages.TimeTick `json:"first"`
}

// OpenRequest tells a node to open a PChannel's WAL under Term.
type OpenRequest struct {
	PChannel streamwal.PChannel `json:"pchannel"`
	Term     uint64             `json:"term"`
	// Timeout is how long the coordinator waits for the open; the node
	// gives up after it too, so that a slow replay does not go on under a
	// term the coordinator has already given up on.
	Timeout time.Duration `json:"timeout,omitempty"`
}

// OpenReply is the RecoveryBarrier the node landed, and the node's
// confirmation that it now serves the PChannel: the session it serves it
// in, and the Version of its served set that first lists it (see
// NodeRecord).
type OpenReply struct {
	Barrier messages.MessageID `json:"barrier"`
	Session string             `json:"session"`
	Version uint64             `json:"version"`
}

// CloseRequest tells a node to close a PChannel's WAL (of Term, or of any
// term when zero).
type CloseRequest struct {
	PChannel streamwal.PChannel `json:"pchannel"`
	Term     uint64             `json:"term,omitempty"`
}

// NodeStatusReply is what a node serves.
type NodeStatusReply struct {
	Node     string          `json:"node"`
	Session  string          `json:"session"`
	Channels []ChannelStatus `json:"channels"`
}

// ChannelStatus is one open WAL.
type ChannelStatus struct {
	PChannel string             `json:"pchannel"`
	Term     uint64             `json:"term"`
	LastID   messages.MessageID `json:"last_id"`
	LastTT   messages.TimeTick  `json:"last_timetick"`
}

// Message is a NATS message carried inside a request.
type Message struct {
	Subject string      `json:"subject"`
	Header  nats.Header `json:"header,omitempty"`
	Data    []byte      `json:"data,omitempty"`
}

// AppendRequest carries independent appends to one PChannel; they are
// ordered among themselves as listed.
type AppendRequest struct {
	Messages []Message `json:"messages"`
}

// AppendReply has one result per message, in order.
type AppendReply struct {
	Results []AppendResult `json:"results"`
}

// AppendResult is the outcome of one message: where it landed, or why not.
type AppendResult struct {
	ID            messages.MessageID `json:"id,omitempty"`
	TimeTick      messages.TimeTick  `json:"timetick,omitempty"`
	LastConfirmed messages.MessageID `json:"last_confirmed,omitempty"`
	TxnID         messages.TxnID     `json:"txn_id,omitempty"`
	Keepalive     time.Duration      `json:"keepalive,omitempty"`
	Error         *Error             `json:"error,omitempty"`
}

// ResultOf is the result of one append: the stored message, or the error.
func ResultOf(m *messages.ImmutableMessage, err error) AppendResult {
	if err != nil {
		return AppendResult{Error: ErrorOf(err)}
	}
	r := AppendResult{ID: m.ID(), TimeTick: m.TimeTick(), LastConfirmed: m.LastConfirmed()}
	if tc := m.Txn(); tc != nil {
		r.TxnID, r.Keepalive = tc.ID, tc.Keepalive
	}
	return r
}

// AllocateRequest asks for the VChannels of a new collection.
type AllocateRequest struct {
	CollectionID int64 `json:"collection_id"`
	Shards       int   `json:"shards"`
	// Lookup only returns the VChannels of an allocated collection (none
	// if it has none); it never allocates.
	Lookup bool `json:"lookup,omitempty"`
	// DBName and Name, when set, must be those the collection was
	// allocated under (an invalid argument otherwise).
	DBName string `json:"db_name,omitempty"`
	Name   string `json:"name,omitempty"`
	// Adopt, when set, are the VChannels a replicated CreateCollection
	// names (a secondary's replicator asks, with this cluster's PChannel
	// names): the collection takes exactly these, whatever it had, so
	// that the secondary's allocation follows its primary's. Shards and
	// Lookup are then ignored.
	Adopt []string `json:"adopt,omitempty"`
}

// AllocateReply names them (the same ones on a repeated request).
type AllocateReply struct {
	VChannels []string `json:"vchannels"`
	// Dropped says that a looked-up collection was dropped (it then has
	// no VChannels).
	Dropped bool `json:"dropped,omitempty"`
}

// ReleaseRequest releases a dropped collection's VChannels.
type ReleaseRequest struct {
	CollectionID int64 `json:"collection_id"`
}

// NodeRecord is a node's registration and heartbeat in the nodes bucket.
// Every heartbeat says what the node serves, so the coordinator (and an
// operator with `nats kv get`) sees what the node confirms, not what was
// last assigned to it.
type NodeRecord struct {
	Node    string    `json:"node"`
	Session string    `json:"session"`
	Since   time.Time `json:"since"`
	// Serving lists the PChannels the node serves, with their terms.
	Serving []Served `json:"serving,omitempty"`
	// Version counts the changes of Serving within the session: a record
	// of Version v lists every PChannel whose open replied with a version
	// of at most v, unless the node stopped serving it since.
	Version uint64 `json:"version"`
}

// Served is one PChannel a node serves.
type Served struct {
	PChannel string    `json:"pchannel"`
	Term     uint64    `json:"term"`
	Since    time.Time `json:"since"`
}

// State is where a PChannel is in its assignment (streamwal.AssignmentState).
type State = streamwal.AssignmentState

// Assignment states (DESIGN.md §3).
const (
	Uninitialized = streamwal.Uninitialized
	Assigning     = streamwal.Assigning
	Assigned      = streamwal.Assigned
	Unavailable   = streamwal.Unavailable
)

// Assignment is one PChannel's owner and term, as persisted
// (streamwal.Assignment).
type Assignment = streamwal.Assignment

// View is the versioned assignment view clients and operators watch
// (streamwal.View).
type View = streamwal.View

// SubscriptionPosition is the stored value of
// streamwal.SubscriptionPositionKey in the subscriptions bucket: a durable
// subscription's acknowledged position on one VChannel, written by
// clients and read by the owner of the VChannel's PChannel, whose
// truncation never passes From (DESIGN.md §10).
type SubscriptionPosition struct {
	// VChannel is the VChannel it is about.
	VChannel string `json:"vchannel"`
	// From is where a resumed read starts (0: the earliest message).
	From messages.MessageID `json:"from"`
	// TimeTick and ID are the last acknowledged message's (0: none).
	TimeTick messages.TimeTick  `json:"timetick"`
	ID       messages.MessageID `json:"id"`
	// Acked is when it was last acknowledged (or created).
	Acked time.Time `json:"acked"`
	// Expiry is how long it may stay unacknowledged and still hold the
	// log (0: the node's default; negative: forever).
	Expiry time.Duration `json:"expiry,omitempty"`
}

// Collections is the VChannel allocation: collection ID to its VChannels.
type Collections struct {
	Epoch       uint64              `json:"epoch"`
	CChannel    string              `json:"cchannel"`
	Collections map[string][]string `json:"collections"`
	// Names are the "<db>.<name>" each collection was allocated under.
	Names map[string]string `json:"names,omitempty"`
	// Dropped remembers every dropped collection (its name, or "" if it
	// had none), so that its ID is never allocated again and a drop can
	// tell "already dropped" from "never created".
	Dropped map[string]string `json:"dropped,omitempty"`
}

// BroadcastRequest asks the coordinator to broadcast a message of a
// broadcast type. Its targets follow the type's dispatch: VChannels (the
// coordinator adds the CChannel where the type takes it), or every
// PChannel for a cluster barrier (VChannels empty).
type BroadcastRequest struct {
	Type      string   `json:"type"`
	VChannels []string `json:"vchannels,omitempty"`
	// DBName, CollectionName and SnapshotName scope the resource keys.
	DBName         string `json:"db_name,omitempty"`
	CollectionName string `json:"collection_name,omitempty"`
	SnapshotName   string `json:"snapshot_name,omitempty"`
	Payload        []byte `json:"payload,omitempty"`
	// IdempotencyKey makes a retry return the original's result.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// AppendFirst is a VChannel target appended before every other.
	AppendFirst string `json:"append_first,omitempty"`
	// TraceParent and TraceState are the caller's W3C trace context,
	// which every replica carries.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// BroadcastReply is the broadcast's ID and where each target's replica
// landed, by target name.
type BroadcastReply struct {
	ID       uint64                  `json:"id"`
	Appended map[string]AppendResult `json:"appended"`
}

// BroadcastAckRequest acknowledges one target of an AckSyncUp broadcast
// from the consuming side.
type BroadcastAckRequest struct {
	ID     uint64 `json:"id"`
	Target string `json:"target"`
}
