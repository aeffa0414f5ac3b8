// Package txn is the transaction table of a PChannel's WAL (DESIGN.md §1
// "Transaction"). It is a plain data structure, not safe for concurrent
// use: the WAL drives it under the mutex that orders its appends, and
// passes it the TimeTick of every message it stamps, so that every rule is
// decided in TimeTick time and tested without goroutines.
//
// A session lives from its BeginTxn to its CommitTxn or RollbackTxn, on one
// VChannel:
//
//   - BeginTxn opens it with a keepalive; every body message refreshes its
//     last activity; it expires when a TimeTick passes last activity plus
//     keepalive (the read side applies the same rule, so a reader drops
//     exactly the transactions the writer refuses to commit);
//   - a body counts as in flight from the moment it is stamped until its
//     append resolved; a body that did not land fails the session;
//   - CommitTxn first closes the session to new bodies ([Table.StartCommit])
//     and waits for the bodies in flight, then is stamped ([Table.Commit]),
//     which fails if the session expired or lost a body meanwhile;
//   - an exclusive operation on the VChannel (or the whole PChannel) aborts
//     every open session on it.
//
// The table also answers the question LastConfirmedMessageID needs: the
// smallest BeginTxn position of the sessions still open ([Table.Oldest]).
package txn

import (
	"errors"
	"slices"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// Causes of transaction errors; match them with errors.Is. Each comes
// wrapped in a streamwal error of the code named.
var (
	// ErrUnknown: no such transaction (CodeTxnNotFound).
	ErrUnknown = errors.New("no such transaction")
	// ErrExpired: its keepalive ran out (CodeTxnExpired).
	ErrExpired = errors.New("transaction expired")
	// ErrCommitted: it was already committed, or its commit is under way
	// (CodeTxnInvalidState); a body arriving then is refused with it too.
	ErrCommitted = errors.New("transaction already committed")
	// ErrRolledBack: it was rolled back (CodeTxnInvalidState).
	ErrRolledBack = errors.New("transaction rolled back")
	// ErrAborted: an exclusive operation on its VChannel, or a body that
	// did not land, ended it (CodeTxnInvalidState).
	ErrAborted = errors.New("transaction aborted")
	// ErrWrongVChannel: the message targets another VChannel than the
	// transaction's (CodeInvalidArgument).
	ErrWrongVChannel = errors.New("transaction belongs to another vchannel")
	// ErrDuplicate: a BeginTxn reuses a live transaction's ID
	// (CodeInvalidArgument).
	ErrDuplicate = errors.New("transaction id already in use")
)

// State is where a session is in its life.
type State uint8

// Session states.
const (
	// Open: taking bodies.
	Open State = iota + 1
	// Committing: the commit waits for bodies in flight, or is stamped.
	Committing
	// Committed, RolledBack, Expired and Aborted are final.
	Committed
	RolledBack
	Expired
	Aborted
)

// String names the state.
func (s State) String() string {
	switch s {
	case Open:
		return "open"
	case Committing:
		return "committing"
	case Committed:
		return "committed"
	case RolledBack:
		return "rolled back"
	case Expired:
		return "expired"
	case Aborted:
		return "aborted"
	}
	return "invalid"
}

// Session is one transaction.
type Session struct {
	// ID and VChannel identify the transaction; Keepalive is how long it
	// lives after its last activity, in TimeTick time.
	ID        messages.TxnID
	VChannel  streamwal.VChannel
	Keepalive time.Duration
	// Begin is a MessageID at or below its BeginTxn's: where a reader must
	// start to see the whole transaction.
	Begin messages.MessageID
	// LastActivity is the TimeTick of its BeginTxn or latest body.
	LastActivity messages.TimeTick
	// Bodies counts the body messages stamped; InFlight those whose
	// appends have not resolved yet.
	Bodies   int
	InFlight int
	State    State
	// cause is why a final session ended (for its error).
	cause error
	// marks are the TimeTicks of the BeginTxn or last resolved body and of
	// the bodies stamped since, not refused: LastActivity is the last.
	marks []messages.TimeTick
	// drained is closed when a committing session has no body in flight.
	drained chan struct{}
}

// Context is the transaction context its messages carry.
func (s *Session) Context() messages.TxnContext {
	return messages.TxnContext{ID: s.ID, Keepalive: s.Keepalive}
}

// Deadline is the last TimeTick at which the session is still alive.
func (s *Session) Deadline() messages.TimeTick {
	return s.LastActivity + messages.TimeTick(s.Keepalive.Milliseconds())<<messages.LogicalBits
}

// live reports whether the session still counts for LastConfirmed: open
// or waiting to commit, not yet stamped to close.
func (s *Session) live() bool { return s.State == Open || s.State == Committing }

// Table holds the sessions of one PChannel.
type Table struct {
	sessions map[messages.TxnID]*Session
	// order holds sessions in BeginTxn order; dead ones are dropped from
	// the front lazily, so the first live one is the oldest.
	order []*Session
	// ended remembers why recently ended transactions ended, so that a
	// late body or commit gets the precise error rather than "unknown".
	ended map[messages.TxnID]error
	// endedOrder bounds ended to the most recent maxEnded.
	endedOrder []messages.TxnID
	// dead counts the ended sessions still in order.
	dead int
}

// compact drops ended sessions from order once they are most of it, so
// that a long-lived session at its front does not make Expire and Abort
// scan every ended one. It must not run while order is being iterated.
func (t *Table) compact() {
	if t.dead <= 64 || t.dead <= len(t.order)/2 {
		return
	}
	live := t.order[:0]
	for _, s := range t.order {
		if s.live() {
			live = append(live, s)
		}
	}
	clear(t.order[len(live):])
	t.order, t.dead = live, 0
}

// maxEnded bounds how many ended transactions the table remembers.
const maxEnded = 4096

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{sessions: map[messages.TxnID]*Session{}, ended: map[messages.TxnID]error{}}
}

