// Package wal is the write-ahead log of one PChannel as a StreamingNode
// runs it (DESIGN.md §1, §3, §4): an interceptor chain in front of the
// backend's sequencer.
//
// # Appending
//
// An append goes through three phases:
//
//  1. admit, which may wait: the lock its message type declares (see
//     package lock), and for a CommitTxn the bodies of its transaction
//     still in flight;
//  2. stamp, under the mutex that orders the PChannel: a TimeTick from the
//     allocator, then every interceptor in chain order (replicate, lock,
//     lifecycle, shard, txn), each of which may refuse the append and change nothing,
//     then the LastConfirmedMessageID and the term; the message is handed
//     to the writer inside the same critical section, so stream order is
//     TimeTick order;
//  3. finish, once the writer resolved it, landed or not: the ack manager
//     confirms its TimeTick, the interceptors record the outcome in
//     reverse order, and its lock is released.
//
// # LastConfirmedMessageID
//
// A message's MessageID is known only after it lands, so the WAL stamps a
// safe lower bound of what DESIGN.md defines: the smallest of one past
// the largest MessageID acknowledged so far (which every message queued
// from now on lands above) and the same bound recorded when each
// transaction still open began. When appends are not pipelined the bound
// is exact; under load it trails by at most the messages in flight. A
// reader starting there and filtering on TimeTick sees exactly what it
// should.
//
// # Transactions
//
// The WAL gives each transaction its BeginTxn's TimeTick as TxnID (unique
// in the PChannel). Sessions survive a change of owner: recovery replays
// them from the stream, so a client may go on with a transaction on the
// new owner until its keepalive runs out. [WAL.AppendTxn] lands a whole
// transaction (begin, bodies, commit) as one atomic batch.
//
// # TimeTicks
//
// A sync loop runs every Config.SyncInterval: when anything landed since
// the last persisted TimeTick message it appends one; otherwise, when no
// append is in flight, it publishes a [messages.LiveTick] on core NATS so
// that live readers still advance. It also expires idle transactions, and
// drops the rest of the current TimeTick batch, so that TimeTick time (in
// which keepalives are measured) trails the oracle's clock by at most one
// interval.
//
// # Replication (DESIGN.md §1, §11)
//
// A WAL takes its role from its own log: the topology of the last
// AlterReplicateConfig that landed on it, from the moment it landed (it
// holds the PChannel exclusively, so nothing is in flight across it).
// Until the first one, the cluster takes writes as a primary. The
// replicate stage, first in the chain, refuses on a secondary every
// message without a replicate header with streamwal.ErrNotPrimary naming
// the primary (unreplicable messages, which stay in their cluster,
// excepted), and on a primary every replica with
// streamwal.ErrNotSecondary, as it does a replica from another cluster
// than the secondary's source.
//
// Replicas are deduplicated by their source TimeTick: the WAL keeps the
// replicate header of the replica with the highest source TimeTick that
// landed (the source position, [WAL.Replication]), and refuses a replica
// at or below it with streamwal.ErrDuplicate (it landed before: a
// replicator that restarted behind what landed takes that as done), and
// one at or below a replica still in flight as unavailable (retriable: it
// may yet be lost). A replicated transaction is appended whole
// ([WAL.AppendUnits]) and keyed by its CommitTxn. The topology and the
// source position are in the recovery checkpoint (its Replication field)
// and rebuilt by the replay, so they survive a restart or a change of
// owner.
//
// # Open and recovery
//
// [Open] appends the RecoveryBarrier under the given term (fencing every
// earlier owner), replays the stream through the barrier to rebuild
// transaction, lifecycle and segment state, and only then takes appends.
// Locks need no recovery: they live only as long as an append. A
// state-changing append (DDL) whose outcome the writer cannot tell leaves
// the in-memory state uncertain; the WAL then stops with
// streamwal.ErrUnrecoverable, and the node reopens it under a new term. A
// fenced WAL stops and answers streamwal.ErrFenced.
//
// # Recovery storage (Config.Storage, DESIGN.md §10)
//
// Without storage the replay starts at the stream's first message, so an
// open takes as long as the log is long. With it:
//
//   - A ledger consumes what the WAL lands, in MessageID order and without
//     a gap: appends resolve out of order, so it holds the early ones until
//     the gap below them fills, and reads from the stream a message it
//     waited for too long (an append whose outcome the writer could not
//     tell, which landed). It keeps the checkpoint (the TimeTick and
//     MessageID consumed through, the LastConfirmedMessageID of that
//     message as where a replay starts, the highest MessageID handed out,
//     the truncation point applied, and a digest of the last message
//     consumed) and, from the same messages, the VChannel metadata (a
//     lifecycle table of its own) and the segment metadata (a shard
//     manager of its own).
//   - A storage loop persists rounds (package recovery: metadata first,
//     checkpoint last, each compare-and-set under the owner's term): every
//     Cadence.Interval, at once past Cadence.Dirty messages but at most ten
//     a second, and once more on a graceful Close. A newer owner's claim
//     on the checkpoint stops the WAL as fenced.
//   - Open loads the checkpoint and metadata, checks that the stream still
//     holds the history the checkpoint records (see below), claims the
//     checkpoint, lands the barrier and replays from the checkpoint's
//     MessageID: open time depends on what landed since the last round,
//     not on the log's size. Replayed messages the checkpoint (or metadata
//     written ahead of it) covers feed only the transaction table; a
//     message of a dropped or unknown collection, or of an unknown
//     segment, changes nothing and is counted in Recovery.Skipped.
//
// # Shard management
//
// The shard stage (after the lifecycle stage, before the txn stage)
// assigns every Insert of a live VChannel to the growing segment of its
// partition and stamps the segment ID on it. A segment that does not
// exist yet is opened by a CreateSegment that the WAL puts in front of
// the insert in the same atomic unit, so that it lands if and only if the
// insert does; its TimeTick is the segment's ID. ManualFlush, DropPartition,
// DropCollection, TruncateCollection and FlushAll seal what they cover
// when they are stamped (they hold exclusive locks, so no insert of theirs
// is in flight); the seal policies of package shard run every sync
// interval. A sealed segment whose inserts all resolved and that no open
// transaction holds gets a Flush, appended by the WAL; once the ledger
// consumed that Flush, the tiering loop streams the segment's inserts from
// the stream to the object store with a manifest (Tiers), in constant
// memory, and only then marks the segment flushed in the metadata.
//
// # Truncation
//
// Every Storage.TruncateInterval the stream is truncated below the
// smallest of: the persisted checkpoint's replay start, the first message
// of every segment not yet flushed, the durable readers' holds, and the
// retention floor (the first message younger than Storage.Retain, found
// by a binary search on TimeTicks). The backend archives what it removes
// (jetstream.Options.Archive), so the log stays readable from its first
// message. The point applied is persisted with the next checkpoint.
//
// # History is never rewritten
//
// A stream whose files were cut or replaced while its server was down may
// hold less than was acknowledged; appending to it would hand out
// MessageIDs that readers already saw for other messages. Open compares
// the stream with the checkpoint: a stream that ends below the highest
// MessageID handed out, or holds another message at the last one
// consumed, is refused with streamwal.ErrHistoryLost (and a loud log)
// before the barrier lands. Only an operator's consent (`streamwal
// pchannel accept-loss`, recovery.WriteAcceptLoss) lets the next open
// continue, above every MessageID ever handed out, after archiving what
// the stream still holds. What landed after the last persisted round is
// beyond this check: the checkpoint trails the tail by at most one round.
package wal
