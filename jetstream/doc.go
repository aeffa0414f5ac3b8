// Package jetstream is streamwal's WAL backend: one JetStream stream per
// PChannel, one fenced writer at a time, appends group-committed as
// JetStream atomic batches.
//
// # Interface
//
// [Backend] is what the node's WAL uses: [Backend.OpenWriter] opens a
// PChannel for writing under a term and returns a [Writer];
// [Backend.Read] returns a [Scanner] from a [StartPosition] with subject
// filters; [Backend.Truncate] drops the log below a MessageID (archiving
// it first with [Options.Archive]); [Backend.State] says what the log
// holds. [JetStream] is the implementation; it is also the
// [SegmentStore] of flushed segments, and [JetStream.Advance] moves a
// stream past lost history. The exported conformance suite (package
// jetstream/conformance) is what any implementation must pass.
//
// # The sequencer
//
// Each open Writer owns one goroutine, the sequencer, that takes appends in
// arrival order and writes them in that order on one connection. Its
// decisions (which appends form the next unit, what it expects, when it
// goes out, what an answer or the tail settles) are made by a pure core,
// package jetstream/pipeline, with no connection and no clock; the
// sequencer is the I/O shell that feeds it events and carries out what it
// decides, and the rules below are stated and tested there. An Append
// call never spans two units, so the messages of one call land atomically
// and contiguously. A unit is either a plain publish (one message: atomic by
// itself and cheapest) or a JetStream atomic batch of at most
// [Options.MaxBatch] messages (default 1000). Units are pipelined: several
// are in flight while new appends queue up.
//
// Two modes, measured by BenchmarkAppend:
//
//   - Default: every append goes out on its own as soon as the pipeline has
//     room (up to [Options.MaxInFlightMsgs] messages). Best when the server
//     does not fsync each write: an R1 atomic batch is staged in a file store
//     of its own, a fixed cost that pipelined plain publishes avoid. In a run
//     of plain publishes sent back to back, only the last (and every 64th)
//     asks for an answer: each publish expects the message ID and sequence
//     of the one before it, so an answered one vouches for those before it.
//   - [Options.GroupCommit]: one unit in flight; everything that arrives
//     meanwhile goes out as the next unit, one atomic batch. Best when the
//     server fsyncs before acknowledging (SyncAlways): one batch costs one
//     fsync instead of one per message. A second unit goes out early only
//     when a full batch is already waiting, so that the server starts on it
//     as soon as it finished the first instead of after a round trip.
//     A short queue of one-message appends ([Options.PlainUpTo], 8 by
//     default on one replica) goes out as plain publishes pipelined one
//     behind the other instead: an R1 atomic batch's staging costs more
//     than a few fsyncs, which a handful of messages do not repay
//     (BenchmarkAppendPolicy measures it).
//
// Every unit is conditioned so that the stream grows only along the prefix
// this writer has seen, and so that nothing of this writer can land after a
// newer owner's barrier:
//
//   - Nats-Expected-Last-Sequence on its first message: the sequence the unit
//     must follow (the end of the unit before it);
//   - a plain publish also carries Nats-Expected-Last-Msg-Id, the ID of the
//     message it must follow. A newer owner's barrier (or anything else)
//     landing in between makes every later unit of this writer fail, even
//     one whose expected sequence happens to match the new tail;
//   - an atomic batch cannot expect a message ID, so its first message
//     carries Nats-Expected-Last-Subject-Sequence on the RecoveryBarrier
//     subject instead: the sequence of this writer's own barrier, which a
//     newer barrier changes. So does a plain publish that follows a
//     caller's message ID, which a newer owner may store again (a client
//     retrying there); one that follows an ID of this writer needs not.
//
// Every message carries a unique Nats-Msg-Id (the caller's, or one the
// writer makes) and Wal-Term, its writer's term. jetstreamext's batch
// publisher waits for each commit's acknowledgement before it returns, so
// it cannot keep several units in flight in order; the sequencer therefore
// speaks the atomic-batch headers itself (ADR-50) on one connection, with one
// reply subscription for all units.
//
// On R3 streams the server refuses a second pending expectation on one
// subject until the first is applied, so with Replicas > 1 a unit that
// expects the barrier subject waits until no other such unit is in
// flight, and the sequencer group-commits whatever the options say: that
// unit gathers everything that waited. A lone plain publish that follows
// an ID of this writer expects none, so it goes out at once behind the
// unit in flight, and appends that trickle in do not wait a whole round
// trip first. BenchmarkAppendReplicas measures it beside raw asynchronous
// publishes to an R3 stream.
//
// # Failures
//
// When a batch fails (wrong last sequence, timeout, lost connection), the
// sequencer stops sending, reads the stream's tail from the last sequence
// it knows it wrote, and resolves every unacknowledged batch: a batch whose
// message IDs are in the tail landed (its callers get their MessageIDs);
// the others are re-published in order, with the same IDs, after the tail.
// If the tail holds a RecoveryBarrier of a higher term, the writer is
// fenced: every pending and later append fails with streamwal.ErrFenced and
// the writer stops. A caller that stops waiting before its append is
// resolved gets streamwal.ErrUnknownOutcome, never a silent success; an
// append the sequencer had not started yet fails with the context's error
// and is never written.
//
// A batch rejected because one of its message IDs was already stored (an
// append retried by a client after its first attempt landed) is re-sent
// message by message; duplicates then resolve to the sequence of the
// original.
//
// # Durability
//
// An acknowledged append is written to the server. What that survives
// depends on the server:
//
//   - SyncAlways off (nats-server default): acknowledged after the write to
//     the operating system, fsynced every two minutes. Survives a crash of
//     the streamwal process and of the nats-server process; a machine crash
//     or power loss can lose the last acknowledged writes (Jepsen observed
//     exactly this in 2025).
//   - SyncAlways on (the embedded default of `streamwal serve`): fsync
//     before acknowledgement; an R1 atomic batch costs one fsync, which is
//     why group commit keeps this mode fast. Survives a machine crash.
//   - Replicas 3 on a NATS cluster: acknowledged after a quorum stored it;
//     survives the loss of one member (with SyncAlways, even the loss of the
//     whole machine of one member at any time, and of all machines if the
//     quorum fsynced).
//
// If the stream ever holds less than the writer knows it acknowledged
// (state lost under the first mode), the writer stops with
// streamwal.ErrUnrecoverable rather than write over the gap.
//
// # Reading
//
// A [Scanner] is a JetStream ordered consumer: it delivers in stream order,
// and after a server restart or reconnect it re-creates itself from the
// last sequence it delivered, so nothing is lost or repeated. Close and
// context cancellation stop it promptly.
//
// # Tiered storage
//
// With [Options.Archive], Truncate keeps what it removes in the object
// store wal_<c>_segments (created on first use with the backend's storage
// and replicas), so the log stays readable from its first message
// (DESIGN.md §10):
//
//  1. It copies every message the stream stores from the archive's end A
//     up to below-1 (never past the stream's last message, so that an
//     append racing the truncation is neither archived nor purged) into
//     objects named streamwal.ArchiveObjectName(p, first, last) of at
//     most [Options.ArchiveObjectBytes] (8 MiB): each object is the
//     messages framed one after the other, MessageID, subject, headers and
//     data, as the stream stored them (see frame.go). A range covers IDs,
//     not counts: IDs the stream no longer held (old barriers) are absent.
//  2. It records the new end in the index object
//     streamwal.ArchiveIndexName(p): JSON ranges {first, last, name, count,
//     bytes, checksum (hex SHA-256)}, contiguous from 1.
//  3. It purges the stream below the new end as before, keeping the newest
//     RecoveryBarrier (so the barrier is both archived and in the stream).
//
// Every step is safe to repeat after a crash: an object is named in the
// index's orphans before it is written, and the next truncation deletes
// the orphans the index does not name; a range indexed but not purged is
// purged by the next truncation, and reads meanwhile deliver it once. A
// new range merges the last indexed ranges that are no larger than it
// while the whole fits in one object (the merged objects are deleted after
// the index names the new one), so the index keeps about one range per
// object's worth of messages however often a PChannel is truncated, and
// each message is rewritten a logarithmic number of times. Truncations of
// one PChannel are serialized within a backend; run them from one backend
// only (the owner's), since the index is rewritten without a
// compare-and-set.
//
// A read whose start (Earliest, From, After) lies below A first delivers
// the archived messages from the start up to A-1, matched against the
// filters like a consumer's filter subjects, then continues on the stream
// from A: no gap, no repeat, the same order, and the barrier kept below A
// is delivered once, from the archive. A goroutine fetches the next object
// (and checks its checksum) while the caller decodes the current one.
// When it reaches A it reads the index again and goes on if a truncation
// moved A meanwhile, and an object merged away under it is found in the
// newer index. Once on the stream, a scanner is an ordered consumer like
// any other: a truncation that overtakes it purges messages it has not
// read yet (truncate below your readers' positions, as DESIGN.md §10
// says). Get reads a message truncated from the stream from the archive.
// A start at or above A, Latest, and every read without Archive, are
// served by the stream alone, exactly as before.
//
// [JetStream.State] reports the first message kept (above the truncation
// point; without an archive, a barrier followed by a gap at the stream's
// start was kept below it), the last, their count and the archive's end.
// [JetStream.Advance] is for an operator accepting lost history: it
// archives what the stream holds and purges it whole with a sequence, so
// that the next message stored gets the ID asked for.
//
// Flushed segments ([SegmentStore]) use the same object store and
// framing: one object per segment (streamwal.SegmentObjectName), its
// [SegmentManifest] as JSON in the object's metadata, its checksum the
// SHA-256 of the object. The messages are re-encoded from their immutable
// form and checked to decode back to themselves. They are uploaded as
// they are read, so a segment of any size takes constant memory; the
// manifest is added to the object last, and an object without one (an
// upload cut short) is neither listed nor read, and is replaced by the
// next write. Segments lists the whole object store.
package jetstream
