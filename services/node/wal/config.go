package wal

import (
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/timetick"
)

// Defaults.
const (
	// DefaultSyncInterval is how often the sync loop runs (DESIGN.md §9).
	DefaultSyncInterval = 200 * time.Millisecond
	// DefaultTimeTickBatch is how many TimeTicks are drawn from the oracle
	// at once.
	DefaultTimeTickBatch = 1024
	// closeBudget bounds how long Close waits for appends in flight.
	closeBudget = 3 * time.Second
)

// TickPublisher publishes live ticks on core NATS; *nats.Conn is one.
type TickPublisher interface {
	PublishMsg(m *nats.Msg) error
}

// Config configures a WAL.
type Config struct {
	// Backend stores the PChannel's stream, and Codec builds the messages
	// the WAL writes itself; both required.
	Backend jetstream.Backend
	Codec   *messages.Codec
	// PChannel is the channel; Term the ownership term (positive).
	PChannel streamwal.PChannel
	Term     uint64
	// Node names the owner in its RecoveryBarrier.
	Node string
	// Oracle hands out TimeTicks; required.
	Oracle timetick.Oracle
	// TimeTickBatch is how many TimeTicks to draw at once (default 1024).
	TimeTickBatch uint32
	// SyncInterval is the period of the sync loop (default 200 ms).
	SyncInterval time.Duration
	// Ticks publishes live ticks; nil publishes none (readers then advance
	// only on persisted TimeTick messages).
	Ticks TickPublisher
	// Logger receives the WAL's logs (the zero value discards them).
	Logger zerolog.Logger
	// Storage turns on recovery storage, shard management and truncation;
	// nil replays the stream from its first message at every open and
	// never truncates it.
	Storage *Storage
}

// withDefaults validates c and fills in defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Backend == nil || c.Codec == nil || c.Oracle == nil || c.PChannel.IsZero() || c.Term == 0 {
		return c, streamwal.Errorf(streamwal.CodeInvalidArgument, "wal config needs a backend, a codec, an oracle, a pchannel and a positive term")
	}
	if c.TimeTickBatch == 0 {
		c.TimeTickBatch = DefaultTimeTickBatch
	}
	if c.SyncInterval <= 0 {
		c.SyncInterval = DefaultSyncInterval
	}
	var err error
	c.Storage, err = c.Storage.withDefaults()
	return c, err
}
