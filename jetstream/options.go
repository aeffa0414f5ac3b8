package jetstream

import (
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
)

// Defaults of Options.
const (
	// DefaultMaxBatch is the server's limit on messages per atomic batch.
	DefaultMaxBatch = 1000
	// DefaultMaxInFlight is how many batches a writer keeps in flight; the
	// server allows 50 per stream.
	DefaultMaxInFlight = 4
	// DefaultPlainUpTo is Options.PlainUpTo's default on one replica.
	DefaultPlainUpTo = 8
	// DefaultMaxInFlightMsgs bounds the messages a writer has in flight.
	DefaultMaxInFlightMsgs = 4096
	// DefaultAckTimeout bounds the wait for a batch's commit ack before the
	// writer resolves the tail.
	DefaultAckTimeout = 5 * time.Second
	// DefaultDuplicateWindow is the stream's Nats-Msg-Id window.
	DefaultDuplicateWindow = 2 * time.Minute
	// headerAllowance is added to the payload limit for the stream's
	// maximum message size.
	headerAllowance = 64 << 10
)

// Options configure a JetStream backend and the streams it provisions.
type Options struct {
	// Replicas of each stream: 1 standalone (default), 3 on a NATS cluster.
	Replicas int
	// MemoryStorage keeps streams in memory instead of files (tests only).
	MemoryStorage bool
	// DuplicateWindow is how long the server remembers message IDs.
	DuplicateWindow time.Duration
	// MaxMsgSize is the stream's largest message, headers included; default
	// the codec's payload limit plus 64 KiB.
	MaxMsgSize int32
	// MaxBatch bounds the messages of one atomic batch (and of one Append).
	MaxBatch int
	// MaxInFlight bounds the atomic batches a writer has in flight.
	MaxInFlight int
	// MaxInFlightMsgs bounds the messages a writer has in flight. With
	// Replicas > 1 a writer keeps one fenced unit in flight (see the
	// package doc): the server refuses a second pending expectation on the
	// barrier subject.
	MaxInFlightMsgs int
	// GroupCommit gathers every waiting append into the next unit (one
	// atomic batch of up to MaxBatch messages) and keeps at most
	// MaxInFlight units in flight (at least two when a full batch waits). Use it when the server fsyncs before
	// acknowledging (SyncAlways): one batch costs one fsync. Without it
	// (the default), every append goes out on its own as soon as the
	// pipeline has room: a pipelined plain publish (one message) or an
	// atomic batch (a multi-message append). That is faster when the server
	// does not fsync each write, because an R1 atomic batch has a fixed
	// staging cost on file storage. With Replicas > 1 it is always on: a
	// writer of a replicated stream keeps one fenced unit in flight, so
	// each must carry everything that waits.
	GroupCommit bool
	// PlainUpTo, with GroupCommit, sends a short queue (at most this many
	// messages, every append of one message) as plain publishes pipelined
	// one behind the other instead of one atomic batch, whose fixed
	// staging cost a handful of messages do not repay (an R1 atomic batch
	// under fsync costs several fsyncs' worth, see BenchmarkAppendPolicy);
	// a longer queue still waits and goes as one batch. 0 is
	// DefaultPlainUpTo on a stream of one replica (a replicated stream
	// already sends its writer's lone publishes at once, see the package
	// doc); a negative value always batches.
	PlainUpTo int
	// AckTimeout bounds the wait for a batch's ack.
	AckTimeout time.Duration
	// Archive keeps what Truncate removes in the object store (tiered
	// storage): reads that start below the truncation point read it there
	// first, then continue on the stream. Default off.
	Archive bool
	// ArchiveObjectBytes bounds the size of one archived object (default
	// DefaultArchiveObjectBytes, 8 MiB; a larger message goes alone).
	ArchiveObjectBytes int
	// PChannels, when set, are the only PChannels the backend serves;
	// any other is an invalid argument.
	PChannels []streamwal.PChannel
	// Logger receives the backend's logs (default: none).
	Logger zerolog.Logger
	// Hooks receive the writers' events (telemetry.UnitHook,
	// telemetry.WriterRecoveryHook); the counters of Writer.Stats are kept
	// either way.
	Hooks telemetry.Hooks
}

// withDefaults fills unset fields.
func (o Options) withDefaults(codec *messages.Codec) Options {
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.Replicas > 1 {
		// One fenced unit is in flight on a replicated stream (see
		// replicatedRoom): only gathering what waits into it keeps the
		// throughput up.
		o.GroupCommit = true
	}
	if o.DuplicateWindow == 0 {
		o.DuplicateWindow = DefaultDuplicateWindow
	}
	if o.MaxMsgSize == 0 {
		o.MaxMsgSize = int32(codec.MaxPayload() + headerAllowance)
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.PlainUpTo == 0 && o.Replicas == 1 {
		o.PlainUpTo = DefaultPlainUpTo
	}
	if o.MaxInFlight == 0 && o.GroupCommit {
		// One unit in flight: everything that arrives meanwhile joins the
		// next, which is what makes group commit pay.
		o.MaxInFlight = 1
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.MaxInFlightMsgs == 0 {
		o.MaxInFlightMsgs = DefaultMaxInFlightMsgs
	}
	if o.AckTimeout == 0 {
		o.AckTimeout = DefaultAckTimeout
	}
	if o.ArchiveObjectBytes == 0 {
		o.ArchiveObjectBytes = DefaultArchiveObjectBytes
	}
	return o
}

// validate checks filled options.
func (o Options) validate() error {
	switch {
	case o.Replicas < 1 || o.Replicas > 5:
		return invalidArg("replicas %d must be in [1, 5]", o.Replicas)
	case o.DuplicateWindow < time.Second:
		return invalidArg("duplicate window %v must be at least 1s", o.DuplicateWindow)
	case o.MaxMsgSize < 1024:
		return invalidArg("max message size %d must be at least 1 KiB", o.MaxMsgSize)
	case o.MaxBatch < 1 || o.MaxBatch > DefaultMaxBatch:
		return invalidArg("max batch %d must be in [1, %d]", o.MaxBatch, DefaultMaxBatch)
	case o.MaxInFlight < 1 || o.MaxInFlight > 50:
		return invalidArg("max in flight %d must be in [1, 50]", o.MaxInFlight)
	case o.MaxInFlightMsgs < 1:
		return invalidArg("max in flight messages %d must be positive", o.MaxInFlightMsgs)
	case o.AckTimeout < 10*time.Millisecond:
		return invalidArg("ack timeout %v must be at least 10ms", o.AckTimeout)
	case o.ArchiveObjectBytes < 1024:
		return invalidArg("archive object bytes %d must be at least 1 KiB", o.ArchiveObjectBytes)
	}
	return nil
}

// storage is the stream storage type.
func (o Options) storage() njs.StorageType {
	if o.MemoryStorage {
		return njs.MemoryStorage
	}
	return njs.FileStorage
}

// WriterOption configures one writer.
type WriterOption func(*writerConfig)

// writerConfig is what WriterOptions set.
type writerConfig struct {
	barrier *messages.MutableMessage
	node    string
}

// WithBarrier appends b as the writer's RecoveryBarrier instead of a
// default one, so that the caller can stamp it (the node gives it a
// TimeTick). b must be a RecoveryBarrier of the writer's PChannel whose body
// carries the writer's term.
func WithBarrier(b *messages.MutableMessage) WriterOption {
	return func(c *writerConfig) { c.barrier = b }
}

// WithNode names the node that writes, recorded in the default barrier.
func WithNode(id string) WriterOption {
	return func(c *writerConfig) { c.node = id }
}
