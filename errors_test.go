package streamwal_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
)

// allCodes pairs every code with its sentinel and its wire spelling. The
// spellings cross the request-reply hop, so they are part of the protocol and
// must never change.
var allCodes = []struct {
	code     streamwal.Code
	sentinel *streamwal.Error
	wire     string
}{
	{streamwal.CodeInvalidArgument, streamwal.ErrInvalidArgument, "INVALID_ARGUMENT"},
	{streamwal.CodeNotOwned, streamwal.ErrNotOwned, "CHANNEL_NOT_OWNED"},
	{streamwal.CodeTermMismatch, streamwal.ErrTermMismatch, "UNMATCHED_CHANNEL_TERM"},
	{streamwal.CodeFenced, streamwal.ErrFenced, "CHANNEL_FENCED"},
	{streamwal.CodeUnknownOutcome, streamwal.ErrUnknownOutcome, "UNKNOWN_OUTCOME"},
	{streamwal.CodeTxnNotFound, streamwal.ErrTxnNotFound, "TXN_NOT_FOUND"},
	{streamwal.CodeTxnExpired, streamwal.ErrTxnExpired, "TXN_EXPIRED"},
	{streamwal.CodeTxnInvalidState, streamwal.ErrTxnInvalidState, "TXN_INVALID_STATE"},
	{streamwal.CodeLifecycle, streamwal.ErrLifecycle, "LIFECYCLE_VIOLATION"},
	{streamwal.CodeResourceBusy, streamwal.ErrResourceBusy, "RESOURCE_ACQUIRED"},
	{streamwal.CodeNotPrimary, streamwal.ErrNotPrimary, "NOT_PRIMARY"},
	{streamwal.CodeNotSecondary, streamwal.ErrNotSecondary, "NOT_SECONDARY"},
	{streamwal.CodeUnavailable, streamwal.ErrUnavailable, "UNAVAILABLE"},
	{streamwal.CodeRateLimited, streamwal.ErrRateLimited, "RATE_LIMITED"},
	{streamwal.CodeResourceExhausted, streamwal.ErrResourceExhausted, "RESOURCE_EXHAUSTED"},
	{streamwal.CodeShuttingDown, streamwal.ErrShuttingDown, "ON_SHUTDOWN"},
	{streamwal.CodeClosed, streamwal.ErrClosed, "CLOSED"},
	{streamwal.CodeUnrecoverable, streamwal.ErrUnrecoverable, "UNRECOVERABLE"},
	{streamwal.CodeInternal, streamwal.ErrInternal, "INTERNAL"},
	{streamwal.CodeHistoryLost, streamwal.ErrHistoryLost, "HISTORY_LOST"},
	{streamwal.CodePermissionDenied, streamwal.ErrPermissionDenied, "PERMISSION_DENIED"},
}

// retriableCodes is the exact set of codes whose operation may succeed when
// repeated.
var retriableCodes = map[streamwal.Code]bool{
	streamwal.CodeNotOwned:     true,
	streamwal.CodeTermMismatch: true,
	streamwal.CodeResourceBusy: true,
	streamwal.CodeUnavailable:  true,
	streamwal.CodeRateLimited:  true,
	streamwal.CodeShuttingDown: true,

	streamwal.CodeResourceExhausted: true,
}

func TestCodesStable(t *testing.T) {
	seen := map[streamwal.Code]bool{}
	for _, c := range allCodes {
		require.Equal(t, c.wire, string(c.code))
		require.Equal(t, c.code, c.sentinel.Code)
		require.Empty(t, c.sentinel.Message)
		require.Nil(t, c.sentinel.Unwrap())
		require.False(t, seen[c.code], "duplicate code %s", c.code)
		seen[c.code] = true
	}
}

