package wal

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/lifecycle"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
)

// keeper is the WAL's recovery storage: its persister and the schedules
// of its two loops. The storage loop reads the messages the ledger waits
// for and persists rounds; the tiering loop stores flushed segments and
// truncates the stream, which may take long (a segment of 100 MiB is read
// back and written whole) and so never holds a checkpoint back. Each
// field belongs to one loop (and to Close once both stopped), except
// persisted and kicked, which are guarded by the ledger's mutex (WAL.lmu).
type keeper struct {
	cfg       *Storage
	pers      *recovery.Persister
	lastRound time.Time           // storage loop
	lastTrunc time.Time           // tiering loop
	persisted recovery.Checkpoint // the last checkpoint written
	// kicked: the storage loop was woken for enough dirty messages and
	// has not persisted since, so the appends that land meanwhile do not
	// wake it again, each for a round that minRoundGap holds back.
	kicked bool
	kick   chan struct{} // wakes the storage loop: enough is dirty
	tier   chan struct{} // wakes the tiering loop: a segment to store
	done   chan struct{} // both loops stopped
}

// kickStorage asks for a round now if enough is dirty, and for a tiering
// round if a segment waits to be stored (under w.lmu).
func (w *WAL) kickStorage() {
	if len(w.led.uploads) > 0 {
		wake(w.st.tier)
	}
	if !w.st.kicked && w.led.dirty >= w.st.cfg.Cadence.Dirty {
		w.st.kicked = true
		wake(w.st.kick)
	}
}

// wake signals c without blocking.
func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// startStorage starts the storage and tiering loops.
func (w *WAL) startStorage() {
	var loops sync.WaitGroup
	loops.Add(2)
	c := w.st.cfg
	go func() { defer loops.Done(); w.loop(min(c.Cadence.Interval, gapPatience/2), w.st.kick, w.storageRound) }()
	go func() {
		defer loops.Done()
		w.loop(min(c.TruncateInterval, time.Second), w.st.tier, func(ctx context.Context) time.Duration { w.tieringRound(ctx); return 0 })
	}()
	go func() { loops.Wait(); close(w.st.done) }()
}

// loop runs round every period, whenever kick fires, and when the last
// round asked to run again after a while, until the WAL stops.
func (w *WAL) loop(period time.Duration, kick <-chan struct{}, round func(context.Context) (again time.Duration)) {
	t := time.NewTicker(period)
	defer t.Stop()
	var again <-chan time.Time
	for {
		select {
		case <-w.stop:
			return
		case <-w.w.Done():
			return
		case <-t.C:
		case <-kick:
		case <-again:
		}
		again = nil
		if d := round(w.alive); d > 0 {
			again = time.After(d)
		}
	}
}

// storageRound is one turn of the storage loop; it asks to run again
// once minRoundGap lets a round that is due go.
func (w *WAL) storageRound(ctx context.Context) time.Duration {
	w.fillGap(ctx, gapPatience)
	again, err := w.persist(ctx, false)
	if err != nil {
		w.log.Warn().Err(err).Msg("checkpoint not persisted; will retry")
	}
	return again
}

// tieringRound is one turn of the tiering loop.
func (w *WAL) tieringRound(ctx context.Context) {
	w.storeSegments(ctx)
	if err := w.truncate(ctx); err != nil {
		w.log.Warn().Err(err).Msg("truncation failed; will retry")
	}
}

// fillGap reads from the stream the message the ledger has waited for
// longer than patience.
func (w *WAL) fillGap(ctx context.Context, patience time.Duration) {
	w.lmu.Lock()
	id, ok := w.led.gap(time.Now(), patience)
	w.lmu.Unlock()
	if !ok {
		return
	}
	m, err := w.cfg.Backend.Get(ctx, w.cfg.PChannel, id)
	if errors.Is(err, jetstream.ErrNotStored) {
		next := id + 1
		if s, err := w.st.cfg.Tiers.State(ctx, w.cfg.PChannel); err == nil && s.First > id {
			next = s.First
		}
		w.lmu.Lock()
		w.led.skipTo(next)
		w.lmu.Unlock()
		return
	}
	if err != nil {
		w.log.Debug().Err(err).Uint64("id", uint64(id)).Msg("ledger: read of a missing message failed")
		return
	}
	w.lmu.Lock()
	w.led.landed(m)
	w.lmu.Unlock()
}

