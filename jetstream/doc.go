// Package jetstream is streamwal's WAL backend: one JetStream stream per
// PChannel, one fenced writer at a time, appends group-committed as
// JetStream atomic batches.
//
// # Interface
//
// [Backend] is what the node's WAL uses: [Backend.OpenWriter] opens a
// PChannel for writing under a term and returns a [Writer];
// [Backend.Read] returns a [Scanner] from a [StartPosition] with subject
// filters; [Backend.Truncate] drops the log below a MessageID. [JetStream]
// is the implementation; the exported conformance suite (package
// jetstream/conformance) is what any implementation must pass.
//
// # The sequencer
//
// Each open Writer owns one goroutine, the sequencer, that takes appends in
// arrival order and writes them as atomic batches of at most
// [Options.MaxBatch] messages (default 1000). An Append call never spans
// two batches, so the messages of one call land atomically and contiguously.
// Under light load a single message goes out at once; under load up to
// [Options.MaxInFlight] batches are in flight while new appends queue up
// and form the next, larger batch (group commit).
//
// Every batch's first message carries two conditions, checked by the server
// at commit:
//
//   - Nats-Expected-Last-Sequence: the stream sequence the batch must follow
//     (the previous batch's last sequence), so the stream grows only along
//     the prefix this writer has seen;
//   - Nats-Expected-Last-Subject-Sequence on the RecoveryBarrier subject: the
//     sequence of this writer's own barrier. A newer owner's barrier changes
//     it, so no batch of a fenced writer can land after that barrier, even a
//     pipelined one whose expected sequence happens to match the new tail.
//
// Every message carries a unique Nats-Msg-Id (the caller's, or one the
// writer makes). jetstreamext's batch publisher waits for each commit's
// acknowledgement before it returns, so it cannot keep several batches in
// flight in order; the sequencer therefore speaks the atomic-batch headers
// itself (the names come from jetstreamext) on one connection, with one
// reply subscription for all commits.
//
// On R3 streams the server refuses a second in-flight expectation on the
// same subject until the first is applied, so with Replicas > 1 the
// sequencer keeps one batch in flight.
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
package jetstream
