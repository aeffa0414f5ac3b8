// Package replicate is the replicator of a secondary cluster (DESIGN.md
// §1, §11): for one PChannel of the secondary, it reads the PChannel of
// the same index of the primary and re-appends what it reads into the
// local WAL with a replicate header. A secondary's node runs one for each
// PChannel it owns (see [Run]), so that a PChannel's replicator moves with
// the PChannel when its owner changes.
//
// # What is replicated
//
// The replicator reads the primary's stream through the read pipeline
// (package read), in TimeTick order with transactions assembled. It skips
// WAL-internal messages (each cluster writes its own TimeTicks, barriers,
// CreateSegments and Flushes), unreplicable ones (resource groups,
// AlterReplicateConfig: each member is configured on its own) and
// replicas of this cluster's own messages. The replicas of a third
// cluster that the source holds (it was a secondary itself) are relayed
// as messages of the source's log (messages.Codec.NewRelay: the replica
// carries the source's header), so that a copy of the source's log is
// whole. A committed transaction is
// re-appended whole, as one atomic unit (its BeginTxn, bodies and
// CommitTxn, each with its replicate header); a rolled-back or expired
// one never. Broadcasts (DDL) replicate as the messages they are on each
// PChannel, so the secondary's collections follow the primary's.
//
// # Collections
//
// The VChannel allocation is the coordinator's, and the secondary's
// coordinator holds the same as the primary's, so that once the
// secondary is promoted, DDL, lookups and new collections work there as
// they did on the primary. It learns it from the replicated DDL: before
// it appends the copy of a CreateCollection or DropCollection that lands
// on the control channel (one per DDL), the replicator tells the local
// coordinator (Config.Collections; Coordinator sends the allocate and
// release requests) the collection's VChannels renamed onto this
// cluster's PChannels (wire.AllocateRequest.Adopt: the collection takes
// exactly those) or that it is dropped. It tells at least once (a
// repeat changes nothing) and the DDL waits for the answer: a
// coordinator that does not answer holds replication up, as a failed
// append does. The allocation follows the log the secondary holds, not
// the primary's allocation records: a collection allocated on the
// primary but never created is not known to the secondary, and a
// client that creates it again after a promotion gets new VChannels.
//
// # Where it starts, and exactly once
//
// The local WAL keeps the replicate header of the last replica that
// landed (wal.WAL.Replication): a replicator that starts reads the
// primary from that message's LastConfirmedMessageID, past its TimeTick,
// which delivers exactly what follows it (transactions that began before
// and commit after included). The WAL refuses a replica at or below that
// source TimeTick with streamwal.ErrDuplicate, which the replicator takes
// as done: after a crash, a reconnect or a change of owner, every
// replicable message lands once. Without a source position (a new
// secondary) it starts at the edge's Start, where `replicate configure`
// added it (or a switchover or failover promoted its source), or, with
// none (`configure --copy-history`), at the source's first message.
//
// # Catching up after a change of primary
//
// When the last replica that landed is of another cluster than the
// source (the old primary of a failover or switchover), this cluster
// may be behind the source in the old primary's log: the source may
// hold replicas of it this cluster missed. The replicator then copies
// those first: it reads the source from catchUpMargin (10 s) before
// that replica's TimeTick by the source's clock (read.Locate), at the
// latest from the edge's Start, and relays only the source's replicas
// of the old primary above that TimeTick and the source's own messages
// from the Start on; the source's replicas are in the old primary's
// TimeTick order, so that the first one it meets must be one this
// cluster holds, or the catch-up started too late (clocks further
// apart than the margin) and starts again at the source's first
// message. Each message is copied once: replicas at or below what this
// cluster held are skipped, and once a relayed replica landed, the
// replicator starts after it.
//
// # Pipelining
//
// Appends are pipelined: a reader goroutine keeps reading ahead while the
// replicator appends everything read so far (up to Config.Batch units) in
// one WAL.AppendUnits call, where all of them are in flight together and
// group-committed. The published checkpoint advances over the contiguous
// prefix of acknowledged units; the first refused unit ends the attempt,
// and the next attempt starts again from the WAL's source position (with
// backoff, 100 ms doubling to 10 s).
//
// # Topology
//
// The replicator follows the topology the local WAL took from its own
// log: it replicates while the cluster is a secondary, from the member
// the topology names as its source (URL and PChannel names from the
// topology), and stops and starts again when a change of it names
// another source or ends the cluster's role as a secondary. A change
// that leaves its source as it is (a member added or removed) does not
// stop it, nor does a topology older than the one in force
// (messages.Topology's Version), which the WAL ignores. When the edge
// into this cluster has a Start (a switchover or failover sets it to
// where the new primary took its role, configure to where it added a
// secondary), a replicator without a position in that source's log
// starts there rather than at the source's first message (or catches
// up, above); one with a position goes on after it.
//
// # Checkpoint record and lag
//
// Every Config.CheckpointInterval (200 ms) while messages are
// replicated, and every Config.IdleCheckpointInterval (1 s) while only
// the source's watermark moves, the replicator publishes a
// wire.ReplicateCheckpoint under streamwal.ReplicateCheckpointKey in the
// local replication bucket:
// source, position, count, the error that holds it up (if any), and
// Through, the source TimeTick through which the secondary holds
// everything. Through advances with every message acknowledged and, when
// the reader has waited 100 ms for the next message, to the source's
// watermark (which the source's live ticks move while it is idle): so an
// idle, caught-up secondary stays current. The lag is computed from the
// record when it is read (wire.ReplicateCheckpoint.Lag: now minus
// Through), so it grows while replication is stuck, the source is
// unreachable or no replicator runs at all; a replicator that starts
// reads the record back first, so that a restart carries the lag on
// instead of resetting it (and starts from the record's position when
// it is past the WAL's: skipped messages included).
//
// # Telemetry
//
// With Config.Hooks, the replicator reports where replication stands
// (telemetry.ReplicationEvent, with Through) every CheckpointInterval
// while its cluster is a secondary, idle, stuck or disconnected alike,
// and once more, inactive, when it stops; an exporter computes the lag
// from Through when it is read (telemetry/otelmetrics exports it as
// streamwal_replication_lag_seconds), so that it grows between reports
// too. Each unit re-appended is a telemetry.ReplicateAppendEvent, which
// the tracing adapter (telemetry/oteltrace) makes a replicate.secondary
// span, child of the trace context the primary's message carries.
package replicate

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
)

