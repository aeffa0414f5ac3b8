// Package faulty wraps a [jetstream.Backend], and the writers and scanners
// it returns, to inject failures, in the manner of pebble's vfs/errorfs:
// before each operation the wrapper asks an [Injector] for a [Fault],
// which fails the operation with an error (before it reaches the wrapped
// backend, or after it took effect: an unknown outcome), holds it back
// for a while, or lets it through. Tests use it to drive the failure
// paths that callers of a backend document (an append of unknown
// outcome, a fenced writer, an unavailable backend) against a real
// server; with [Pass] the wrapper is faithful, which the conformance
// suite checks.
package faulty

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// Op names an operation of a backend, writer or scanner.
type Op uint8

// The operations an [Injector] is asked about.
const (
	// OpOpenWriter is Backend.OpenWriter (which lands a RecoveryBarrier).
	OpOpenWriter Op = iota + 1
	// OpRead is Backend.Read, which opens a scanner.
	OpRead
	// OpGet is Backend.Get.
	OpGet
	// OpTruncate is Backend.Truncate.
	OpTruncate
	// OpState is Backend.State.
	OpState
	// OpAdvance is Advance (wal.Tiers).
	OpAdvance
	// OpWriteSegment is WriteSegment (jetstream.SegmentStore, wal.Tiers).
	OpWriteSegment
	// OpSegments is Segments (jetstream.SegmentStore).
	OpSegments
	// OpReadSegment is ReadSegment (jetstream.SegmentStore).
	OpReadSegment
	// OpAppend is Writer.Append and Writer.AppendAsync.
	OpAppend
	// OpFenced is Writer.Fenced, which reads the newest RecoveryBarrier.
	OpFenced
	// OpNext is Scanner.Next, and each step of Scanner.All.
	OpNext
)

// opNames are the names String gives.
var opNames = map[Op]string{
	OpOpenWriter: "open-writer", OpRead: "read", OpGet: "get", OpTruncate: "truncate", OpState: "state",
	OpAdvance: "advance", OpWriteSegment: "write-segment", OpSegments: "segments", OpReadSegment: "read-segment",
	OpAppend: "append", OpFenced: "fenced", OpNext: "next",
}

// String names the operation.
func (o Op) String() string {
	if s, ok := opNames[o]; ok {
		return s
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Call describes one operation the wrapper is about to run.
type Call struct {
	// Op is the operation.
	Op Op
	// PChannel is the channel it concerns (zero for segment operations).
	PChannel streamwal.PChannel
	// VChannel is the channel of a segment operation.
	VChannel streamwal.VChannel
	// Term is the writer's term (OpAppend, OpFenced) or the term asked
	// for (OpOpenWriter).
	Term uint64
	// Msgs are the messages of an append; an injector reads them and
	// must not change them.
	Msgs []*messages.MutableMessage
	// Async says an append came through AppendAsync.
	Async bool
	// ID is the MessageID of OpGet, the bound of OpTruncate and the next
	// MessageID of OpAdvance.
	ID messages.MessageID
}

// HasType reports whether the call appends a message of type t.
func (c Call) HasType(t *messages.Type) bool {
	for _, m := range c.Msgs {
		if m.Type() == t {
			return true
		}
	}
	return false
}

// Fault is an injector's decision about one operation. The zero Fault
// lets the operation through unchanged.
type Fault struct {
	// Err, if not nil, fails the operation with Err.
	Err error
	// After lets the operation reach the wrapped backend and take effect
	// before it fails with Err (an append lands, a truncation removes, a
	// writer opens and is closed again): the caller is told it failed,
	// which is an unknown outcome. An operation the wrapped backend fails
	// itself returns its own error. Without After, an operation with Err
	// never reaches the wrapped backend.
	After bool
	// Delay holds the operation back this long: before it runs, or with
	// After before its result is returned. A context that ends first cuts
	// the wait short: before the operation, it then fails with the
	// context's error and does not run.
	Delay time.Duration
	// Hold, if not nil, holds the operation back like Delay until it is
	// closed. A test that holds an operation must close Hold (or end the
	// operation's context) for the operation to finish.
	Hold <-chan struct{}
}

// zero reports whether f lets the operation through unchanged.
func (f Fault) zero() bool { return f.Err == nil && !f.After && !f.waits() }

// waits reports whether f holds the operation back.
func (f Fault) waits() bool { return f.Delay > 0 || f.Hold != nil }

// wait holds the operation back as f says, until ctx ends.
func (f Fault) wait(ctx context.Context) error {
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if f.Hold != nil {
		select {
		case <-f.Hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Injector decides the fault of each operation. Inject is called once per
// operation, before it runs, possibly from several goroutines at once.
type Injector interface {
	Inject(c Call) Fault
}

// InjectorFunc adapts a function to an [Injector].
type InjectorFunc func(c Call) Fault

// Inject implements [Injector].
func (f InjectorFunc) Inject(c Call) Fault { return f(c) }

// ErrInjected is the cause of every error that [Injected],
// [UnknownOutcome], [Fenced] and [Unavailable] build, so that a test can
// tell an injected failure from a real one with errors.Is.
var ErrInjected = errors.New("injected by faulty")

// Injected returns an error of code for a Fault, wrapping [ErrInjected].
func Injected(code streamwal.Code) error {
	return streamwal.Errorf(code, "faulty: %w", ErrInjected)
}

// UnknownOutcome returns an error matching streamwal.ErrUnknownOutcome:
// the operation may or may not have taken effect.
func UnknownOutcome() error { return Injected(streamwal.CodeUnknownOutcome) }

// Fenced returns an error matching streamwal.ErrFenced. A writer that
// returns it from an append stops, as a fenced writer does.
func Fenced() error { return Injected(streamwal.CodeFenced) }

// Unavailable returns an error matching streamwal.ErrUnavailable: the
// backend did not answer.
func Unavailable() error { return Injected(streamwal.CodeUnavailable) }