// persist writes a round if one is due (or, when final, if anything is
// dirty): metadata first, the checkpoint last (see recovery.Persister).
// When enough is dirty but the last round was less than minRoundGap ago,
// it writes nothing and says how long until it may (again).
func (w *WAL) persist(ctx context.Context, final bool) (again time.Duration, err error) {
	now := time.Now()
	w.mu.Lock()
	reached := w.maxAcked
	w.mu.Unlock()
	w.lmu.Lock()
	gap := minRoundGap - now.Sub(w.st.lastRound)
	due := w.led.dirty > 0 && (final || gap <= 0 && w.st.cfg.Cadence.Due(now, w.st.lastRound, w.led.dirty))
	if !due {
		if w.st.kicked && gap > 0 {
			again = gap
		}
		w.lmu.Unlock()
		return again, nil
	}
	w.st.kicked = false
	snap, err := w.led.snapshot(reached)
	last := w.led.last
	dirty := w.led.dirty
	w.led.dirty = 0
	w.lmu.Unlock()
	if err == nil {
		err = w.digest(ctx, &snap.Checkpoint, last)
	}
	if err == nil {
		snap.Checkpoint.Term, snap.Checkpoint.Node, snap.Checkpoint.Written = w.cfg.Term, w.cfg.Node, now.UTC()
		err = w.st.pers.Persist(ctx, snap)
	}
	if errors.Is(err, streamwal.ErrFenced) {
		w.mu.Lock()
		w.failLocked(streamwal.Errorf(streamwal.CodeFenced, "%s under term %d: a newer owner holds the checkpoint: %w", w.cfg.PChannel, w.cfg.Term, err))
		w.mu.Unlock()
		return 0, err
	}
	w.lmu.Lock()
	defer w.lmu.Unlock()
	if err != nil {
		w.led.dirty += dirty
		return 0, err
	}
	w.st.lastRound = now
	w.st.persisted = snap.Checkpoint
	return 0, nil
}

// digest records the digest of the checkpoint's last consumed message:
// the next open compares it with what the stream holds then. When the
// ledger consumed it whole (last: an append's result, or a message read
// from the stream), that is the message as acknowledged; otherwise (a
// replay reads headers only) it is read from the stream. Reading it back
// at every persist round cost appends a tenth of their rate under load: a
// get on a stream waits for the writes that fsync on it, ten times a
// second.
func (w *WAL) digest(ctx context.Context, cp *recovery.Checkpoint, last *messages.ImmutableMessage) error {
	if cp.Consumed == 0 {
		return nil
	}
	if last != nil && last.ID() == cp.Consumed && !last.HeadersOnly() {
		cp.Digest = recovery.Digest(last)
		return nil
	}
	m, err := w.cfg.Backend.Get(ctx, w.cfg.PChannel, cp.Consumed)
	if err != nil {
		return err
	}
	cp.Digest = recovery.Digest(m)
	return nil
}

// storeSegments writes the segments whose Flush was consumed to the
// object store, then marks them flushed.
func (w *WAL) storeSegments(ctx context.Context) {
	w.lmu.Lock()
	ids := w.led.uploads
	w.led.uploads = nil
	var segs []shard.Segment
	if len(ids) > 0 {
		segs = w.led.segs.Segments()
	}
	w.lmu.Unlock()
	byID := make(map[int64]shard.Segment, len(segs))
	for _, s := range segs {
		byID[s.ID] = s
	}
	for i, id := range ids {
		s, ok := byID[id]
		if !ok || s.State == shard.Flushed {
			continue
		}
		if err := w.storeSegment(ctx, s); err != nil {
			w.log.Warn().Err(err).Int64("segment", id).Msg("segment not stored; will retry")
			w.lmu.Lock()
			w.led.uploads = append(w.led.uploads, ids[i:]...)
			w.lmu.Unlock()
			return
		}
		w.lmu.Lock()
		if err := w.led.segs.MarkFlushed(id); err != nil {
			w.log.Warn().Err(err).Int64("segment", id).Msg("segment stored but not marked flushed")
		}
		w.led.dirty++
		w.lmu.Unlock()
		w.log.Info().Int64("segment", id).Str("vchannel", s.VChannel.String()).Uint64("rows", s.Rows).Uint64("bytes", s.Bytes).
			Str("reason", string(s.Reason)).Msg("segment flushed")
	}
}

// storeSegment streams segment s's inserts from the stream to the object
// store with their manifest (WriteSegment checks the ranges against the
// messages and counts their bytes): a segment of any size is stored in
// constant memory.
func (w *WAL) storeSegment(ctx context.Context, s shard.Segment) error {
	ctx, cancel := context.WithTimeout(ctx, segmentStoreTimeout)
	defer cancel()
	return w.st.cfg.Tiers.WriteSegment(ctx, jetstream.SegmentManifest{
		VChannel: s.VChannel.String(), Segment: s.ID, Partition: s.Partition,
		FirstID: s.First, LastID: s.Last, FirstTimeTick: s.FirstTT, LastTimeTick: s.LastTT,
		Reason: string(s.Reason),
	}, w.segmentMessages(ctx, s))
}

