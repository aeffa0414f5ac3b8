// Package read is the read pipeline of a PChannel (DESIGN.md §3 "Read
// path"), shared by the node and the client: it turns the stream back into
// the total order the WAL promises.
//
// An [Assembler] is the deterministic core, fed the stream's messages in
// stream order (which is TimeTick order) and live ticks: it assembles each
// committed transaction into one synthetic Txn message at its CommitTxn's
// TimeTick and LastConfirmedMessageID, drops rolled-back, aborted and
// expired transactions, applies the type and TimeTick filters, and keeps
// the visibility watermark. A [Scanner] feeds it from a JetStream ordered
// consumer and the PChannel's live ticks.
//
// Transaction rules mirror the writer's (package txn): a transaction
// expires when a message's TimeTick passes its last activity plus its
// keepalive, and an exclusive message on a VChannel (or the PChannel) ends
// the transactions open on it. A reader that starts inside a transaction
// (after its BeginTxn) does not see it; start at a message's
// LastConfirmedMessageID to see every transaction that commits after it.
package read

import (
	"github.com/streamwal/streamwal/messages"
)

// session is a transaction being assembled.
type session struct {
	begin    *messages.ImmutableMessage
	body     []*messages.ImmutableMessage
	deadline messages.TimeTick
}

// Filter selects what an Assembler delivers.
type Filter struct {
	// Types are the types to deliver; empty means every type but the
	// WAL's own (TimeTick, RecoveryBarrier) and the transaction control
	// messages, which arrive assembled as Txn. A Txn is delivered when
	// TypeTxn or the type of one of its bodies is listed.
	Types []*messages.Type
	// From drops messages with a TimeTick below it.
	From messages.TimeTick
}

// Assembler is the read pipeline's core. It is a plain data structure, not
// safe for concurrent use.
type Assembler struct {
	types     map[*messages.Type]bool
	from      messages.TimeTick
	sessions  map[messages.TxnID]*session
	next      messages.TimeTick // the earliest session deadline
	watermark messages.TimeTick
	last      messages.MessageID
	term      uint64              // the highest writer term pushed
	ticks     []messages.LiveTick // live ticks waiting for their covered message
}

// NewAssembler returns an assembler delivering what f selects.
func NewAssembler(f Filter) *Assembler {
	a := &Assembler{from: f.From, sessions: map[messages.TxnID]*session{}}
	if len(f.Types) > 0 {
		a.types = map[*messages.Type]bool{}
		for _, t := range f.Types {
			a.types[t] = true
		}
	}
	return a
}

// Watermark is the largest TimeTick the assembler knows complete: every
// message with a TimeTick at or below it has been pushed.
func (a *Assembler) Watermark() messages.TimeTick { return a.watermark }

// StartAfter tells an assembler that its stream starts after id (the
// reader skipped everything up to it), so that a live tick covering id
// applies before anything is pushed.
func (a *Assembler) StartAfter(id messages.MessageID) { a.last = max(a.last, id) }

// Last is the MessageID of the last message pushed.
func (a *Assembler) Last() messages.MessageID { return a.last }

// Open is how many transactions are being assembled.
func (a *Assembler) Open() int { return len(a.sessions) }

// Push takes the next message of the stream and returns what it makes
// deliverable (nothing, the message, or an assembled transaction).
func (a *Assembler) Push(m *messages.ImmutableMessage) *messages.ImmutableMessage {
	tt := m.TimeTick()
	a.last = m.ID()
	a.term = max(a.term, m.Term())
	a.advance(tt)
	a.applyTicks()
	if len(a.sessions) > 0 && tt > a.next {
		a.expire(tt)
	}
	if lk := m.Type().Lock; lk.Mode == messages.LockExclusive {
		a.abort(m, lk.Scope == messages.ScopePChannel)
	}
	if tc := m.Txn(); tc != nil {
		return a.txn(m, tc)
	}
	if !a.wants(m) {
		return nil
	}
	return m
}

// PushTick takes a live tick of the PChannel.
func (a *Assembler) PushTick(t messages.LiveTick) {
	if t.TimeTick <= a.watermark || t.Term < a.term {
		return // stale, or from an owner already replaced
	}
	a.ticks = append(a.ticks, t)
	a.applyTicks()
}

// applyTicks advances the watermark by the live ticks whose covered
// message has been pushed.
func (a *Assembler) applyTicks() {
	kept := a.ticks[:0]
	for _, t := range a.ticks {
		if t.Term < a.term {
			continue
		}
		if t.Covers <= a.last {
			a.advance(t.TimeTick)
			continue
		}
		kept = append(kept, t)
	}
	a.ticks = kept
}

// advance raises the watermark (never lowers it).
func (a *Assembler) advance(tt messages.TimeTick) { a.watermark = max(a.watermark, tt) }

// wants applies the filters to a plain message.
func (a *Assembler) wants(m *messages.ImmutableMessage) bool {
	if m.TimeTick() < a.from {
		return false
	}
	t := m.Type()
	if a.types != nil {
		return a.types[t]
	}
	return t != messages.TypeTimeTick && t != messages.TypeRecoveryBarrier
}

// txn handles a transaction message.
func (a *Assembler) txn(m *messages.ImmutableMessage, tc *messages.TxnContext) *messages.ImmutableMessage {
	s := a.sessions[tc.ID]
	switch m.Type() {
	case messages.TypeBeginTxn:
		a.sessions[tc.ID] = &session{begin: m, deadline: deadline(m.TimeTick(), tc)}
		a.next = min(a.next, a.sessions[tc.ID].deadline)
		if len(a.sessions) == 1 {
			a.next = a.sessions[tc.ID].deadline
		}
	case messages.TypeRollbackTxn:
		delete(a.sessions, tc.ID)
	case messages.TypeCommitTxn:
		delete(a.sessions, tc.ID)
		if s == nil || s.begin.VChannel() != m.VChannel() {
			return nil
		}
		out, err := messages.NewTxnMessage(s.begin, s.body, m)
		if err != nil || !a.wantsTxn(out) {
			return nil
		}
		return out
	default:
		if s != nil && s.begin.VChannel() == m.VChannel() {
			s.body = append(s.body, m)
			s.deadline = deadline(m.TimeTick(), tc)
		}
	}
	return nil
}

// wantsTxn applies the filters to an assembled transaction.
func (a *Assembler) wantsTxn(m *messages.ImmutableMessage) bool {
	if m.TimeTick() < a.from {
		return false
	}
	if a.types == nil || a.types[messages.TypeTxn] {
		return true
	}
	for _, b := range m.TxnBody() {
		if a.types[b.Type()] {
			return true
		}
	}
	return false
}

// deadline is the last TimeTick at which a transaction active at tt lives.
func deadline(tt messages.TimeTick, tc *messages.TxnContext) messages.TimeTick {
	return tt + messages.TimeTick(tc.Keepalive.Milliseconds())<<messages.LogicalBits
}

// expire drops the sessions whose deadline is before tt.
func (a *Assembler) expire(tt messages.TimeTick) {
	a.next = ^messages.TimeTick(0)
	for id, s := range a.sessions {
		if tt > s.deadline {
			delete(a.sessions, id)
			continue
		}
		a.next = min(a.next, s.deadline)
	}
}

// abort drops the sessions an exclusive message ends.
func (a *Assembler) abort(m *messages.ImmutableMessage, all bool) {
	for id, s := range a.sessions {
		if all || s.begin.VChannel() == m.VChannel() {
			delete(a.sessions, id)
		}
	}
}
