package jetstream

import (
	"context"
	"iter"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// Backend is the WAL storage of PChannels.
type Backend interface {
	// OpenWriter provisions p's stream if needed and opens it for writing
	// under term: it appends a RecoveryBarrier carrying the term,
	// conditioned on the tail it saw, which fences every writer of an
	// earlier term. A barrier of a term at or above term already in the
	// stream is streamwal.ErrFenced.
	OpenWriter(ctx context.Context, p streamwal.PChannel, term uint64, opts ...WriterOption) (Writer, error)
	// Read returns a scanner over p from a start position, delivering the
	// messages whose subjects match the filters (all of p's when empty).
	Read(ctx context.Context, p streamwal.PChannel, opts ReadOptions) (Scanner, error)
	// Get reads the message of p stored at id (streamwal.ErrInvalidArgument
	// wrapping ErrNotStored if there is none).
	Get(ctx context.Context, p streamwal.PChannel, id messages.MessageID) (*messages.ImmutableMessage, error)
	// Truncate removes every message of p below id (except the newest
	// RecoveryBarrier, which fences earlier writers), after archiving them
	// when the backend keeps an archive.
	Truncate(ctx context.Context, p streamwal.PChannel, below messages.MessageID) error
	// State reports what p's log holds.
	State(ctx context.Context, p streamwal.PChannel) (StreamState, error)
	// Close releases the backend; open writers and scanners keep working
	// until closed themselves.
	Close() error
}

// SegmentStore keeps the messages of flushed segments in object storage
// (DESIGN.md §10).
type SegmentStore interface {
	// WriteSegment stores the messages msgs yields as the flushed segment
	// m describes, as they come; it computes the manifest's checksum, and
	// does not write a segment whose range is stored already.
	WriteSegment(ctx context.Context, m SegmentManifest, msgs Messages) error
	// Segments lists the flushed segments of v, by segment ID.
	Segments(ctx context.Context, v streamwal.VChannel) ([]SegmentManifest, error)
	// ReadSegment reads one flushed segment and verifies its checksum.
	ReadSegment(ctx context.Context, v streamwal.VChannel, id int64) (SegmentManifest, []*messages.ImmutableMessage, error)
}

// Writer appends to one PChannel under one term.
type Writer interface {
	// PChannel is the channel written.
	PChannel() streamwal.PChannel
	// Term is the ownership term the writer opened under.
	Term() uint64
	// Barrier is the RecoveryBarrier the writer appended when it opened.
	Barrier() *messages.ImmutableMessage
	// Append writes msgs atomically and contiguously, in order, and
	// returns their MessageIDs. At most Options.MaxBatch messages.
	Append(ctx context.Context, msgs ...*messages.MutableMessage) ([]messages.MessageID, error)
	// AppendAsync queues msgs and returns a future of their MessageIDs.
	AppendAsync(ctx context.Context, msgs ...*messages.MutableMessage) *AppendFuture
	// Fenced reads the stream's newest RecoveryBarrier and reports whether
	// a newer owner has fenced this writer, without writing anything (an
	// idle writer learns it no other way).
	Fenced(ctx context.Context) (bool, error)
	// Done is closed when the writer stopped (closed, fenced or broken).
	Done() <-chan struct{}
	// Err says why the writer stopped: nil while it runs,
	// streamwal.ErrClosed after Close, streamwal.ErrFenced when fenced.
	Err() error
	// Stats returns the writer's counters.
	Stats() WriterStats
	// Close stops the writer after the appends already queued are resolved.
	Close() error
}

// Scanner delivers the messages of one PChannel in stream order.
type Scanner interface {
	// Start is where the scanner started, with Latest resolved to the
	// position it was pinned to (After the stream's last message when it
	// opened).
	Start() StartPosition
	// Next blocks for the next message, until ctx ends or the scanner is
	// closed (streamwal.ErrClosed).
	Next(ctx context.Context) (*messages.ImmutableMessage, error)
	// All iterates until ctx ends, the scanner closes or an error occurs;
	// the error, if any, is the last pair.
	All(ctx context.Context) iter.Seq2[*messages.ImmutableMessage, error]
	// Close stops the scanner.
	Close() error
}

// ReadOptions configure a scanner.
type ReadOptions struct {
	Start StartPosition
	// Filters are NATS subject filters (see streamwal.Cluster's
	// VChannelFilter and PChannelFilter); empty means every message of the
	// PChannel.
	Filters []string
	// HeadersOnly delivers messages without their payloads (Payload is
	// nil, PayloadSize still gives the size, Body is an error; see
	// messages.Codec.DecodeHeadersOnly), except those of the types in
	// Whole, which come whole: a reader that needs the properties of every
	// message but the bodies of a few (the WAL's replay) then reads a
	// fraction of the bytes. Messages read from the archive come whole.
	HeadersOnly bool
	Whole       []*messages.Type
}

// invalidArg builds an invalid-argument error.
func invalidArg(format string, args ...any) error {
	return streamwal.Errorf(streamwal.CodeInvalidArgument, format, args...)
}
