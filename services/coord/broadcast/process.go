package broadcast

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// start runs a task once its keys are granted (granted nil: they are).
func (b *Broadcaster) start(r *run, granted chan struct{}) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		if granted != nil {
			select {
			case <-granted:
			case <-b.ctx.Done():
				return
			}
		}
		b.process(r)
	}()
}

// process appends a task to its targets, waits for its acknowledgements
// and its callback, and makes it a tombstone.
func (b *Broadcaster) process(r *run) {
	if err := b.appendAll(r); err != nil {
		var refused *firstRefused
		if errors.As(err, &refused) {
			b.reject(r, refused.err)
			return
		}
		b.fail(r, err)
		return
	}
	if !b.awaitAcks(r) {
		return
	}
	if b.cfg.Callbacks[r.task.Type] != nil {
		b.enqueue(r)
		select {
		case <-r.called:
		case <-b.ctx.Done():
			return
		}
	}
	if err := b.finish(r); err != nil {
		b.log.Warn().Err(err).Uint64("broadcast", r.task.ID).Msg("tombstone")
	}
}

// appendAll appends the append-first target, then every other target
// concurrently, each until it lands.
func (b *Broadcaster) appendAll(r *run) error {
	if first := r.task.AppendFirst; first != "" {
		if err := b.appendTarget(r, first); err != nil {
			if b.ctx.Err() == nil && streamwal.CodeOf(err) != streamwal.CodeInternal {
				return &firstRefused{err: err}
			}
			return err
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(r.replicas))
	for _, name := range r.task.targets() {
		if name == r.task.AppendFirst {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.appendTarget(r, name); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// firstRefused is a refusal of the append-first target: nothing of the
// broadcast landed anywhere.
type firstRefused struct{ err error }

func (e *firstRefused) Error() string { return e.err.Error() }

// reject ends a broadcast whose append-first target refused it: nothing
// landed, so it changes nothing, gives its keys back and reports the
// refusal (bad input gets an error and changes nothing).
func (b *Broadcaster) reject(r *run, err error) {
	b.log.Info().Err(err).Uint64("broadcast", r.task.ID).Msg("broadcast refused by its first target")
	b.mu.Lock()
	r.task.State, r.task.Error, r.task.ErrorCode = Tombstone, err.Error(), streamwal.CodeOf(err)
	r.task.Finished = time.Now().UTC()
	r.err = err
	b.mu.Unlock()
	if b.save(r) != nil {
		return // stopped: the next coordinator resumes and is refused again
	}
	b.release(r.task.ID)
	close(r.done)
}

// appendTarget appends one replica (unless it already landed before a
// takeover) with backoff, records and persists where it landed.
func (b *Broadcaster) appendTarget(r *run, name string) error {
	b.mu.Lock()
	_, done := r.task.Appended[name]
	b.mu.Unlock()
	if done {
		b.noteAck(r, name, false)
		return nil
	}
	res, err := b.appendRetrying(r.replicas[name].Clone())
	if err != nil {
		return fmt.Errorf("append broadcast %d to %s: %w", r.task.ID, name, err)
	}
	b.mu.Lock()
	r.task.Appended[name] = res
	b.mu.Unlock()
	if err := b.save(r); err != nil {
		return err
	}
	b.noteAck(r, name, false)
	return nil
}

// appendRetrying appends m until it lands, the broadcaster stops, or a
// refusal that can never succeed.
func (b *Broadcaster) appendRetrying(m *messages.MutableMessage) (wire.AppendResult, error) {
	var res wire.AppendResult
	err := b.retry(time.Second, func() error {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		defer cancel()
		var err error
		res, err = b.cfg.Appender.Append(ctx, m.Clone())
		if err != nil && b.ctx.Err() == nil && !streamwal.IsRetriableWithID(err) {
			return backoff.Permanent(err)
		}
		return err
	})
	return res, err
}

// retry calls fn until it succeeds, returns a backoff.Permanent error
// (returned unwrapped), or the broadcaster stops (errStopped), pausing
// between attempts from 10 ms, doubling up to maxDelay.
func (b *Broadcaster) retry(maxDelay time.Duration, fn func() error) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.Multiplier, bo.RandomizationFactor = 10*time.Millisecond, maxDelay, 2, 0
	for {
		err := fn()
		var permanent *backoff.PermanentError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &permanent):
			return permanent.Unwrap()
		case b.ctx.Err() != nil:
			return errStopped
		}
		select {
		case <-b.ctx.Done():
			return errStopped
		case <-time.After(bo.NextBackOff()):
		}
	}
}

// noteAck acknowledges a target: at once from its append result, unless
// the type waits for the consumers (explicit true means such an ack).
func (b *Broadcaster) noteAck(r *run, name string, explicit bool) {
	typ, _ := b.cfg.Codec.Registry().Lookup(r.task.Type)
	if typ != nil && typ.Is(messages.FlagAckSyncUp) && !explicit {
		return
	}
	b.mu.Lock()
	first := !r.task.Acked[name]
	r.task.Acked[name] = true
	b.mu.Unlock()
	if first && name == r.task.CChannel {
		b.enqueue(r)
	}
	select {
	case r.acked <- struct{}{}:
	default:
	}
	b.poke() // the queue's head may be complete now
}

// poke wakes the callback loop.
func (b *Broadcaster) poke() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// awaitAcks waits until every target is acknowledged (persisting the
// acknowledgements), or the broadcaster stops.
func (b *Broadcaster) awaitAcks(r *run) bool {
	for {
		b.mu.Lock()
		all := r.task.allAcked()
		b.mu.Unlock()
		if all {
			return b.save(r) == nil
		}
		select {
		case <-r.acked:
		case <-b.ctx.Done():
			return false
		}
	}
}

// Ack acknowledges target of broadcast id for an AckSyncUp type, from the
// consuming side. Acknowledging a finished broadcast again is a no-op.
func (b *Broadcaster) Ack(ctx context.Context, id uint64, target string) error {
	b.mu.Lock()
	r := b.runs[id]
	b.mu.Unlock()
	if r == nil {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "no broadcast %d", id)
	}
	if !slices.Contains(r.task.targets(), target) {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s is not a target of broadcast %d", target, id)
	}
	select {
	case <-r.done:
		return nil
	default:
	}
	b.noteAck(r, target, true)
	return b.save(r)
}

