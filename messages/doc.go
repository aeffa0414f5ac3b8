// Package messages is streamwal's message model: the catalog of message
// types (DESIGN.md §5) declared as data, the registry through which an
// application adds its own types, the message states, and their encoding as
// NATS messages.
//
// # States
//
// A [MutableMessage] is built before append; the WAL's interceptors attach
// properties to it (TimeTick, LastConfirmedMessageID, transaction context,
// term). Once appended it becomes an [ImmutableMessage] with a [MessageID]
// (the JetStream stream sequence) and never changes again. A
// [BroadcastMessage] is one message aimed at several channels; [BroadcastMessage.Split]
// turns it into one MutableMessage per target, each carrying the same
// [BroadcastHeader]. A replicate message ([Codec.NewReplicate]) is an
// immutable message of another cluster re-entering this cluster's WAL with
// its source identity kept in a [ReplicateHeader]. A committed transaction is
// read back as one synthetic ImmutableMessage of type [TypeTxn]
// ([NewTxnMessage]) that holds its BeginTxn, body and CommitTxn messages.
//
// # Encoding
//
// On the wire a message is a NATS message: its subject comes from the root
// package's namespace, its properties are human-readable headers (Wal-Type,
// Wal-VChannel, Wal-TimeTick, ..., W3C traceparent/tracestate, application
// properties under Wal-App-), and its payload is the caller's bytes for DML
// and application types and a JSON document for the built-in types the WAL
// interprets (see bodies.go). Every header is validated on decode; malformed
// input is an error wrapping streamwal.ErrInvalidArgument and never a panic.
package messages
