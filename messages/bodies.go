package messages

import (
	"encoding/json"

	"github.com/streamwal/streamwal"
)

// JSON bodies of the built-in types that the WAL itself interprets. Other
// types (DML, index, database, RBAC, resource-group messages and application
// types) carry the caller's bytes untouched.

// TimeTickBody is the body of a persisted TimeTick message. Its value is the
// message's own TimeTick header.
type TimeTickBody struct{}

// RecoveryBarrierBody is the body of the barrier a node appends when it opens
// a PChannel for writing.
type RecoveryBarrierBody struct {
	// Term is the ownership term the writer opened under.
	Term uint64 `json:"term"`
	// Node identifies the writer.
	Node string `json:"node,omitempty"`
}

// CreateSegmentBody opens a growing segment before its first insert.
type CreateSegmentBody struct {
	CollectionID int64 `json:"collection_id"`
	PartitionID  int64 `json:"partition_id"`
	SegmentID    int64 `json:"segment_id"`
}

// FlushBody seals and flushes growing segments.
type FlushBody struct {
	CollectionID int64   `json:"collection_id"`
	SegmentIDs   []int64 `json:"segment_ids"`
	// Reason names the seal policy that fired (size, rows, lifetime, idle,
	// manual, lifecycle).
	Reason string `json:"reason,omitempty"`
}

// ManualFlushBody asks the node to seal every growing segment of a
// collection's VChannel.
type ManualFlushBody struct {
	CollectionID int64 `json:"collection_id"`
}

// BeginTxnBody opens a transaction; the TxnContext header carries its ID and
// keepalive.
type BeginTxnBody struct{}

// CommitTxnBody commits a transaction.
type CommitTxnBody struct{}

// RollbackTxnBody rolls a transaction back.
type RollbackTxnBody struct{}

// CollectionRef names a collection in lifecycle bodies.
type CollectionRef struct {
	DBName         string `json:"db_name"`
	CollectionName string `json:"collection_name"`
	CollectionID   int64  `json:"collection_id"`
}

// CreateCollectionBody creates a collection on its VChannels.
type CreateCollectionBody struct {
	CollectionRef
	// PartitionIDs are the partitions the collection starts with.
	PartitionIDs []int64 `json:"partition_ids,omitempty"`
	// VChannels are the names of the collection's shards.
	VChannels []string `json:"vchannels"`
	// Schema is the application's schema document, kept verbatim.
	Schema json.RawMessage `json:"schema,omitempty"`
}

// DropCollectionBody drops a collection; nothing of it may follow.
type DropCollectionBody struct {
	CollectionRef
}

// AlterCollectionBody changes a collection's schema or properties.
type AlterCollectionBody struct {
	CollectionRef
	SchemaVersion uint64            `json:"schema_version,omitempty"`
	Schema        json.RawMessage   `json:"schema,omitempty"`
	Properties    map[string]string `json:"properties,omitempty"`
}

// TruncateCollectionBody removes a collection's data but keeps it.
type TruncateCollectionBody struct {
	CollectionRef
}

// PartitionBody creates or drops a partition.
type PartitionBody struct {
	CollectionRef
	PartitionID   int64  `json:"partition_id"`
	PartitionName string `json:"partition_name,omitempty"`
}

// FlushAllBody asks every PChannel to seal all growing segments.
type FlushAllBody struct{}

// AlterWALBody changes WAL-level settings cluster-wide.
type AlterWALBody struct {
	Settings map[string]string `json:"settings,omitempty"`
}

// ReplicateRole is a cluster's role in the replication star.
type ReplicateRole string

// Replication roles. A cluster outside any topology (or before its first
// AlterReplicateConfig) takes writes as a primary would.
const (
	RolePrimary   ReplicateRole = "primary"
	RoleSecondary ReplicateRole = "secondary"
)

// ReplicateMember is one cluster of the replication topology.
type ReplicateMember struct {
	// Cluster is the member's cluster name.
	Cluster streamwal.Cluster `json:"cluster"`
	// URL is where the member's NATS servers are reached (one URL or a
	// comma-separated list), for the replicators that read from it.
	URL string `json:"url,omitempty"`
	// PChannels are the member's PChannel names in index order: PChannel
	// i of the primary replicates into PChannel i of each secondary.
	PChannels []string `json:"pchannels"`
}

// ReplicateEdge says that Source's log replicates into Target.
type ReplicateEdge struct {
	Source streamwal.Cluster `json:"source"`
	Target streamwal.Cluster `json:"target"`
	// Start, when set, is where Target starts replicating each PChannel
	// of Source (by index) while it holds no position of its own in
	// Source's log that is later: Source's message of that ID and what
	// follows. A switchover or failover sets it to where the new primary
	// took its role, so that the members that follow it copy only what
	// it took as the primary. Empty: from Source's first message.
	Start []MessageID `json:"start,omitempty"`
}

// AlterReplicateConfigBody sets the replication topology (DESIGN.md §1,
// §11): a star of one primary and its secondaries. Each member cluster
// gets it by a broadcast of its own (it is unreplicable), so that the
// topology can change without the primary (failover); see [Topology].
type AlterReplicateConfigBody = Topology