// enqueue puts a task in the callback queue: when its CChannel is
// acknowledged, or when it has none, once everything is.
func (b *Broadcaster) enqueue(r *run) {
	if b.cfg.Callbacks[r.task.Type] == nil {
		return // nothing to order
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.queued {
		return
	}
	if r.task.CChannel != "" && !r.task.Acked[r.task.CChannel] {
		return
	}
	r.queued = true
	b.queue = append(b.queue, r)
	b.poke()
}

// callbacks runs the callbacks in queue order (CChannel acknowledgement
// order), each once its task is fully acknowledged, retrying each until it
// succeeds.
func (b *Broadcaster) callbacks() {
	defer b.wg.Done()
	for {
		r := b.next()
		if r == nil {
			select {
			case <-b.wake:
				continue
			case <-b.ctx.Done():
				return
			}
		}
		if !b.runCallback(r) {
			return
		}
		close(r.called)
		b.mu.Lock()
		if i := slices.Index(b.queue, r); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
		}
		b.mu.Unlock()
	}
}

// next returns the head of the queue once it is fully acknowledged:
// callbacks run strictly in CChannel acknowledgement order. Only types
// with a callback are queued, so broadcasts without one never wait here.
func (b *Broadcaster) next() *run {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 || !b.queue[0].task.allAcked() {
		return nil
	}
	return b.queue[0]
}

// runCallback runs a task's callback until it succeeds (false: stopped).
func (b *Broadcaster) runCallback(r *run) bool {
	cb := b.cfg.Callbacks[r.task.Type]
	if cb == nil {
		return true
	}
	ctx := b.cfg.Hooks.OnBroadcastCallbackStart(b.ctx, telemetry.BroadcastCallbackEvent{ID: r.task.ID, Type: r.task.Type,
		TraceParent: r.task.TraceParent, TraceState: r.task.TraceState})
	var end telemetry.BroadcastCallbackEndEvent
	end.Err = b.retry(5*time.Second, func() error {
		err := cb(ctx, b.snapshot(r))
		if err != nil {
			if len(end.Failures) < telemetry.MaxCallbackFailures {
				end.Failures = append(end.Failures, err)
			}
			b.log.Warn().Err(err).Uint64("broadcast", r.task.ID).Str("type", r.task.Type).Msg("callback failed; retrying")
		}
		return err
	})
	b.cfg.Hooks.OnBroadcastCallbackEnd(ctx, end)
	return end.Err == nil
}

