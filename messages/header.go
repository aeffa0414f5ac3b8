package messages

import (
	"maps"
	"slices"
	"time"

	"github.com/streamwal/streamwal"
)

// Version is the current message encoding version (header Wal-Version).
const Version = 1

// Header holds a message's properties. Which fields are set depends on the
// message's state: the WAL assigns TimeTick, LastConfirmed and Term at
// append; the rest comes from the writer.
type Header struct {
	// PChannel is the physical channel; always set.
	PChannel streamwal.PChannel
	// VChannel is the target VChannel; zero for a PChannel-level message,
	// which concerns every VChannel of the PChannel.
	VChannel streamwal.VChannel
	// TimeTick is the message's hybrid timestamp.
	TimeTick TimeTick
	// LastConfirmed is where a reader must start to see every message with a
	// TimeTick above this one's.
	LastConfirmed MessageID
	// Txn is set on BeginTxn, body, CommitTxn and RollbackTxn messages.
	Txn *TxnContext
	// Broadcast is set on every replica of a broadcast.
	Broadcast *BroadcastHeader
	// Replicate is set on messages replicated from another cluster.
	Replicate *ReplicateHeader
	// DML is set on Insert, Delete and Upsert messages that name a partition
	// or row count, and on inserts once the WAL assigned their segment.
	DML *DMLHeader
	// Unreplicable keeps the message out of replication even if its type is
	// replicable.
	Unreplicable bool
	// Term is the ownership term of the writer that appended the message.
	Term uint64
	// MsgID is the message's unique identity for deduplication (the JetStream
	// Nats-Msg-Id); a retried append keeps it.
	MsgID string
	// TraceParent and TraceState are the W3C trace context.
	TraceParent string
	TraceState  string
	// Props are application properties.
	Props map[string]string
}

// PChannelLevel reports whether the message concerns the whole PChannel.
func (h *Header) PChannelLevel() bool { return h.VChannel.IsZero() }

// clone returns a deep copy.
func (h Header) clone() Header {
	if h.Txn != nil {
		t := *h.Txn
		h.Txn = &t
	}
	if h.Broadcast != nil {
		b := h.Broadcast.clone()
		h.Broadcast = &b
	}
	if h.Replicate != nil {
		r := *h.Replicate
		h.Replicate = &r
	}
	if h.DML != nil {
		d := *h.DML
		h.DML = &d
	}
	h.Props = maps.Clone(h.Props)
	return h
}

// TxnID identifies a transaction within its VChannel's PChannel.
type TxnID uint64

// DefaultKeepalive is the keepalive of a transaction that sets none.
const DefaultKeepalive = 10 * time.Second

// MinKeepalive is the smallest keepalive accepted.
const MinKeepalive = time.Millisecond

// TxnContext ties a message to its transaction.
type TxnContext struct {
	ID TxnID
	// Keepalive is how long the transaction lives after its last activity,
	// measured in TimeTick physical time.
	Keepalive time.Duration
}

// BroadcastHeader is carried by every replica of a broadcast.
type BroadcastHeader struct {
	// ID is the broadcast task's identity, assigned by the coordinator.
	ID uint64
	// VChannels are the VChannel targets; PChannels the PChannel-level
	// targets of a cluster barrier.
	VChannels []streamwal.VChannel
	PChannels []streamwal.PChannel
	// Keys are the resource keys the broadcast holds, normalized.
	Keys []ResourceKey
}

func (b BroadcastHeader) clone() BroadcastHeader {
	b.VChannels = slices.Clone(b.VChannels)
	b.PChannels = slices.Clone(b.PChannels)
	b.Keys = slices.Clone(b.Keys)
	return b
}

// ReplicateHeader keeps the source identity of a message replicated from
// another cluster. As JSON it is also a replicate checkpoint: where the
// last replica of a source landed from.
type ReplicateHeader struct {
	// Cluster is the source cluster.
	Cluster streamwal.Cluster `json:"cluster"`
	// MessageID, TimeTick and LastConfirmed are the message's values in the
	// source cluster's WAL.
	MessageID     MessageID `json:"message_id"`
	TimeTick      TimeTick  `json:"timetick"`
	LastConfirmed MessageID `json:"last_confirmed"`
}

// DMLHeader describes a DML message's rows for shard management.
type DMLHeader struct {
	PartitionID int64
	Rows        uint64
	// SegmentID is assigned by the WAL to inserts.
	SegmentID int64
}