// Begin opens a session whose BeginTxn is stamped at tt and will land at
// or above begin.
func (t *Table) Begin(id messages.TxnID, v streamwal.VChannel, keepalive time.Duration, tt messages.TimeTick, begin messages.MessageID) (*Session, error) {
	if id == 0 || v.IsZero() || keepalive < messages.MinKeepalive {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "begin txn %d on %q: needs an id, a vchannel and a keepalive of at least %v", id, v, messages.MinKeepalive)
	}
	if _, ok := t.sessions[id]; ok {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "begin txn %d: %w", id, ErrDuplicate)
	}
	s := &Session{ID: id, VChannel: v, Keepalive: keepalive, Begin: begin, LastActivity: tt, State: Open, marks: []messages.TimeTick{tt}}
	t.sessions[id] = s
	t.order = append(t.order, s)
	return s, nil
}

// Body checks that a body stamped at tt may join transaction id on v, and
// counts it in flight. It expires the session if tt is past its deadline.
func (t *Table) Body(id messages.TxnID, v streamwal.VChannel, tt messages.TimeTick) (*Session, error) {
	s, err := t.usable(id, v, tt)
	if err != nil {
		return nil, err
	}
	if s.State == Committing {
		return nil, streamwal.Errorf(streamwal.CodeTxnInvalidState, "body of txn %d: %w", id, ErrCommitted)
	}
	s.Bodies++
	s.InFlight++
	s.LastActivity = tt
	s.marks = append(s.marks, tt)
	return s, nil
}

// BodyDone records that a body's append resolved; a body that did not
// land (or may not have) aborts its session.
func (t *Table) BodyDone(id messages.TxnID, landed bool) {
	s, ok := t.sessions[id]
	if !ok {
		return
	}
	s.InFlight--
	if s.InFlight == 0 && len(s.marks) > 1 {
		// Nothing left to refuse: only the latest mark matters.
		s.marks = append(s.marks[:0], s.marks[len(s.marks)-1])
	}
	if !landed && s.live() {
		t.end(s, Aborted, streamwal.Errorf(streamwal.CodeTxnInvalidState, "txn %d: a body message did not land: %w", id, ErrAborted))
	}
	if s.InFlight > 0 {
		return
	}
	if s.drained != nil {
		close(s.drained)
		s.drained = nil
	}
	if !s.live() {
		delete(t.sessions, id)
	}
}

// CancelCommit reopens a session whose committer gave up waiting for its
// bodies, so that it can expire, take bodies or be committed again.
func (t *Table) CancelCommit(id messages.TxnID) {
	if s, ok := t.sessions[id]; ok && s.State == Committing {
		s.State = Open
		s.drained = nil
	}
}

// BeginDone records whether a BeginTxn landed; one that did not (or may
// not have) ends its session. Begin stays the bound it was given even
// once the exact position is known: Oldest relies on Begin growing in
// BeginTxn order, which exact positions and the bounds of sessions begun
// meanwhile need not respect together.
func (t *Table) BeginDone(id messages.TxnID, landed bool) {
	s, ok := t.sessions[id]
	if ok && !landed && s.live() {
		t.end(s, Aborted, streamwal.Errorf(streamwal.CodeTxnInvalidState, "txn %d: its BeginTxn did not land: %w", id, ErrAborted))
	}
}

