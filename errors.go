package streamwal

import (
	"errors"
	"fmt"
	"strings"
)

// Code is the stable identity of an error kind. Codes travel in request-reply
// headers unchanged, so a client can tell a retriable error from a final one
// after the hop; their spelling is part of the wire protocol.
type Code string

// The error codes of DESIGN.md §6.
const (
	// CodeInvalidArgument: a bad name, size, type or option; nothing changed.
	CodeInvalidArgument Code = "INVALID_ARGUMENT"
	// CodeNotOwned: the channel is not owned by the callee (or is being
	// assigned); retry after the assignment settles.
	CodeNotOwned Code = "CHANNEL_NOT_OWNED"
	// CodeTermMismatch: the caller's term does not match the owner's.
	CodeTermMismatch Code = "UNMATCHED_CHANNEL_TERM"
	// CodeFenced: a newer owner fenced this writer; it will never write again.
	CodeFenced Code = "CHANNEL_FENCED"
	// CodeUnknownOutcome: the write may or may not have landed.
	CodeUnknownOutcome Code = "UNKNOWN_OUTCOME"
	// CodeDuplicate: the message ID was already stored by an earlier append;
	// the message was not written again.
	CodeDuplicate Code = "DUPLICATE_MESSAGE_ID"
	// CodeTxnNotFound: no open transaction with that ID.
	CodeTxnNotFound Code = "TXN_NOT_FOUND"
	// CodeTxnExpired: the transaction's keepalive ran out.
	CodeTxnExpired Code = "TXN_EXPIRED"
	// CodeTxnInvalidState: the transaction was already committed or rolled
	// back, or the operation does not fit its VChannel or state.
	CodeTxnInvalidState Code = "TXN_INVALID_STATE"
	// CodeLifecycle: the message breaks the collection, partition or segment
	// lifecycle (for example DML before CreateCollection).
	CodeLifecycle Code = "LIFECYCLE_VIOLATION"
	// CodeResourceBusy: a lock or resource key is held by someone else.
	CodeResourceBusy Code = "RESOURCE_ACQUIRED"
	// CodeNotPrimary: a write that only the primary cluster takes (one
	// without a replicate header) reached a secondary cluster; the error
	// names the primary (see [PrimaryOf]).
	CodeNotPrimary Code = "NOT_PRIMARY"
	// CodeNotSecondary: a replicated write (one with a replicate header)
	// reached a cluster that is not a secondary of its source: the
	// primary, a cluster outside replication, or a secondary of another.
	CodeNotSecondary Code = "NOT_SECONDARY"
	// CodeUnavailable: nobody answered (no responder, timeout); retriable.
	CodeUnavailable Code = "UNAVAILABLE"
	// CodeRateLimited: rejected by a rate limit; retriable.
	CodeRateLimited Code = "RATE_LIMITED"
	// CodeResourceExhausted: the in-flight limits of a client or node are
	// full (more load is offered than the server absorbs) and no room
	// freed within the configured wait; nothing was sent or written, and a
	// later retry may succeed. Unlike CodeResourceBusy it names no holder
	// of a lock: it is backpressure.
	CodeResourceExhausted Code = "RESOURCE_EXHAUSTED"
	// CodeShuttingDown: the callee is shutting down; retry elsewhere.
	CodeShuttingDown Code = "ON_SHUTDOWN"
	// CodeClosed: the local object (writer, scanner, client) was closed.
	CodeClosed Code = "CLOSED"
	// CodeUnrecoverable: the operation can never succeed.
	CodeUnrecoverable Code = "UNRECOVERABLE"
	// CodeInternal: a bug or an unexpected failure.
	CodeInternal Code = "INTERNAL"
	// CodeHistoryLost: a PChannel's stream holds less than was acknowledged,
	// or other messages at known IDs; its owner refuses to serve it until an
	// operator accepts the loss (`streamwal pchannel accept-loss`).
	CodeHistoryLost Code = "HISTORY_LOST"
	// CodePermissionDenied: the NATS credentials in use may not make the
	// request (its subject is not among their permissions), for example
	// credentials of another cluster than the one named.
	CodePermissionDenied Code = "PERMISSION_DENIED"
)

// retriable lists the codes whose operation may succeed if repeated later.
var retriable = map[Code]bool{
	CodeNotOwned:     true,
	CodeTermMismatch: true,
	CodeUnavailable:  true,
	CodeRateLimited:  true,
	CodeShuttingDown: true,
	CodeResourceBusy: true,

	CodeResourceExhausted: true,
}

// Retriable reports whether an operation that failed with code may succeed
// when repeated, possibly against another owner.
func (c Code) Retriable() bool { return retriable[c] }

// Reason refines a Code with the stable identity of one kind of refusal
// (for example COLLECTION_EXISTS under LIFECYCLE_VIOLATION). Like codes,
// reasons travel across the request-reply hop unchanged, so a caller
// matches a refusal with errors.Is and a sentinel such as
// [ErrCollectionExists], never by its text.
type Reason string

