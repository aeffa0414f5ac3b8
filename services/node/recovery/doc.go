// Package recovery is the recovery storage of a PChannel (DESIGN.md §1
// "Recovery storage and checkpoint", §10): what a node persists so that
// the next owner of the PChannel replays only what was written since the
// last checkpoint instead of the whole log.
//
// # What is stored
//
// Three keys per PChannel in the cluster's checkpoints bucket, each a JSON
// value readable with `nats kv get`, each carrying the term of the owner
// that wrote it:
//
//   - the [Checkpoint] (streamwal.CheckpointKey): the TimeTick through
//     which the owner consumed its WAL, the MessageID a replay starts from,
//     the last consumed message and its [Digest], the truncation point last
//     applied and the replication state;
//   - the VChannel metadata (streamwal.VChannelMetaKey):
//     {"term":N,"timetick":T,"vchannels":[...]}, see [VChannelMeta];
//   - the segment metadata (streamwal.SegmentMetaKey):
//     {"term":N,"timetick":T,"segments":...}, opaque to this package.
//
// The "timetick" of a metadata value is the TimeTick of the checkpoint of
// the round that wrote it ([Snapshot.VChannelsThrough],
// [Snapshot.SegmentsThrough]): the metadata already reflects every message
// at or below it. A fourth key, the operator's [AcceptLoss] record, is
// written by `streamwal pchannel accept-loss`.
//
// # Order, fencing and monotony
//
// A [Persister] writes one round in a fixed order: VChannel metadata,
// segment metadata, the checkpoint last, so stored metadata is never
// behind the stored checkpoint. A crash between the writes leaves metadata
// ahead of the checkpoint; a replay from the checkpoint then must not apply
// a message at or below a component's "timetick" to that component again.
// A metadata value whose bytes equal the last written is not rewritten;
// its "timetick" then stays older, which is safe: the metadata is still
// the state at that TimeTick, and replaying the messages above it rebuilds
// the same state.
//
// Every write is compare-and-set on the revision the persister last read
// or wrote. A new owner loads the snapshot, then [Persister.Claim]s every
// key under its term before it lands its RecoveryBarrier: from then on
// each write of an older owner meets a changed revision, re-reads the key,
// finds the newer term and stops for good with streamwal.ErrFenced. An
// owner of an older term can therefore never move a newer owner's
// checkpoint (the Milvus implementation has no such guard).
//
// The checkpoint never moves backwards: a round whose Consumed or TimeTick
// is below the last checkpoint written, loaded or attempted is refused
// with [ErrBackwards] before anything is written. Reached and Truncated
// are kept at their maximum.
//
// # Stores
//
// [Store] is the small key-value interface the persister needs, with three
// implementations: [NewKV] over a JetStream KV bucket (see [OpenBucket]),
// [NewMemory] for tests, and [Faulty], which injects failures before or
// after an operation takes effect, for crash-between-writes and
// unknown-outcome tests.
package recovery