// StartCommit closes session id to new bodies. The returned channel, if
// not nil, is closed when the bodies in flight have resolved; the caller
// waits for it and then calls Commit.
func (t *Table) StartCommit(id messages.TxnID, v streamwal.VChannel, tt messages.TimeTick) (<-chan struct{}, error) {
	s, err := t.usable(id, v, tt)
	if err != nil {
		return nil, err
	}
	if s.State == Committing {
		return nil, streamwal.Errorf(streamwal.CodeTxnInvalidState, "commit txn %d: %w", id, ErrCommitted)
	}
	s.State = Committing
	if s.InFlight == 0 {
		return nil, nil
	}
	s.drained = make(chan struct{})
	return s.drained, nil
}

// Commit decides, at the CommitTxn's TimeTick tt, whether the commit may
// be appended: the session is committing, has no body in flight, lost
// none and has not expired. On success the session is closed as committed
// and the number of bodies is returned.
func (t *Table) Commit(id messages.TxnID, v streamwal.VChannel, tt messages.TimeTick) (int, error) {
	s, err := t.usable(id, v, tt)
	if err != nil {
		return 0, err
	}
	if s.State != Committing || s.InFlight > 0 {
		return 0, streamwal.Errorf(streamwal.CodeInternal, "commit txn %d stamped while %s with %d bodies in flight", id, s.State, s.InFlight)
	}
	t.end(s, Committed, streamwal.Errorf(streamwal.CodeTxnInvalidState, "txn %d: %w", id, ErrCommitted))
	return s.Bodies, nil
}

// Rollback closes session id as rolled back at tt. Rolling back an
// expired or aborted transaction reports why it already ended.
func (t *Table) Rollback(id messages.TxnID, v streamwal.VChannel, tt messages.TimeTick) error {
	s, err := t.usable(id, v, tt)
	if err != nil {
		return err
	}
	t.end(s, RolledBack, streamwal.Errorf(streamwal.CodeTxnInvalidState, "txn %d: %w", id, ErrRolledBack))
	return nil
}

// Abort ends every live session on v (every live session of the PChannel
// when v is zero): an exclusive operation is being stamped. It returns the
// IDs it ended.
func (t *Table) Abort(v streamwal.VChannel) []messages.TxnID {
	t.compact()
	var ids []messages.TxnID
	for _, s := range t.order {
		if s.live() && (v.IsZero() || s.VChannel == v) {
			ids = append(ids, s.ID)
			t.end(s, Aborted, streamwal.Errorf(streamwal.CodeTxnInvalidState, "txn %d on %s: an exclusive operation ended it: %w", s.ID, s.VChannel, ErrAborted))
		}
	}
	return ids
}

// Expire ends every open session whose deadline is before tt and returns
// their IDs. Sessions waiting to commit are left to Commit, which checks
// their deadline against the CommitTxn's own TimeTick.
func (t *Table) Expire(tt messages.TimeTick) []messages.TxnID {
	t.compact()
	var ids []messages.TxnID
	for _, s := range t.order {
		if s.State == Open && tt > s.Deadline() {
			ids = append(ids, s.ID)
			t.expire(s, tt)
		}
	}
	return ids
}

// Oldest returns the Begin of the oldest live session: a reader starting
// there sees every transaction that can still commit.
func (t *Table) Oldest() (messages.MessageID, bool) {
	for len(t.order) > 0 && !t.order[0].live() {
		t.order[0] = nil
		t.order = t.order[1:]
		t.dead--
	}
	if len(t.order) == 0 {
		return 0, false
	}
	return t.order[0].Begin, true
}

// Get returns a live session.
func (t *Table) Get(id messages.TxnID) (*Session, bool) {
	s, ok := t.sessions[id]
	if !ok || !s.live() {
		return nil, false
	}
	return s, true
}

// Len is how many sessions are live.
func (t *Table) Len() int {
	n := 0
	for _, s := range t.sessions {
		if s.live() {
			n++
		}
	}
	return n
}