func TestRetriable(t *testing.T) {
	for _, c := range allCodes {
		want := retriableCodes[c.code]
		require.Equal(t, want, c.code.Retriable(), "Code(%s).Retriable", c.code)
		require.Equal(t, want, c.sentinel.Retriable(), "sentinel %s", c.code)
		err := streamwal.Errorf(c.code, "boom")
		require.Equal(t, want, err.Retriable())
		require.Equal(t, want, streamwal.IsRetriable(err))
		require.Equal(t, want, streamwal.IsRetriable(fmt.Errorf("ctx: %w", err)))
		require.Equal(t, want, streamwal.IsRetriable(fmt.Errorf("a: %w", fmt.Errorf("b: %w", err))))
	}
	n := 0
	for _, c := range allCodes {
		if c.code.Retriable() {
			n++
		}
	}
	require.Equal(t, len(retriableCodes), n)

	require.False(t, streamwal.IsRetriable(nil))
	require.False(t, streamwal.IsRetriable(io.EOF), "a foreign error is INTERNAL, not retriable")
	require.False(t, streamwal.IsRetriable(context.DeadlineExceeded))
	require.False(t, streamwal.Code("").Retriable())
	require.False(t, streamwal.Code("SOMETHING_ELSE").Retriable())
}

func TestErrorsIsByCode(t *testing.T) {
	for _, a := range allCodes {
		err := streamwal.Errorf(a.code, "pchannel %s: %d", "pchan-1", 7)
		wrapped := fmt.Errorf("append: %w", err)
		twice := fmt.Errorf("client: %w", wrapped)
		joined := errors.Join(io.EOF, wrapped)
		for _, b := range allCodes {
			want := a.code == b.code
			require.Equal(t, want, errors.Is(err, b.sentinel), "%s is %s", a.code, b.code)
			require.Equal(t, want, errors.Is(wrapped, b.sentinel), "wrapped %s is %s", a.code, b.code)
			require.Equal(t, want, errors.Is(twice, b.sentinel), "twice-wrapped %s is %s", a.code, b.code)
			require.Equal(t, want, errors.Is(joined, b.sentinel), "joined %s is %s", a.code, b.code)
			// Two typed errors of the same code match whatever their messages.
			require.Equal(t, want, errors.Is(err, streamwal.Errorf(b.code, "other")))
		}
		require.False(t, errors.Is(err, io.EOF))
		require.False(t, errors.Is(err, errors.New(string(a.code))))
		require.False(t, errors.Is(err, nil))

		var e *streamwal.Error
		require.True(t, errors.As(twice, &e))
		require.Equal(t, a.code, e.Code)
		require.Equal(t, "pchannel pchan-1: 7", e.Message)
	}
}

func TestErrorfWrapsCause(t *testing.T) {
	_, statErr := os.Stat("/definitely/not/here")
	require.Error(t, statErr)

	err := streamwal.Errorf(streamwal.CodeUnavailable, "open segment %s: %w", "s1", statErr)
	require.Equal(t, streamwal.CodeUnavailable, err.Code)
	require.Equal(t, "open segment s1: "+statErr.Error(), err.Message)
	require.Equal(t, "UNAVAILABLE: open segment s1: "+statErr.Error(), err.Error())
	require.Equal(t, statErr, errors.Unwrap(err))
	require.Equal(t, statErr, err.Unwrap())
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	var pe *fs.PathError
	require.ErrorAs(t, err, &pe)

	// Through further wrapping.
	outer := fmt.Errorf("client: %w", err)
	require.ErrorIs(t, outer, fs.ErrNotExist)
	require.ErrorIs(t, outer, streamwal.ErrUnavailable)
	require.Equal(t, streamwal.CodeUnavailable, streamwal.CodeOf(outer))

	// Without %w there is no cause, even if an error is formatted.
	plain := streamwal.Errorf(streamwal.CodeInternal, "oops: %v", statErr)
	require.Nil(t, plain.Unwrap())
	require.False(t, errors.Is(plain, fs.ErrNotExist))
	require.Contains(t, plain.Error(), statErr.Error())

	// A typed cause of another code: the outer code wins for CodeOf, and
	// both codes stay matchable.
	inner := streamwal.Errorf(streamwal.CodeFenced, "term 3 < 4")
	mixed := streamwal.Errorf(streamwal.CodeUnknownOutcome, "append: %w", inner)
	require.Equal(t, streamwal.CodeUnknownOutcome, streamwal.CodeOf(mixed))
	require.ErrorIs(t, mixed, streamwal.ErrUnknownOutcome)
	require.ErrorIs(t, mixed, streamwal.ErrFenced)
	require.NotErrorIs(t, mixed, streamwal.ErrNotOwned)
	require.Equal(t, "UNKNOWN_OUTCOME: append: CHANNEL_FENCED: term 3 < 4", mixed.Error())
}

