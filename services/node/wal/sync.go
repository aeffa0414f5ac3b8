package wal

import (
	"context"
	"errors"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/timetick"
)

// syncLoop runs the TimeTick sync every interval until the WAL stops.
func (w *WAL) syncLoop() {
	defer close(w.loopDone)
	t := time.NewTicker(w.cfg.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-w.broken:
			w.log.Warn().Err(w.Err()).Msg("wal broken; done")
			return
		case <-w.w.Done():
			w.log.Warn().Err(w.w.Err()).Msg("writer stopped")
			return
		case <-t.C:
			err := w.Sync(w.alive) // Close cancels a tick in flight
			if errors.Is(err, streamwal.ErrFenced) {
				return
			}
			if err != nil {
				w.log.Debug().Err(err).Msg("timetick sync")
			}
			w.shardTick(w.alive)
		}
	}
}

// Sync runs one round of the sync loop: it appends a TimeTick message if
// anything landed since the last one, or else, when nothing is in flight,
// publishes a live tick; and it expires idle transactions. The loop calls
// it every Config.SyncInterval; tests call it directly.
func (w *WAL) Sync(ctx context.Context) error {
	w.mu.Lock()
	if err := w.stoppedLocked(); err != nil {
		w.mu.Unlock()
		return err
	}
	// Drop the rest of the TimeTick batch, so that TimeTicks (and with
	// them transaction expiry) follow the oracle's clock within one
	// interval even when appends are too few to use a batch up.
	w.alloc.Reset()
	action, covers := w.syncer.Decide(w.acks.Pending())
	if action != timetick.SyncLive {
		w.mu.Unlock()
		if action == timetick.SyncPersist {
			return w.appendTick(ctx)
		}
		return nil
	}
	// The live tick's TimeTick is drawn in the same critical section as
	// the decision, so no append can be ordered between them.
	tt, err := w.nextTimeTick()
	if err == nil {
		w.txns.Expire(tt)
	}
	w.mu.Unlock()
	if err != nil {
		return err
	}
	// An idle WAL learns of a newer owner only by looking. Looking after
	// drawing the TimeTick is what makes the tick sound: a newer owner
	// whose barrier lands after the look draws its own TimeTicks later
	// still, so above this one.
	if err := w.checkFence(ctx); err != nil {
		return err
	}
	return w.publishLive(messages.LiveTick{PChannel: w.cfg.PChannel, TimeTick: tt, Covers: covers, Term: w.cfg.Term})
}

// checkFence stops the WAL if a newer owner fenced it.
func (w *WAL) checkFence(ctx context.Context) error {
	fenced, err := w.w.Fenced(ctx)
	if err != nil || !fenced {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failLocked(streamwal.Errorf(streamwal.CodeFenced, "%s under term %d: a newer owner landed its barrier", w.cfg.PChannel, w.cfg.Term))
	return w.stopped
}

// appendTick appends a persisted TimeTick message.
func (w *WAL) appendTick(ctx context.Context) error {
	m, err := w.codec.NewPChannelBody(messages.TypeTimeTick, w.cfg.PChannel, messages.TimeTickBody{})
	if err != nil {
		return err
	}
	if _, err := w.run(ctx, &appendOp{msgs: []*messages.MutableMessage{m}, internal: true}); err != nil {
		w.mu.Lock()
		w.syncer.Failed()
		w.mu.Unlock()
		return err
	}
	return nil
}

// publishLive publishes a live tick on core NATS.
func (w *WAL) publishLive(t messages.LiveTick) error {
	if w.cfg.Ticks == nil {
		return nil
	}
	msg, err := w.codec.EncodeLiveTick(t)
	if err != nil {
		return err
	}
	return w.cfg.Ticks.PublishMsg(msg)
}