// The reasons of lifecycle refusals (CodeLifecycle) and of durable
// subscriptions.
const (
	ReasonCollectionNotFound Reason = "COLLECTION_NOT_FOUND"
	ReasonCollectionExists   Reason = "COLLECTION_EXISTS"
	ReasonCollectionDropped  Reason = "COLLECTION_DROPPED"
	ReasonPartitionNotFound  Reason = "PARTITION_NOT_FOUND"
	ReasonPartitionExists    Reason = "PARTITION_EXISTS"
	ReasonPartitionDropped   Reason = "PARTITION_DROPPED"
	// ReasonPositionLost: a durable position is older than what the log
	// still holds (CodeUnrecoverable).
	ReasonPositionLost Reason = "POSITION_LOST"
	// ReasonSubscriptionNotFound: no durable subscription of that name
	// (CodeInvalidArgument).
	ReasonSubscriptionNotFound Reason = "SUBSCRIPTION_NOT_FOUND"
	// ReasonPChannelCountMismatch: a replication topology whose member
	// clusters do not all have the same number of PChannels, or that
	// gives a cluster another count than it has (CodeInvalidArgument).
	ReasonPChannelCountMismatch Reason = "PCHANNEL_COUNT_MISMATCH"
)

// Error is the typed error of streamwal. errors.Is matches two Errors by code,
// so a sentinel such as [ErrFenced] matches every fenced error whatever its
// message; a sentinel with a Reason (such as [ErrCollectionExists]) matches
// only errors of its code and reason. The wrapped cause stays reachable
// through errors.Unwrap.
type Error struct {
	Code Code
	// Reason, if set, says which refusal of its code this is.
	Reason  Reason
	Message string
	cause   error
}

// Errorf returns an *Error with the given code and formatted message. A %w
// verb in format wraps its operand as the cause.
func Errorf(code Code, format string, args ...any) *Error {
	wrapped := fmt.Errorf(format, args...)
	cause := errors.Unwrap(wrapped)
	if _, multi := wrapped.(interface{ Unwrap() []error }); multi {
		cause = wrapped
	}
	msg := wrapped.Error()
	for _, a := range args {
		// An inner *Error of the same code contributes its text only.
		if inner, ok := a.(*Error); ok && inner != nil && inner.Code == code && inner.Message != "" {
			msg = strings.Replace(msg, inner.Error(), inner.Message, 1)
		}
	}
	return &Error{Code: code, Reason: inheritedReason(code, cause), Message: msg, cause: cause}
}

// inheritedReason is the reason of the first *Error of code in cause's
// chain: wrapping a refusal in more context keeps its reason.
func inheritedReason(code Code, cause error) Reason {
	var inner *Error
	if cause == nil || !errors.As(cause, &inner) || inner.Code != code {
		return ""
	}
	return inner.Reason
}

// Error renders "CODE: message".
func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Message
}

// Is matches any *Error of the same code whose Reason is the target's,
// or any reason when the target has none.
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) || t == nil {
		return false
	}
	return t.Code == e.Code && (t.Reason == "" || t.Reason == e.Reason)
}

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error { return e.cause }

// Retriable reports whether the failed operation may succeed if repeated.
func (e *Error) Retriable() bool { return e.Code.Retriable() }

// CodeOf returns the code of the first *Error in err's chain, CodeInternal
// for any other non-nil error, and "" for nil.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ReasonOf returns the reason of the first *Error in err's chain ("" when
// it has none).
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// IsRetriable reports whether err carries a retriable code.
func IsRetriable(err error) bool { return CodeOf(err).Retriable() }

// IsRetriableWithID reports whether an append whose messages carry their
// own message IDs is worth retrying after err: err is retriable, or it
// came from an owner replaced meanwhile (fenced, closed), or its outcome
// is unknown. The IDs make a retry of what did land return the stored
// message instead of writing it twice.
func IsRetriableWithID(err error) bool {
	switch CodeOf(err) {
	case CodeFenced, CodeClosed, CodeUnknownOutcome:
		return true
	}
	return IsRetriable(err)
}

