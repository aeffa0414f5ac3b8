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
//     allocator, then every interceptor in chain order (lock, txn,
//     lifecycle), each of which may refuse the append and change nothing,
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
// # Open and recovery
//
// [Open] appends the RecoveryBarrier under the given term (fencing every
// earlier owner), replays the stream from its first message through the
// barrier to rebuild transaction and lifecycle state, and only then takes
// appends. Locks need no recovery: they live only as long as an append.
// A state-changing append (DDL) whose outcome the writer cannot tell
// leaves the in-memory state uncertain; the WAL then stops with
// streamwal.ErrUnrecoverable, and the node reopens it under a new term.
// A fenced WAL stops and answers streamwal.ErrFenced.
package wal
