package wal

import (
	"context"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
)

// Defaults of recovery storage.
const (
	// DefaultTruncateInterval is how often a WAL truncates its stream.
	DefaultTruncateInterval = 10 * time.Second
	// minRoundGap spaces persist rounds under load: a round is due at
	// once past Cadence.Dirty messages, but at most every minRoundGap, so
	// that checkpoint writes do not compete with the appends they cover.
	minRoundGap = 100 * time.Millisecond
	// gapPatience is how long the ledger waits for a landed message it
	// has not heard of (an append of unknown outcome that did land)
	// before it reads it from the stream.
	gapPatience = 500 * time.Millisecond
)

// Tiers is what recovery storage needs of the backend beyond Backend:
// the stream's state, an advance past lost history, and the object store
// of flushed segments. *jetstream.JetStream implements it.
type Tiers interface {
	State(ctx context.Context, p streamwal.PChannel) (jetstream.StreamState, error)
	Advance(ctx context.Context, p streamwal.PChannel, next messages.MessageID) error
	WriteSegment(ctx context.Context, m jetstream.SegmentManifest, msgs jetstream.Messages) error
}

// Storage turns on recovery storage, shard management and truncation
// (DESIGN.md §10). See the package doc.
type Storage struct {
	// Store keeps the checkpoint and the metadata (the cluster's
	// checkpoints bucket); Tiers gives the stream's state and stores
	// flushed segments. Both required.
	Store recovery.Store
	Tiers Tiers
	// Shard configures the seal policies.
	Shard shard.Config
	// Cadence says when a persist round is due (default: every 10 s, at
	// once past 100 dirty messages).
	Cadence recovery.Cadence
	// Retain keeps at least this much of the log, by TimeTick age, in the
	// stream; 0 truncates as soon as what is below is flushed and
	// checkpointed; negative never truncates.
	Retain time.Duration
	// TruncateInterval is how often truncation runs (default 10 s).
	TruncateInterval time.Duration
	// Holds reports the smallest MessageID that durable readers
	// (subscriptions, replication) still need, 0 for none; nil: none.
	Holds func() messages.MessageID
}

// withDefaults validates s and fills in defaults.
func (s *Storage) withDefaults() (*Storage, error) {
	if s == nil {
		return nil, nil
	}
	if s.Store == nil || s.Tiers == nil {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "wal storage needs a store and tiers")
	}
	c := *s
	if c.Cadence.Interval <= 0 {
		c.Cadence.Interval = 10 * time.Second
	}
	if c.Cadence.Dirty <= 0 {
		c.Cadence.Dirty = 100
	}
	if c.TruncateInterval <= 0 {
		c.TruncateInterval = DefaultTruncateInterval
	}
	return &c, nil
}