// TestErrorfWrapsEveryCause: fmt.Errorf accepts several %w verbs; Errorf
// should keep all of them reachable, as fmt.Errorf does. Today it keeps none:
// errors.Unwrap returns nil for fmt's multi-wrap error (it has Unwrap()
// []error), so the cause is silently dropped.
func TestErrorfWrapsEveryCause(t *testing.T) {
	err := streamwal.Errorf(streamwal.CodeInternal, "%w and %w", io.EOF, fs.ErrNotExist)
	require.ErrorIs(t, err, io.EOF)
	require.ErrorIs(t, err, fs.ErrNotExist)
}

// TestErrorsIsTypedNilTarget: errors.Is with a typed nil *Error target must
// not panic (it should report false).
func TestErrorsIsTypedNilTarget(t *testing.T) {
	var target *streamwal.Error
	err := streamwal.Errorf(streamwal.CodeFenced, "x")
	require.NotPanics(t, func() { require.False(t, errors.Is(err, target)) })
}

func TestCodeOf(t *testing.T) {
	require.Equal(t, streamwal.Code(""), streamwal.CodeOf(nil))
	require.Equal(t, streamwal.CodeInternal, streamwal.CodeOf(io.EOF))
	require.Equal(t, streamwal.CodeInternal, streamwal.CodeOf(errors.New("foreign")))
	require.Equal(t, streamwal.CodeInternal, streamwal.CodeOf(fmt.Errorf("wrapped: %w", context.Canceled)))
	for _, c := range allCodes {
		require.Equal(t, c.code, streamwal.CodeOf(c.sentinel))
		err := streamwal.Errorf(c.code, "x")
		require.Equal(t, c.code, streamwal.CodeOf(err))
		require.Equal(t, c.code, streamwal.CodeOf(fmt.Errorf("a: %w", err)))
		require.Equal(t, c.code, streamwal.CodeOf(errors.Join(io.EOF, err)))
	}
	// The first *Error of the chain decides.
	inner := streamwal.Errorf(streamwal.CodeFenced, "inner")
	outer := streamwal.Errorf(streamwal.CodeNotOwned, "outer: %w", inner)
	require.Equal(t, streamwal.CodeNotOwned, streamwal.CodeOf(fmt.Errorf("x: %w", outer)))
	// An invalid name is an INVALID_ARGUMENT, not the foreign ErrInvalidName.
	_, err := streamwal.ParseCluster("")
	require.Equal(t, streamwal.CodeInvalidArgument, streamwal.CodeOf(err))
	require.Equal(t, streamwal.CodeInternal, streamwal.CodeOf(streamwal.ErrInvalidName))
}

func TestErrorRendering(t *testing.T) {
	for _, c := range allCodes {
		require.Equal(t, c.wire, c.sentinel.Error(), "a sentinel renders as its code")
		require.Equal(t, c.wire+": boom 42", streamwal.Errorf(c.code, "boom %d", 42).Error())
		require.Equal(t, c.wire, streamwal.Errorf(c.code, "").Error())
		require.Equal(t, c.wire+": x", (&streamwal.Error{Code: c.code, Message: "x"}).Error())
	}
	require.Equal(t, "CLOSED: a: b", fmt.Errorf("%w", streamwal.Errorf(streamwal.CodeClosed, "a: %s", "b")).Error())

	_, err := streamwal.ParsePChannel("pchan-03")
	require.Equal(t, `INVALID_ARGUMENT: invalid name: pchannel "pchan-03": index: want a decimal number without sign or leading zeros`, err.Error())
}

