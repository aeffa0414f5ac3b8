package wal

import (
	"encoding/json"
	"time"

	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/lifecycle"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
)

// ledger consumes what the WAL lands, in MessageID order and without a
// gap, and keeps the state recovery storage persists: the checkpoint, the
// VChannel metadata (a lifecycle table of its own) and the segment
// metadata (a shard manager of its own, driven only by landed messages).
// Appends resolve out of order; the ledger holds the early ones until the
// gap below them fills, and the storage loop reads a message it waits for
// too long (one whose append had an unknown outcome) from the stream. It
// is driven under its own mutex (WAL.lmu), outside the WAL's.
type ledger struct {
	next    messages.MessageID // the next MessageID to consume
	pending map[messages.MessageID]*messages.ImmutableMessage
	life    *lifecycle.Table
	segs    *shard.Manager
	cp      recovery.Checkpoint        // as of the last message consumed
	last    *messages.ImmutableMessage // the last message consumed (cp.Consumed)
	dirty   int                        // messages consumed since the last round
	uploads []int64                    // segments whose Flush was consumed, to store
	stalled time.Time                  // since when a gap blocks consumption
	skipped int                        // messages that changed nothing (dropped or unknown collections, unknown segments)
	// lifeThrough and segsThrough: the metadata restored already covers
	// the messages up to these TimeTicks (a round that wrote the metadata
	// but not its checkpoint leaves it ahead of the checkpoint).
	lifeThrough, segsThrough messages.TimeTick
	// repl is the replication state as of the last message consumed;
	// the checkpoint keeps it (Checkpoint.Replication).
	repl replication
	log  zerolog.Logger
}

// newLedger returns a ledger that consumes from the message after cp's.
func newLedger(cp recovery.Checkpoint, life *lifecycle.Table, segs *shard.Manager, log zerolog.Logger) *ledger {
	return &ledger{next: cp.Consumed + 1, pending: map[messages.MessageID]*messages.ImmutableMessage{},
		life: life, segs: segs, cp: cp, log: log}
}

// landed takes a message that landed, in any order, and consumes what
// became contiguous.
func (l *ledger) landed(m *messages.ImmutableMessage) {
	switch id := m.ID(); {
	case id < l.next:
		return // consumed already (a deduplicated append, a replay)
	case id > l.next:
		if len(l.pending) == 0 {
			l.stalled = time.Now()
		}
		l.pending[id] = m
		return
	}
	l.consume(m)
	l.drain()
}

// drain consumes the pending messages that follow without a gap.
func (l *ledger) drain() {
	for {
		m, ok := l.pending[l.next]
		if !ok {
			break
		}
		delete(l.pending, l.next)
		l.consume(m)
	}
	for id := range l.pending {
		if id < l.next {
			delete(l.pending, id)
		}
	}
	if len(l.pending) > 0 {
		l.stalled = time.Now()
	}
}

// gap returns the MessageID the ledger has waited for longer than
// patience, if any.
func (l *ledger) gap(now time.Time, patience time.Duration) (messages.MessageID, bool) {
	if len(l.pending) == 0 || now.Sub(l.stalled) < patience {
		return 0, false
	}
	return l.next, true
}

// skipTo gives up on the messages below id (the stream holds none).
func (l *ledger) skipTo(id messages.MessageID) {
	if id <= l.next {
		return
	}
	l.log.Error().Uint64("from", uint64(l.next)).Uint64("to", uint64(id)).Msg("ledger: the stream holds no messages in this range; skipped")
	l.next = id
	l.drain()
}

