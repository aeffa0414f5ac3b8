package shard

import (
	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// hold is what one open transaction holds.
type hold struct {
	v    streamwal.VChannel
	segs map[int64]struct{}
	// live: the live side took it, and only TxnEnded ends it; otherwise
	// Apply lets it go once a message's TimeTick passes deadline.
	live     bool
	deadline messages.TimeTick
}

// hold makes transaction txn hold segment s.
func (m *Manager) hold(txn messages.TxnID, s *segment) *hold {
	h, ok := m.txns[txn]
	if !ok {
		h = &hold{v: s.VChannel, segs: map[int64]struct{}{}}
		m.txns[txn] = h
	}
	h.segs[s.ID] = struct{}{}
	if s.holds == nil {
		s.holds = map[messages.TxnID]struct{}{}
	}
	s.holds[txn] = struct{}{}
	return h
}

// release ends every hold of transaction txn.
func (m *Manager) release(txn messages.TxnID) {
	h, ok := m.txns[txn]
	if !ok {
		return
	}
	for id := range h.segs {
		if s, ok := m.segs[id]; ok {
			delete(s.holds, txn)
		}
	}
	delete(m.txns, txn)
}

// dropHolds ends every hold on s.
func (m *Manager) dropHolds(s *segment) {
	for txn := range s.holds {
		if h, ok := m.txns[txn]; ok {
			delete(h.segs, s.ID)
			if len(h.segs) == 0 {
				delete(m.txns, txn)
			}
		}
	}
	s.holds = nil
}

// Apply records a message that landed in the WAL, in stream order (see
// the package doc): CreateSegment, inserts carrying a segment ID (any DML
// type: Apply counts what carries one), Flush, ManualFlush, DropPartition,
// DropCollection (which also flushes out the VChannel's segments, see
// Dropped), TruncateCollection and FlushAll; other messages only move
// transaction holds, and messages on the CChannel change no segment.
//
// Apply needs the stream's own messages in stream order: not the
// synthetic Txn message of a reader that assembles transactions, whose
// bodies come after messages that follow them in the stream. A message at
// or below the last one applied changes no segment. Apply never refuses a landed message: an error says what it could not make
// sense of (a malformed body, CodeInvalidArgument; an insert into an
// unknown or flushed-out segment, a Flush of an unknown segment,
// CodeLifecycle), for the caller to log, and the rest of the message is
// applied.
func (m *Manager) Apply(msg *messages.ImmutableMessage) error {
	if msg == nil || msg.ID() == 0 {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "shard apply of a nil message or one without a message id: %w", ErrMalformed)
	}
	m.txnTime(msg)
	if msg.ID() <= m.applied {
		if s := m.target(msg); s != nil && !s.flushedOut() {
			m.txnInsert(msg, s)
		}
		return nil
	}
	m.applied = msg.ID()
	if msg.VChannel().IsControl() {
		return nil
	}
	return m.apply(msg)
}

// Applied is the last message Apply applied, or Restore covered.
func (m *Manager) Applied() messages.MessageID { return m.applied }

// apply records a message not applied yet.
func (m *Manager) apply(msg *messages.ImmutableMessage) error {
	v := msg.VChannel()
	switch msg.Type() {
	case messages.TypeCreateSegment:
		return m.applyCreate(msg)
	case messages.TypeFlush:
		return m.applyFlush(msg)
	case messages.TypeManualFlush:
		m.SealVChannel(v, ReasonManual)
	case messages.TypeDropPartition:
		return m.applyDropPartition(msg)
	case messages.TypeDropCollection:
		m.drop(v, msg.ID())
	case messages.TypeTruncateCollection:
		m.SealVChannel(v, ReasonLifecycle)
	case messages.TypeFlushAll:
		m.SealAll(ReasonFlushAll)
	default:
		return m.applyInsert(msg)
	}
	return nil
}

// txnTime moves the transaction holds as txn.Table.Replay moves sessions:
// expired by the message's TimeTick, aborted by an exclusive operation,
// refreshed by a message of the transaction, ended by its commit or
// rollback.
func (m *Manager) txnTime(msg *messages.ImmutableMessage) {
	tt := msg.TimeTick()
	for txn, h := range m.txns {
		if !h.live && tt > h.deadline {
			m.release(txn)
		}
	}
	if lk := msg.Type().Lock; lk.Mode == messages.LockExclusive {
		all := lk.Scope == messages.ScopePChannel || msg.VChannel().IsZero()
		for txn, h := range m.txns {
			if all || h.v == msg.VChannel() {
				m.release(txn)
			}
		}
	}
	tc := msg.Txn()
	if tc == nil {
		return
	}
	switch msg.Type() {
	case messages.TypeCommitTxn, messages.TypeRollbackTxn:
		m.release(tc.ID)
	default:
		if h, ok := m.txns[tc.ID]; ok {
			refresh(h, msg)
		}
	}
}

// refresh moves the deadline of a hold Apply took to msg's TimeTick plus
// the transaction's keepalive.
func refresh(h *hold, msg *messages.ImmutableMessage) {
	if tc := msg.Txn(); tc != nil && !h.live {
		h.deadline = msg.TimeTick() + messages.TimeTick(tc.Keepalive.Milliseconds())<<messages.LogicalBits
	}
}

// txnInsert makes the transaction of an insert hold its segment.
func (m *Manager) txnInsert(msg *messages.ImmutableMessage, s *segment) {
	if tc := msg.Txn(); tc != nil {
		refresh(m.hold(tc.ID, s), msg)
	}
}