// usable returns session id if it is live, on v, and not past its
// deadline at tt; otherwise the error that says why.
func (t *Table) usable(id messages.TxnID, v streamwal.VChannel, tt messages.TimeTick) (*Session, error) {
	s, ok := t.sessions[id]
	if !ok {
		if err, ok := t.ended[id]; ok {
			return nil, err
		}
		return nil, streamwal.Errorf(streamwal.CodeTxnNotFound, "txn %d: %w", id, ErrUnknown)
	}
	if !s.live() {
		return nil, s.cause
	}
	if s.VChannel != v {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "txn %d is on %s, not %s: %w", id, s.VChannel, v, ErrWrongVChannel)
	}
	if tt > s.Deadline() {
		return nil, t.expire(s, tt)
	}
	return s, nil
}

// expire ends s as expired at tt and returns its error.
func (t *Table) expire(s *Session, tt messages.TimeTick) error {
	err := streamwal.Errorf(streamwal.CodeTxnExpired, "txn %d: idle since %s, keepalive %v, now %s: %w", s.ID, s.LastActivity, s.Keepalive, tt, ErrExpired)
	t.end(s, Expired, err)
	return err
}

// end moves s to a final state and forgets it, remembering why.
func (t *Table) end(s *Session, state State, cause error) {
	s.State, s.cause = state, cause
	t.dead++
	if s.drained != nil && s.InFlight == 0 {
		close(s.drained)
		s.drained = nil
	}
	if s.InFlight > 0 {
		// Bodies still in flight report to BodyDone; keep the session
		// until they have, but it no longer counts as live.
		t.remember(s.ID, cause)
		return
	}
	delete(t.sessions, s.ID)
	t.remember(s.ID, cause)
}

// remember keeps why id ended, bounded to the most recent maxEnded.
func (t *Table) remember(id messages.TxnID, cause error) {
	if _, ok := t.ended[id]; !ok {
		t.endedOrder = append(t.endedOrder, id)
	}
	t.ended[id] = cause
	if len(t.endedOrder) > maxEnded {
		delete(t.ended, t.endedOrder[0])
		t.endedOrder = t.endedOrder[1:]
	}
}

// Replay rebuilds the table from a message read back from the WAL at
// recovery, in stream order: sessions open at the end of the replay are
// the ones a new owner continues. Messages that are not transactional
// only advance time (expiring idle sessions) and, when exclusive, abort
// the sessions they cover, exactly as they did when they were appended.
func (t *Table) Replay(m *messages.ImmutableMessage) {
	tt := m.TimeTick()
	t.Expire(tt)
	if lk := m.Type().Lock; lk.Mode == messages.LockExclusive {
		if lk.Scope == messages.ScopePChannel {
			t.Abort(streamwal.VChannel{})
		} else {
			t.Abort(m.VChannel())
		}
	}
	tc := m.Txn()
	if tc == nil {
		return
	}
	switch m.Type() {
	case messages.TypeBeginTxn:
		_, _ = t.Begin(tc.ID, m.VChannel(), tc.Keepalive, tt, m.ID())
	case messages.TypeCommitTxn:
		if s, err := t.usable(tc.ID, m.VChannel(), tt); err == nil {
			t.end(s, Committed, streamwal.Errorf(streamwal.CodeTxnInvalidState, "txn %d: %w", tc.ID, ErrCommitted))
		}
	case messages.TypeRollbackTxn:
		_ = t.Rollback(tc.ID, m.VChannel(), tt)
	default:
		if s, err := t.usable(tc.ID, m.VChannel(), tt); err == nil {
			s.Bodies++
			s.LastActivity = tt
			s.marks = append(s.marks[:0], tt)
		}
	}
}

// BodyRefused undoes Body for a body stamped at tt that was refused before
// it was sent: it no longer counts, and the idle mark goes back to the
// latest activity that still stands, so that the session expires when a
// reader, who never sees the body, expects it to.
func (t *Table) BodyRefused(id messages.TxnID, tt messages.TimeTick) {
	s, ok := t.sessions[id]
	if !ok {
		return
	}
	s.Bodies--
	if i, found := slices.BinarySearch(s.marks, tt); found {
		s.marks = slices.Delete(s.marks, i, i+1)
		s.LastActivity = s.marks[len(s.marks)-1]
	}
	t.BodyDone(id, true)
}

// CommitFailed records that the CommitTxn of an ended transaction did not
// land (or may not have), so that a retry learns that rather than "already
// committed".
func (t *Table) CommitFailed(id messages.TxnID, cause error) {
	if _, ok := t.ended[id]; ok {
		t.ended[id] = streamwal.Errorf(streamwal.CodeTxnInvalidState, "txn %d: its commit failed (%v): %w", id, cause, ErrAborted)
	}
}