// consume applies the next message in order.
func (l *ledger) consume(m *messages.ImmutableMessage) {
	l.next = m.ID() + 1
	l.cp.Consumed = m.ID()
	l.last = m
	l.cp.TimeTick = max(l.cp.TimeTick, m.TimeTick())
	if lc := m.LastConfirmed(); lc > 0 {
		l.cp.MessageID = lc
	}
	l.dirty++
	if err := l.repl.apply(m); err != nil {
		l.log.Warn().Err(err).Uint64("id", uint64(m.ID())).Msg("ledger: replication message not applied")
	}
	t := m.Type()
	if changesLifecycle(t) && m.TimeTick() > l.lifeThrough {
		if err := l.life.Apply(m); err != nil {
			l.log.Warn().Err(err).Uint64("id", uint64(m.ID())).Msg("ledger: lifecycle message not applied")
		}
	}
	if !changesSegments(t) || m.TimeTick() <= l.segsThrough {
		return
	}
	if err := l.segs.Apply(m); err != nil {
		// A message of a dropped or unknown collection, or of a segment
		// never created: it changes nothing. One line per 1000, not per
		// message: a replay may meet millions.
		if l.skipped%1000 == 0 {
			l.log.Warn().Err(err).Uint64("id", uint64(m.ID())).Str("type", t.Name).Int("skipped", l.skipped+1).Msg("ledger: message changes no segment; skipped")
		}
		l.skipped++
	}
	switch t {
	case messages.TypeFlush:
		var b messages.FlushBody
		if err := m.Body(&b); err == nil {
			l.uploads = append(l.uploads, b.SegmentIDs...)
		}
	case messages.TypeDropCollection:
		// Its segments are flushed-out without a Flush: store them too, so
		// that nothing stays unflushed (and holds truncation back).
		for _, s := range l.segs.Segments() {
			if s.VChannel == m.VChannel() && s.State == shard.Sealed {
				l.uploads = append(l.uploads, s.ID)
			}
		}
	}
}

// snapshot is the state as of the last message consumed.
func (l *ledger) snapshot(reached messages.MessageID) (recovery.Snapshot, error) {
	cp := l.cp
	cp.Reached = max(cp.Reached, reached, cp.Consumed)
	cp.Replication = l.repl.encode()
	segs, err := json.Marshal(l.segs.Segments())
	if err != nil {
		return recovery.Snapshot{}, err
	}
	return recovery.Snapshot{Checkpoint: cp, VChannels: vchannelMeta(l.life.Export()), Segments: segs}, nil
}

// changesSegments reports whether a landed message of t changes segment
// metadata.
func changesSegments(t *messages.Type) bool {
	switch t {
	case messages.TypeCreateSegment, messages.TypeInsert, messages.TypeFlush, messages.TypeManualFlush,
		messages.TypeDropPartition, messages.TypeDropCollection, messages.TypeTruncateCollection, messages.TypeFlushAll:
		return true
	}
	return false
}

// lifecycleRecords converts recovery metadata back to lifecycle records.
func lifecycleRecords(ms []recovery.VChannelMeta) ([]lifecycle.Record, error) {
	out := make([]lifecycle.Record, 0, len(ms))
	for _, m := range ms {
		v, err := streamwal.ParseVChannel(m.VChannel)
		if err != nil {
			return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "vchannel metadata: %w", err)
		}
		dropped := m.State == "dropped"
		out = append(out, lifecycle.Record{VChannel: v, Created: !dropped || m.CreatedBy != "", Dropped: dropped,
			CreatedBy: m.CreatedBy, DroppedBy: m.DroppedBy, Partitions: m.Partitions, Gone: m.DroppedPartitions, DDL: m.DDLIDs})
	}
	return out, nil
}

// vchannelMeta converts lifecycle records to recovery metadata.
func vchannelMeta(rs []lifecycle.Record) []recovery.VChannelMeta {
	out := make([]recovery.VChannelMeta, 0, len(rs))
	for _, r := range rs {
		state := "normal"
		if r.Dropped {
			state = "dropped"
		}
		out = append(out, recovery.VChannelMeta{
			VChannel: r.VChannel.String(), CollectionID: r.VChannel.CollectionID(), State: state,
			Partitions: r.Partitions, DroppedPartitions: r.Gone, CreatedBy: r.CreatedBy, DroppedBy: r.DroppedBy, DDLIDs: r.DDL,
		})
	}
	return out
}