// Defaults.
const (
	// DefaultBatch bounds the units appended in one call.
	DefaultBatch = 1024
	// DefaultCheckpointInterval is how often the checkpoint record is
	// published while messages are replicated.
	DefaultCheckpointInterval = 200 * time.Millisecond
	// DefaultIdleCheckpointInterval is how often it is published while
	// only the source's watermark moves (an idle, caught-up secondary).
	DefaultIdleCheckpointInterval = time.Second
	// retryFirst and retryMax bound the pause between attempts.
	retryFirst = 100 * time.Millisecond
	retryMax   = 10 * time.Second
)

// Target is the local WAL of one PChannel; *wal.WAL is one.
type Target interface {
	// PChannel is the channel the WAL writes.
	PChannel() streamwal.PChannel
	// Replication is the topology the WAL's log set (ok false: none),
	// the source position of the last replica that landed, and a channel
	// closed at the next change of the topology.
	Replication() (topo messages.Topology, ok bool, source *messages.ReplicateHeader, changed <-chan struct{})
	// AppendUnits appends units (a message, or a whole transaction), all
	// in flight together, and returns each one's outcome.
	AppendUnits(ctx context.Context, units [][]*messages.MutableMessage) ([][]*messages.ImmutableMessage, []error)
}

// Config configures a replicator.
type Config struct {
	// Target is the local WAL; Codec this cluster's codec (its registry
	// decodes the primary's messages too); Local this cluster's
	// connection, for the checkpoint record. All required.
	Target Target
	Codec  *messages.Codec
	Local  *nats.Conn
	// ConnectOptions are added to the connection to the primary
	// (credentials, TLS); the replicator adds a name and reconnects.
	ConnectOptions []nats.Option
	// SourceOptions, when set, are added after ConnectOptions to the
	// connection to the source cluster it is called with: the
	// credentials this cluster's replicators have for it (the topology
	// names where a member is, never how to log in there).
	SourceOptions func(source streamwal.Cluster) []nats.Option
	// Collections, when set, is told of the collections replicated DDL
	// creates and drops (Coordinator: this cluster's coordinator), before
	// the DDL is appended.
	Collections Collections
	// Batch bounds the units appended in one call (default 1024).
	Batch int
	// CheckpointInterval is how often the checkpoint record is published
	// while messages are replicated (default 200 ms): the lag read from
	// it is at most that much older than the replicator's own.
	CheckpointInterval time.Duration
	// IdleCheckpointInterval is how often it is published while nothing
	// but the source's watermark moves (default 1 s, at least
	// CheckpointInterval): an idle secondary does not write its bucket
	// five times a second per PChannel.
	IdleCheckpointInterval time.Duration
	// Logger receives the replicator's logs.
	Logger zerolog.Logger
	// Hooks are told where replication stands (telemetry.ReplicationHook,
	// every CheckpointInterval while the cluster is a secondary) and of
	// each unit re-appended (telemetry.ReplicateAppendHook); none by
	// default.
	Hooks telemetry.Hooks
}

// withDefaults validates c and fills in defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Target == nil || c.Codec == nil || c.Local == nil {
		return c, streamwal.Errorf(streamwal.CodeInvalidArgument, "replicator needs a target, a codec and a local connection")
	}
	if c.Batch <= 0 {
		c.Batch = DefaultBatch
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	if c.IdleCheckpointInterval <= 0 {
		c.IdleCheckpointInterval = DefaultIdleCheckpointInterval
	}
	c.IdleCheckpointInterval = max(c.IdleCheckpointInterval, c.CheckpointInterval)
	return c, nil
}