// target is the known segment of msg's VChannel that msg names in its DML
// header, if any.
func (m *Manager) target(msg *messages.ImmutableMessage) *segment {
	d, ok := msg.DML()
	if !ok {
		return nil
	}
	s, ok := m.segs[d.SegmentID]
	if !ok || s.VChannel != msg.VChannel() {
		return nil
	}
	return s
}

// applyInsert counts an insert that names its segment as landed.
func (m *Manager) applyInsert(msg *messages.ImmutableMessage) error {
	d, ok := msg.DML()
	if !ok || d.SegmentID == 0 {
		return nil
	}
	s := m.target(msg)
	switch {
	case s == nil:
		return streamwal.Errorf(streamwal.CodeLifecycle, "%s at %d on %s names segment %d: %w", msg.Type(), msg.ID(), msg.VChannel(), d.SegmentID, ErrUnknownSegment)
	case s.flushedOut():
		return streamwal.Errorf(streamwal.CodeLifecycle, "%s at %d on %s lands in segment %d after its flush-out at %d; not counted: %w", msg.Type(), msg.ID(), msg.VChannel(), s.ID, s.FlushedAt, ErrSealed)
	}
	bytes := InsertBytes(msg)
	s.land(d.Rows, bytes, msg.ID(), msg.TimeTick())
	if t := msg.TimeTick().Physical(); t.After(s.LastInsert) {
		s.LastInsert = t
	}
	m.count(s, bytes)
	m.txnInsert(msg, s)
	return nil
}

// applyCreate creates the segment of a CreateSegment if it is new. A
// segment still growing on the same VChannel and partition was sealed by
// the writer (a policy that writes no message): it is sealed here as
// ReasonReplaced, until its Flush names the reason.
func (m *Manager) applyCreate(msg *messages.ImmutableMessage) error {
	var b messages.CreateSegmentBody
	if err := msg.Body(&b); err != nil {
		return malformed(msg, "%w", err)
	}
	v := msg.VChannel()
	switch {
	case b.SegmentID <= 0:
		return malformed(msg, "segment id %d is not positive", b.SegmentID)
	case b.CollectionID != 0 && b.CollectionID != v.CollectionID():
		return malformed(msg, "body names collection %d", b.CollectionID)
	}
	if _, ok := m.segs[b.SegmentID]; ok {
		return nil
	}
	if b.SegmentID <= m.forgotten {
		return streamwal.Errorf(streamwal.CodeLifecycle, "CreateSegment at %d on %s: segment %d was forgotten: %w", msg.ID(), v, b.SegmentID, ErrIDUsed)
	}
	k := key{v, partitionOf(b.PartitionID)}
	if old, ok := m.growing[k]; ok {
		m.seal(m.segs[old], ReasonReplaced)
	}
	m.add(k, b.SegmentID, msg.TimeTick().Physical(), derived(b.SegmentID))
	return nil
}

// applyFlush flushes out the segments a Flush names. The Flush names why
// its writer sealed them, which Apply may have guessed otherwise (a seal
// message that came after the writer's policy sealed them, or
// ReasonReplaced): its reason replaces theirs.
func (m *Manager) applyFlush(msg *messages.ImmutableMessage) error {
	var b messages.FlushBody
	if err := msg.Body(&b); err != nil {
		return malformed(msg, "%w", err)
	}
	var unknown []int64
	for _, id := range b.SegmentIDs {
		s, ok := m.segs[id]
		if !ok || s.VChannel != msg.VChannel() {
			unknown = append(unknown, id)
			continue
		}
		if b.Reason != "" && !s.flushedOut() {
			s.Reason = Reason(b.Reason)
		}
		m.flushOut(s, msg.ID(), Reason(b.Reason))
	}
	if len(unknown) > 0 {
		return streamwal.Errorf(streamwal.CodeLifecycle, "Flush at %d on %s names segments %v it does not have: %w", msg.ID(), msg.VChannel(), unknown, ErrUnknownSegment)
	}
	return nil
}

// applyDropPartition seals the growing segment of a dropped partition.
func (m *Manager) applyDropPartition(msg *messages.ImmutableMessage) error {
	var b messages.PartitionBody
	if err := msg.Body(&b); err != nil {
		return malformed(msg, "%w", err)
	}
	if b.PartitionID <= 0 {
		return malformed(msg, "partition id %d is not positive", b.PartitionID)
	}
	m.SealPartition(msg.VChannel(), b.PartitionID, ReasonLifecycle)
	return nil
}

// malformed builds the invalid-argument error of a body Apply cannot use.
func malformed(msg *messages.ImmutableMessage, format string, args ...any) error {
	args = append([]any{msg.Type(), msg.ID(), msg.VChannel()}, args...)
	args = append(args, ErrMalformed)
	return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s at %d on %s: "+format+": %w", args...)
}

// Hold makes open transaction txn hold segment id, as the live side does
// (only TxnEnded ends it): a WAL going live after a replay carries over
// the holds of the transactions still open. An unknown segment is an
// error.
func (m *Manager) Hold(txn messages.TxnID, id int64) error {
	s, ok := m.segs[id]
	if !ok {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "hold of segment %d by transaction %d: %w", id, txn, ErrUnknownSegment)
	}
	m.hold(txn, s).live = true
	return nil
}
