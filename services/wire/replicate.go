package wire

import (
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// ReplicateCheckpoint is where the replicator of a secondary's PChannel
// has replicated its primary through, as it publishes it under
// streamwal.ReplicateCheckpointKey in the secondary's replication bucket
// (`nats kv get wal_<c>_replication pchannel.<p>.checkpoint`). The WAL
// itself keeps the authoritative source position (with its recovery
// checkpoint); this record is for status, lag and operators.
type ReplicateCheckpoint struct {
	// Source is the primary cluster and SourcePChannel its PChannel read.
	Source         streamwal.Cluster `json:"source"`
	SourcePChannel string            `json:"source_pchannel"`
	// MessageID, TimeTick and LastConfirmed are those of the last message
	// of the source replicated (or skipped: unreplicable, WAL-internal)
	// with everything before it: a replicator that starts again reads
	// from LastConfirmed, past TimeTick.
	MessageID     messages.MessageID `json:"message_id"`
	TimeTick      messages.TimeTick  `json:"timetick"`
	LastConfirmed messages.MessageID `json:"last_confirmed"`
	// Replicated counts the units (messages, or whole transactions)
	// appended by this replicator since it started.
	Replicated uint64 `json:"replicated"`
	// Error is why replication is not progressing, if it is not.
	Error string `json:"error,omitempty"`
	// Updated is when the record was written.
	Updated time.Time `json:"updated"`
}
