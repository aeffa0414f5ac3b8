package workload

import (
	"errors"
	"sync"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// Outcome is how a plain append ended, as its caller was told.
type Outcome uint8

// The outcomes of a plain append.
const (
	// Acknowledged: the append returned where the message landed; it must
	// be read back exactly once, there.
	Acknowledged Outcome = iota + 1
	// Unknown: the append failed in a way that does not say whether the
	// message landed (a timeout, a connection lost, an owner replaced):
	// it may be read back, at most once.
	Unknown
	// Refused: the append failed with an error that says nothing was
	// stored (see Refusal); it must never be read back.
	Refused
)

// String names the outcome.
func (o Outcome) String() string {
	switch o {
	case Acknowledged:
		return "acknowledged"
	case Unknown:
		return "unknown outcome"
	case Refused:
		return "refused"
	}
	return "no outcome"
}

// TxnOutcome is how a transaction ended, as its caller was told.
type TxnOutcome uint8

// The outcomes of a transaction.
const (
	// Committed: the commit returned where it landed; the transaction
	// must be read back exactly once, whole, at its commit.
	Committed TxnOutcome = iota + 1
	// RolledBack: the caller rolled it back (whether or not the rollback
	// itself was acknowledged); it must never be read back.
	RolledBack
	// Aborted: it failed before its commit was sent (a body's append
	// failed); it must never be read back.
	Aborted
	// CommitUnknown: the commit failed without saying whether it landed;
	// it may be read back, at most once and whole.
	CommitUnknown
)

// String names the outcome.
func (o TxnOutcome) String() string {
	switch o {
	case Committed:
		return "committed"
	case RolledBack:
		return "rolled back"
	case Aborted:
		return "aborted"
	case CommitUnknown:
		return "commit of unknown outcome"
	}
	return "no outcome"
}

// Refusal reports whether err, the final error of a plain append, says
// that the message was not stored: the node refused it before writing
// (an invalid argument, a lifecycle violation), which no retry of the
// client turns into a write. Every other error (timeouts, owners moving
// or replaced, connections lost, streamwal.ErrUnknownOutcome) leaves the
// outcome unknown.
func Refusal(err error) bool {
	var e *streamwal.Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Code == streamwal.CodeInvalidArgument || e.Code == streamwal.CodeLifecycle
}

// CommitRefusal reports whether err, the error of a transaction's
// commit, says that the commit did not land: the transaction was unknown
// to the owner, expired or already ended, or the owner refused the
// request. Transaction messages are never retried, so such an error is
// the only answer the commit got.
func CommitRefusal(err error) bool {
	switch streamwal.CodeOf(err) {
	case streamwal.CodeTxnNotFound, streamwal.CodeTxnExpired, streamwal.CodeTxnInvalidState,
		streamwal.CodeInvalidArgument, streamwal.CodeLifecycle, streamwal.CodeNotOwned:
		return true
	}
	return false
}

// plainRecord is a plain append of one message.
type plainRecord struct {
	v       streamwal.VChannel
	outcome Outcome
	res     client.AppendResult
	err     error
}

// txnKey identifies a transaction: its ID is unique on its VChannel.
type txnKey struct {
	v  streamwal.VChannel
	id messages.TxnID
}

// txnRecord is a transaction the load ran.
type txnRecord struct {
	bodies  []string
	outcome TxnOutcome
	commit  client.AppendResult
	err     error
}

// Ledger is what a load was told: the outcome of every plain append (by
// payload, which must be unique) and of every transaction that began. It
// is safe for concurrent use. Tests may record in it directly, for
// example to check that Verify catches what the system did not do.
type Ledger struct {
	mu     sync.Mutex
	plain  map[string]*plainRecord
	txns   map[txnKey]*txnRecord
	bodies map[string]txnKey // body payload -> its transaction
	errs   map[streamwal.Code]int
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{plain: map[string]*plainRecord{}, txns: map[txnKey]*txnRecord{},
		bodies: map[string]txnKey{}, errs: map[streamwal.Code]int{}}
}

// RecordAppend records the plain append of the insert payload to v: res
// is where it landed when err is nil; otherwise err decides between
// Refused and Unknown (see Refusal).
func (l *Ledger) RecordAppend(v streamwal.VChannel, payload string, res client.AppendResult, err error) {
	r := &plainRecord{v: v, outcome: Acknowledged, res: res, err: err}
	if err != nil {
		r.outcome = Unknown
		if Refusal(err) {
			r.outcome = Refused
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.plain[payload] = r
	l.countError(err)
}

// RecordTxn records transaction id on v with the insert payloads of its
// bodies, in order: commit is where its commit landed when outcome is
// Committed; err is the error that ended it, if any.
func (l *Ledger) RecordTxn(v streamwal.VChannel, id messages.TxnID, bodies []string, outcome TxnOutcome, commit client.AppendResult, err error) {
	k := txnKey{v: v, id: id}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.txns[k] = &txnRecord{bodies: append([]string(nil), bodies...), outcome: outcome, commit: commit, err: err}
	for _, b := range bodies {
		l.bodies[b] = k
	}
	l.countError(err)
}

// RecordError counts an error that ended an operation before anything
// could be recorded of it (a BeginTxn that failed).
func (l *Ledger) RecordError(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.countError(err)
}

// countError counts err by its code (the empty code for an untyped
// error). l.mu must be held.
func (l *Ledger) countError(err error) {
	if err == nil {
		return
	}
	var e *streamwal.Error
	if !errors.As(err, &e) {
		l.errs[""]++
		return
	}
	l.errs[e.Code]++
}

// Acknowledged is how many plain appends were acknowledged and
// transactions committed.
func (l *Ledger) Acknowledged() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.plain {
		if r.outcome == Acknowledged {
			n++
		}
	}
	for _, r := range l.txns {
		if r.outcome == Committed {
			n++
		}
	}
	return n
}

// Errors counts the errors recorded, by code ("" for untyped ones).
func (l *Ledger) Errors() map[streamwal.Code]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[streamwal.Code]int, len(l.errs))
	for c, n := range l.errs {
		out[c] = n
	}
	return out
}

// snapshot is a copy of the records, taken once the load stopped.
type snapshot struct {
	plain  map[string]plainRecord
	txns   map[txnKey]txnRecord
	bodies map[string]txnKey
}

// snapshot copies the records.
func (l *Ledger) snapshot() snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := snapshot{plain: make(map[string]plainRecord, len(l.plain)), txns: make(map[txnKey]txnRecord, len(l.txns)),
		bodies: make(map[string]txnKey, len(l.bodies))}
	for p, r := range l.plain {
		s.plain[p] = *r
	}
	for k, r := range l.txns {
		s.txns[k] = *r
	}
	for b, k := range l.bodies {
		s.bodies[b] = k
	}
	return s
}