// Sentinels for errors.Is; each matches every error of its code.
var (
	ErrInvalidArgument = &Error{Code: CodeInvalidArgument}
	ErrNotOwned        = &Error{Code: CodeNotOwned}
	ErrTermMismatch    = &Error{Code: CodeTermMismatch}
	ErrFenced          = &Error{Code: CodeFenced}
	ErrUnknownOutcome  = &Error{Code: CodeUnknownOutcome}
	ErrDuplicate       = &Error{Code: CodeDuplicate}
	ErrTxnNotFound     = &Error{Code: CodeTxnNotFound}
	ErrTxnExpired      = &Error{Code: CodeTxnExpired}
	ErrTxnInvalidState = &Error{Code: CodeTxnInvalidState}
	ErrLifecycle       = &Error{Code: CodeLifecycle}
	ErrResourceBusy    = &Error{Code: CodeResourceBusy}
	ErrNotPrimary      = &Error{Code: CodeNotPrimary}
	ErrNotSecondary    = &Error{Code: CodeNotSecondary}
	ErrUnavailable     = &Error{Code: CodeUnavailable}
	ErrRateLimited     = &Error{Code: CodeRateLimited}
	ErrShuttingDown    = &Error{Code: CodeShuttingDown}
	ErrClosed          = &Error{Code: CodeClosed}
	ErrUnrecoverable   = &Error{Code: CodeUnrecoverable}
	ErrInternal        = &Error{Code: CodeInternal}
	ErrHistoryLost     = &Error{Code: CodeHistoryLost}
	// ErrPermissionDenied matches errors of CodePermissionDenied.
	ErrPermissionDenied = &Error{Code: CodePermissionDenied}
	// ErrResourceExhausted matches errors of CodeResourceExhausted.
	ErrResourceExhausted = &Error{Code: CodeResourceExhausted}
)

// Sentinels of refusals with a reason; each also matches the sentinel of
// its code (ErrLifecycle, ...).
var (
	// ErrCollectionNotFound: the VChannel's collection was never created.
	ErrCollectionNotFound = &Error{Code: CodeLifecycle, Reason: ReasonCollectionNotFound, Message: "collection not found"}
	// ErrCollectionExists: CreateCollection of a collection that exists.
	ErrCollectionExists = &Error{Code: CodeLifecycle, Reason: ReasonCollectionExists, Message: "collection already exists"}
	// ErrCollectionDropped: the VChannel's collection was dropped.
	ErrCollectionDropped = &Error{Code: CodeLifecycle, Reason: ReasonCollectionDropped, Message: "collection dropped"}
	// ErrPartitionNotFound: the partition was never created.
	ErrPartitionNotFound = &Error{Code: CodeLifecycle, Reason: ReasonPartitionNotFound, Message: "partition not found"}
	// ErrPartitionExists: CreatePartition of a live partition.
	ErrPartitionExists = &Error{Code: CodeLifecycle, Reason: ReasonPartitionExists, Message: "partition already exists"}
	// ErrPartitionDropped: the partition was dropped; its ID is never
	// reused.
	ErrPartitionDropped = &Error{Code: CodeLifecycle, Reason: ReasonPartitionDropped, Message: "partition dropped"}
	// ErrPositionLost: a durable subscription's position is below what
	// the log still holds, so resuming from it would skip messages.
	ErrPositionLost = &Error{Code: CodeUnrecoverable, Reason: ReasonPositionLost, Message: "position no longer in the log"}
	// ErrSubscriptionNotFound: no durable subscription of that name.
	ErrSubscriptionNotFound = &Error{Code: CodeInvalidArgument, Reason: ReasonSubscriptionNotFound, Message: "subscription not found"}
	// ErrPChannelCountMismatch: the clusters of a replication topology do
	// not have the same number of PChannels (PChannel i replicates into
	// PChannel i, so the counts must match).
	ErrPChannelCountMismatch = &Error{Code: CodeInvalidArgument, Reason: ReasonPChannelCountMismatch, Message: "pchannel counts differ"}
)

// notPrimaryMark introduces the primary's name at the end of a
// NOT_PRIMARY error's message; its spelling is part of the protocol.
const notPrimaryMark = "; the primary is cluster "

// NotPrimary is the refusal of a write that only the primary takes by
// cluster c, a secondary of primary: its message ends with the primary's
// name, which [PrimaryOf] reads back on the other side of a hop.
func NotPrimary(c, primary Cluster, format string, args ...any) *Error {
	e := Errorf(CodeNotPrimary, format, args...)
	e.Message += " (cluster " + string(c) + " is a secondary" + notPrimaryMark + string(primary) + ")"
	return e
}

// PrimaryOf returns the primary cluster a NOT_PRIMARY error names, so
// that a client or an operator knows where to write instead; ok is false
// for any other error.
func PrimaryOf(err error) (c Cluster, ok bool) {
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeNotPrimary {
		return "", false
	}
	i := strings.LastIndex(e.Message, notPrimaryMark)
	if i < 0 {
		return "", false
	}
	name := strings.TrimSuffix(e.Message[i+len(notPrimaryMark):], ")")
	p, err := ParseCluster(name)
	return p, err == nil
}

// ErrInvalidName is the cause of every invalid-name error; such errors also
// match [ErrInvalidArgument].
var ErrInvalidName = errors.New("invalid name")

// invalidName builds the error for a rejected name.
func invalidName(kind, name, why string) error {
	return Errorf(CodeInvalidArgument, "%w: %s %q: %s", ErrInvalidName, kind, name, why)
}
