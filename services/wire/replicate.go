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
	// Through is the TimeTick of the source through which the secondary
	// holds everything: TimeTick, or past it the source's watermark when
	// the replicator had caught up with it (so it advances while the
	// source is idle). SourceTimeTick is the latest TimeTick of the
	// source the replicator knows of.
	Through        messages.TimeTick `json:"through"`
	SourceTimeTick messages.TimeTick `json:"source_timetick"`
	// Replicated counts the units (messages, or whole transactions)
	// appended by this replicator since it started.
	Replicated uint64 `json:"replicated"`
	// Error is why replication is not progressing, if it is not.
	Error string `json:"error,omitempty"`
	// Updated is when the record was written.
	Updated time.Time `json:"updated"`
}

// Lag is how far behind its source the secondary is at now: the time
// since the source's TimeTick through which it holds everything
// (Through). Computed from the record at read time, it keeps growing
// while replication is stuck, disconnected or not running at all, and
// it survives restarts with the record; it includes the source's
// TimeTick interval (a caught-up idle secondary lags by about that), up
// to the record's publishing interval, and the skew between the
// source's clock and now's. ok is false before anything was replicated.
func (c ReplicateCheckpoint) Lag(now time.Time) (lag time.Duration, ok bool) {
	if c.Through == 0 {
		return 0, false
	}
	return max(now.Sub(c.Through.Physical()), 0), true
}
