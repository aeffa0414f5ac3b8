package wal

import (
	"context"
	"time"

	"github.com/streamwal/streamwal/messages"
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
		case <-w.w.Done():
			w.log.Warn().Err(w.w.Err()).Msg("writer stopped")
			return
		case <-t.C:
			if err := w.Sync(context.Background()); err != nil {
				w.log.Debug().Err(err).Msg("timetick sync")
			}
		}
	}
}

// Sync runs one round of the sync loop: it appends a TimeTick message if
// anything landed since the last one, or else, when nothing is in flight,
// publishes a live tick; and it expires idle transactions. The loop calls
// it every Config.SyncInterval; tests call it directly.
func (w *WAL) Sync(ctx context.Context) error {
	w.mu.Lock()
	dirty := w.dirty
	// Drop the rest of the TimeTick batch, so that TimeTicks (and with
	// them transaction expiry) follow the oracle's clock within one
	// interval even when appends are too few to use a batch up.
	w.alloc.Reset()
	w.mu.Unlock()
	if dirty {
		return w.appendTick(ctx)
	}
	return w.liveTick()
}

// appendTick appends a persisted TimeTick message.
func (w *WAL) appendTick(ctx context.Context) error {
	m, err := w.codec.NewPChannelBody(messages.TypeTimeTick, w.cfg.PChannel, messages.TimeTickBody{})
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.dirty = false
	w.mu.Unlock()
	if _, err := w.run(ctx, &appendOp{msgs: []*messages.MutableMessage{m}, internal: true}); err != nil {
		w.mu.Lock()
		w.dirty = true
		w.mu.Unlock()
		return err
	}
	return nil
}

// liveTick publishes a live tick if the stream's last message is a
// TimeTick or barrier of this WAL and nothing is in flight; it expires
// idle transactions either way.
func (w *WAL) liveTick() error {
	w.mu.Lock()
	if err := w.stoppedLocked(); err != nil {
		w.mu.Unlock()
		return err
	}
	if w.acks.Pending() > 0 || w.tickID == 0 {
		w.mu.Unlock()
		return nil
	}
	tt, err := w.nextTimeTick()
	if err != nil {
		w.mu.Unlock()
		return err
	}
	w.txns.Expire(tt)
	covers := w.tickID
	w.mu.Unlock()
	if w.cfg.Ticks == nil {
		return nil
	}
	msg, err := w.codec.EncodeLiveTick(messages.LiveTick{PChannel: w.cfg.PChannel, TimeTick: tt, Covers: covers, Term: w.cfg.Term})
	if err != nil {
		return err
	}
	return w.cfg.Ticks.PublishMsg(msg)
}