// finish persists the tombstone, then releases the keys.
func (b *Broadcaster) finish(r *run) error {
	b.mu.Lock()
	r.task.State = Tombstone
	r.task.Finished = time.Now().UTC()
	b.mu.Unlock()
	if err := b.save(r); err != nil {
		return err
	}
	b.release(r.task.ID)
	close(r.done)
	return nil
}

// fail marks a task stuck (it keeps its keys) or, if the broadcaster
// stopped, leaves it to the next coordinator.
func (b *Broadcaster) fail(r *run, err error) {
	if b.ctx.Err() != nil {
		return
	}
	b.stuck.Add(1)
	b.log.Error().Err(err).Uint64("broadcast", r.task.ID).Msg("broadcast stuck; it keeps its resource keys")
	b.mu.Lock()
	r.task.State, r.task.Error, r.task.ErrorCode = Stuck, err.Error(), streamwal.CodeUnrecoverable
	r.err = streamwal.Errorf(streamwal.CodeUnrecoverable, "broadcast %d: %w", r.task.ID, err)
	if i := slices.Index(b.queue, r); i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
	}
	b.mu.Unlock()
	b.poke() // a task behind it may be complete
	_ = b.save(r)
	close(r.done)
}

// save persists a task with every change made before the call, retrying
// a failing store with backoff until it succeeds or the broadcaster stops
// (then the next coordinator resumes the task from what was saved
// before). Saves of one task are serialized and coalesce: a save that
// waited while another stored a snapshot taken after it was asked for
// has nothing left to do. So the replicas of a broadcast that land
// together cost one or two writes, not one each.
func (b *Broadcaster) save(r *run) error {
	b.mu.Lock()
	r.asked++
	want := r.asked
	b.mu.Unlock()
	r.saveMu.Lock()
	defer r.saveMu.Unlock()
	if r.saved >= want {
		return nil
	}
	return b.retry(5*time.Second, func() error {
		b.mu.Lock()
		covers := r.asked // the snapshot below holds every change made before
		b.mu.Unlock()
		t := b.snapshot(r)
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		defer cancel()
		err := b.cfg.Store.Save(ctx, t)
		if err != nil {
			b.log.Warn().Err(err).Uint64("broadcast", t.ID).Msg("save task; retrying")
			return err
		}
		r.saved = covers
		return nil
	})
}

// snapshot copies a task under the lock.
func (b *Broadcaster) snapshot(r *run) *Task {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := *r.task
	t.Appended = cloneMap(r.task.Appended)
	t.Acked = cloneMap(r.task.Acked)
	return &t
}

// cloneMap copies a map.
func cloneMap[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// collect deletes tombstones past the retention window.
func (b *Broadcaster) collect() {
	defer b.wg.Done()
	t := time.NewTicker(b.cfg.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
			b.collectOnce()
		}
	}
}

// collectOnce deletes the oldest tombstones beyond MaxTombstones and those
// older than TombstoneAge.
func (b *Broadcaster) collectOnce() {
	b.mu.Lock()
	var tombs []*run
	for _, r := range b.runs {
		if r.task.State == Tombstone {
			tombs = append(tombs, r)
		}
	}
	b.mu.Unlock()
	slices.SortFunc(tombs, func(x, y *run) int { return x.task.Finished.Compare(y.task.Finished) })
	cutoff := time.Now().Add(-b.cfg.TombstoneAge)
	for i, r := range tombs {
		if len(tombs)-i <= b.cfg.MaxTombstones && r.task.Finished.After(cutoff) {
			break
		}
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		err := b.cfg.Store.Delete(ctx, r.task.ID)
		cancel()
		if err != nil {
			b.log.Warn().Err(err).Uint64("broadcast", r.task.ID).Msg("collect tombstone")
			return
		}
		b.mu.Lock()
		delete(b.runs, r.task.ID)
		if r.task.IdemKey != "" && b.idem[r.task.IdemKey] == r {
			delete(b.idem, r.task.IdemKey)
		}
		b.mu.Unlock()
	}
}