func TestInvalidNameErrors(t *testing.T) {
	// ErrInvalidName is the cause of every invalid-name error; it is not
	// itself an INVALID_ARGUMENT error, but every error built on it is.
	require.NotErrorIs(t, streamwal.ErrInvalidName, streamwal.ErrInvalidArgument)
	_, err := streamwal.ParseToken("Bad")
	require.ErrorIs(t, err, streamwal.ErrInvalidName)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.ErrorIs(t, fmt.Errorf("register: %w", err), streamwal.ErrInvalidName)
	var e *streamwal.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, streamwal.ErrInvalidName, e.Unwrap())

	// A count error is an INVALID_ARGUMENT but not an invalid name.
	_, err = streamwal.PChannels("pchan", 0)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.NotErrorIs(t, err, streamwal.ErrInvalidName)
}

// TestReasonsMatchWithTheirCode: a sentinel with a reason matches an error
// that wraps it in more context (Errorf keeps the reason of a cause of
// its code), and only that reason; the code's sentinel still matches.
func TestReasonsMatchWithTheirCode(t *testing.T) {
	err := streamwal.Errorf(streamwal.CodeLifecycle, "CreateCollection of collection 7 on v: %w", streamwal.ErrCollectionExists)
	require.ErrorIs(t, err, streamwal.ErrCollectionExists)
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
	require.NotErrorIs(t, err, streamwal.ErrCollectionDropped)
	require.Equal(t, streamwal.ReasonCollectionExists, err.Reason)
	require.Equal(t, streamwal.ReasonCollectionExists, streamwal.ReasonOf(fmt.Errorf("outer: %w", err)))
	require.Equal(t, "LIFECYCLE_VIOLATION: CreateCollection of collection 7 on v: collection already exists", err.Error())

	// Rebuilt from its code and reason alone (as after the hop), with no
	// cause: it still matches by reason.
	hop := &streamwal.Error{Code: err.Code, Reason: err.Reason, Message: err.Message}
	require.ErrorIs(t, hop, streamwal.ErrCollectionExists)
	require.NotErrorIs(t, hop, streamwal.ErrPartitionExists)

	// A cause of another code lends no reason.
	other := streamwal.Errorf(streamwal.CodeInternal, "while creating: %w", streamwal.ErrCollectionExists)
	require.Empty(t, other.Reason)
	require.NotErrorIs(t, &streamwal.Error{Code: other.Code, Message: other.Message}, streamwal.ErrCollectionExists)
	require.Empty(t, streamwal.ReasonOf(errors.New("plain")))

	// A plain error of the code does not match a reason's sentinel.
	require.NotErrorIs(t, streamwal.Errorf(streamwal.CodeLifecycle, "no reason"), streamwal.ErrCollectionExists)
}

func TestNotPrimaryNamesThePrimary(t *testing.T) {
	err := streamwal.NotPrimary("east", "west", "insert on %s", "pchan-3")
	require.ErrorIs(t, err, streamwal.ErrNotPrimary)
	require.False(t, streamwal.IsRetriable(err), "retrying the secondary cannot help")
	require.Contains(t, err.Error(), "insert on pchan-3")
	p, ok := streamwal.PrimaryOf(err)
	require.True(t, ok)
	require.Equal(t, streamwal.Cluster("west"), p)

	// The primary survives wrapping and a copy made of code and message
	// alone (as a request-reply hop makes).
	wrapped := fmt.Errorf("append: %w", err)
	p, ok = streamwal.PrimaryOf(wrapped)
	require.True(t, ok)
	require.Equal(t, streamwal.Cluster("west"), p)
	copied := &streamwal.Error{Code: err.Code, Message: err.Message}
	p, ok = streamwal.PrimaryOf(copied)
	require.True(t, ok)
	require.Equal(t, streamwal.Cluster("west"), p)

	for _, other := range []error{nil, errors.New("x"), streamwal.Errorf(streamwal.CodeNotSecondary, "the primary is cluster west"),
		&streamwal.Error{Code: streamwal.CodeNotPrimary, Message: "no name"}} {
		_, ok := streamwal.PrimaryOf(other)
		require.False(t, ok, "%v", other)
	}
}