// segmentStoreTimeout bounds the storing of one segment (a segment of a
// million inserts is read and written in seconds).
const segmentStoreTimeout = 5 * time.Minute

// segmentMessages reads the inserts of segment s from its VChannel, one at
// a time.
func (w *WAL) segmentMessages(ctx context.Context, s shard.Segment) jetstream.Messages {
	return func(yield func(*messages.ImmutableMessage, error) bool) {
		if s.First == 0 {
			return
		}
		sc, err := w.cfg.Backend.Read(ctx, w.cfg.PChannel, jetstream.ReadOptions{
			Start: jetstream.From(s.First), Filters: w.codec.Cluster().VChannelFilter(s.VChannel)})
		if err != nil {
			yield(nil, err)
			return
		}
		defer sc.Close()
		for m, err := range sc.All(ctx) {
			if err != nil {
				yield(nil, err)
				return
			}
			if m.ID() > s.Last {
				return
			}
			if d, ok := m.DML(); m.Type() == messages.TypeInsert && ok && d.SegmentID == s.ID && !yield(m, nil) {
				return
			}
			if m.ID() == s.Last {
				return
			}
		}
	}
}

// truncate purges the stream below the smallest of: the persisted
// checkpoint's replay start, the first message of every segment not yet
// flushed, the durable readers' holds and the retention floor.
func (w *WAL) truncate(ctx context.Context) error {
	cfg := w.st.cfg
	now := time.Now()
	if cfg.Retain < 0 || now.Sub(w.st.lastTrunc) < cfg.TruncateInterval {
		return nil
	}
	w.st.lastTrunc = now
	w.lmu.Lock()
	bound := w.st.persisted.MessageID
	for _, s := range w.led.segs.Segments() {
		if s.State != shard.Flushed && s.First > 0 {
			bound = min(bound, s.First)
		}
	}
	done := w.led.cp.Truncated
	w.lmu.Unlock()
	if cfg.Holds != nil {
		if h := cfg.Holds(); h > 0 {
			bound = min(bound, h)
		}
	}
	if bound <= max(done, 1) {
		return nil
	}
	if cfg.Retain > 0 {
		var err error
		if bound, err = w.retained(ctx, max(done, 1), bound, messages.TimeTickAt(now.Add(-cfg.Retain))); err != nil || bound <= max(done, 1) {
			return err
		}
	}
	if err := w.cfg.Backend.Truncate(ctx, w.cfg.PChannel, bound); err != nil {
		return err
	}
	w.lmu.Lock()
	w.led.cp.Truncated = bound
	w.led.dirty++
	w.lmu.Unlock()
	w.log.Info().Uint64("below", uint64(bound)).Msg("stream truncated")
	return nil
}

// retained is the smallest MessageID in [lo, hi) whose TimeTick is at or
// after cutoff (hi if none): TimeTicks grow with MessageIDs, so a binary
// search over the stream finds it.
func (w *WAL) retained(ctx context.Context, lo, hi messages.MessageID, cutoff messages.TimeTick) (messages.MessageID, error) {
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, err := w.cfg.Backend.Get(ctx, w.cfg.PChannel, mid)
		if err != nil {
			return lo, err
		}
		if m.TimeTick() >= cutoff {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
}

// finalRound persists what the ledger consumed, once the storage loop
// stopped and the appends resolved, within the close budget.
func (w *WAL) finalRound() {
	if w.st == nil {
		return
	}
	<-w.st.done
	ctx, cancel := context.WithTimeout(context.Background(), closeBudget)
	defer cancel()
	w.fillGap(ctx, 0)
	if _, err := w.persist(ctx, true); err != nil && !errors.Is(err, streamwal.ErrFenced) {
		w.log.Warn().Err(err).Msg("final checkpoint not persisted")
	}
}

// StorageState is what recovery storage holds of the WAL: the ledger's
// checkpoint (what it consumed so far), the last checkpoint persisted, and
// the VChannel and segment metadata as of the ledger's checkpoint.
type StorageState struct {
	Consumed  recovery.Checkpoint
	Persisted recovery.Checkpoint
	VChannels []lifecycle.Record
	Segments  []shard.Segment
}

// StorageState reports the WAL's recovery storage; false without one.
func (w *WAL) StorageState() (StorageState, bool) {
	w.lmu.Lock()
	defer w.lmu.Unlock()
	if w.led == nil {
		return StorageState{}, false
	}
	return StorageState{Consumed: w.led.cp, Persisted: w.st.persisted, VChannels: w.led.life.Export(), Segments: w.led.segs.Segments()}, true
}
