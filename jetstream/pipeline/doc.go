// Package pipeline is the deterministic core of a JetStream writer: the
// order, grouping, fencing and settling of appends on one PChannel, with
// no connection and no clock.
//
// A writer's sequencer goroutine (package jetstream) is the I/O shell
// around a Pipeline, in the manner of etcd raft's RawNode. The shell feeds
// it events, each with the time it happened:
//
//   - Enqueue: an append to send, in order;
//   - Next: asks for the next unit to publish (a plain publish or an
//     atomic batch), which the pipeline reserves in the stream;
//   - Refused, SendFailed: the client library refused a message, or the
//     connection failed while a unit went out;
//   - Ack: the server's answer to a unit;
//   - Tick: the time passed (deadlines, pauses);
//   - Reconnected: the connection was re-established;
//   - StartScan, Scan.Judge, EndScan: the tail of the stream, read when
//     the pipeline asked for it (NeedScan);
//   - Close, Halt, Stop: the writer closes or breaks.
//
// and takes what the pipeline decided with Ready: the appends resolved
// (stream sequences) or failed, the recoveries started, the messages
// found where they must never be. Deadline says when the pipeline next
// needs a Tick; Done, when the shell may stop.
//
// # What it decides
//
// Units: with group commit every queued append up to MaxBatch messages
// goes into one unit, at most MaxInFlight units in flight (two when a
// full batch waits); without it one append per unit, bounded by
// MaxInFlight atomic batches and MaxInFlightMsgs messages. Each unit's
// first message expects the stream's last sequence to be where the units
// before it end, and, when it could otherwise land after a newer owner's
// barrier, the barrier subject's last sequence to be this writer's
// barrier (Unit.Fenced). A plain publish that follows this writer's own
// message ID needs no fence: only this writer stores that ID. On a
// replicated stream the server keeps one barrier expectation in flight,
// so fenced units go one at a time and unfenced publishes go out behind
// them. A plain publish followed at once by another one of this writer
// goes out quiet (no reply subject): its follower's ack answers for it.
//
// Acks resolve their unit and every unit before it, which followed the
// sequence they expected under this writer's fence. Anything else (a
// refusal, a timeout, a lost connection, an ack that does not match)
// starts a recovery: the pipeline waits for the answers still due, asks
// for the tail of the stream from the last acknowledged sequence, and
// settles every unit in flight against it: what landed resolves with its
// sequences, the rest goes back to the front of the queue in order; a
// newer owner's barrier fences the writer (what did not land before it
// never will), a stranger's message stops it.
//
// # Invariants
//
// CheckInvariants states what holds between any two events (tests call it
// after every step): the in-flight counters count the in-flight list;
// the tail is the acknowledged sequence plus the messages in flight; the
// last message ID sent is the last in-flight unit's, or the acknowledged
// one; units are numbered in the order they went out; a replicated stream
// has at most one fenced unit in flight; no append is in two places; the
// acknowledged sequence never moves below the barrier.
package pipeline
