package wal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/lifecycle"
	"github.com/streamwal/streamwal/services/node/lock"
	"github.com/streamwal/streamwal/services/node/shard"
	"github.com/streamwal/streamwal/services/node/timetick"
	"github.com/streamwal/streamwal/services/node/txn"
)

// Open opens cfg.PChannel's WAL under cfg.Term: it lands a RecoveryBarrier
// (fencing every earlier owner; streamwal.ErrFenced if a newer one already
// holds the channel), replays the stream through the barrier to rebuild
// transaction and lifecycle state, and starts the sync loop.
func Open(ctx context.Context, cfg Config) (*WAL, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	alloc, err := timetick.NewAllocator(cfg.Oracle, cfg.TimeTickBatch)
	if err != nil {
		return nil, err
	}
	var st *keeper
	var led *ledger
	if cfg.Storage != nil {
		if st, led, err = loadStorage(ctx, cfg); err != nil {
			return nil, err
		}
	}
	barrier, err := newBarrier(ctx, cfg, alloc)
	if err != nil {
		return nil, err
	}
	wr, err := cfg.Backend.OpenWriter(ctx, cfg.PChannel, cfg.Term, jetstream.WithBarrier(barrier), jetstream.WithNode(cfg.Node))
	if err != nil {
		return nil, fmt.Errorf("open wal of %s under term %d: %w", cfg.PChannel, cfg.Term, err)
	}
	w := &WAL{
		cfg: cfg, codec: cfg.Codec, w: wr, chain: newChain(),
		log:         cfg.Logger.With().Str("pchannel", cfg.PChannel.String()).Uint64("term", cfg.Term).Logger(),
		alloc:       alloc,
		locks:       lock.NewTable(),
		granted:     map[uint64]chan struct{}{},
		msgIDs:      map[string]chan struct{}{},
		txns:        txn.NewTable(),
		life:        lifecycle.NewTable(),
		topoChanged: make(chan struct{}),
		stop:        make(chan struct{}),
		broken:      make(chan struct{}),
		loopDone:    make(chan struct{}),
		st:          st,
		led:         led,
		held:        map[messages.TxnID]struct{}{},
	}
	w.alive, w.kill = context.WithCancel(context.Background())
	start := time.Now()
	if err := w.recover(ctx); err != nil {
		w.kill()
		_ = wr.Close()
		return nil, err
	}
	w.recovery.Took = time.Since(start)
	go w.syncLoop()
	if w.st != nil {
		w.startStorage()
	}
	return w, nil
}

// newBarrier builds the RecoveryBarrier, stamped with a fresh TimeTick.
func newBarrier(ctx context.Context, cfg Config, alloc *timetick.Allocator) (*messages.MutableMessage, error) {
	m, err := cfg.Codec.NewPChannelBody(messages.TypeRecoveryBarrier, cfg.PChannel,
		messages.RecoveryBarrierBody{Term: cfg.Term, Node: cfg.Node})
	if err != nil {
		return nil, err
	}
	tt, err := alloc.Next(ctx)
	if errors.Is(err, streamwal.ErrFenced) {
		return nil, oracleFenced(cfg, err)
	}
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "allocate the barrier's timetick: %w", err)
	}
	m.SetTimeTick(tt)
	return m, nil
}

// recover replays the stream through the barrier: from the checkpoint's
// MessageID with recovery storage (from the first message without, or on
// a new PChannel). Every TimeTick handed out afterwards is above every one
// replayed, even if an earlier owner drew its TimeTicks ahead of this
// owner's barrier.
func (w *WAL) recover(ctx context.Context) error {
	barrier := w.w.Barrier()
	start := jetstream.Earliest()
	if w.led != nil && w.led.cp.MessageID > 0 {
		start = jetstream.From(w.led.cp.MessageID)
		w.recovery.From, w.recovery.Checkpoint = w.led.cp.MessageID, w.led.cp.Consumed
	}
	sc, err := w.cfg.Backend.Read(ctx, w.cfg.PChannel, jetstream.ReadOptions{Start: start, HeadersOnly: true, Whole: replayWhole})
	if err != nil {
		return fmt.Errorf("replay %s: %w", w.cfg.PChannel, err)
	}
	defer sc.Close()
	floor := barrier.TimeTick()
	replayed := 0
	for m, err := range sc.All(ctx) {
		if err != nil {
			return fmt.Errorf("replay %s: %w", w.cfg.PChannel, err)
		}
		if m.ID() >= barrier.ID() {
			break
		}
		floor = max(floor, m.TimeTick())
		w.txns.Replay(m)
		w.replay(m)
		replayed++
	}
	if err := w.goLive(barrier); err != nil {
		return err
	}
	w.txns.Expire(barrier.TimeTick())
	w.floor = floor
	w.alloc.Reset()
	w.acks = timetick.NewAckManager(floor)
	w.maxAcked = barrier.ID()
	w.syncer = timetick.NewSyncer(barrier.ID())
	w.recovery.Replayed, w.recovery.Txns, w.recovery.Barrier = replayed, w.txns.Len(), barrier.ID()
	w.log.Debug().Int("replayed", replayed).Int("txns", w.txns.Len()).Uint64("barrier", uint64(barrier.ID())).Msg("wal recovered")
	return nil
}

// replayWhole are the types whose bodies the replay reads (the lifecycle
// table's, the shard manager's and the ledger's): every built-in type
// with a body but TimeTicks, barriers and transaction control, whose
// properties say all the replay needs. Every other message is replayed
// from its headers alone (an insert's size included), so that a replay
// reads a fraction of the log's bytes.
var replayWhole = func() []*messages.Type {
	var out []*messages.Type
	for _, t := range messages.Builtins() {
		switch t {
		case messages.TypeTimeTick, messages.TypeRecoveryBarrier, messages.TypeBeginTxn, messages.TypeCommitTxn, messages.TypeRollbackTxn:
			continue
		}
		if t.Body != nil {
			out = append(out, t)
		}
	}
	return out
}()

// replay applies one replayed message below the barrier: to the ledger
// (which skips what the checkpoint covers) with recovery storage, or to
// the lifecycle table without.
func (w *WAL) replay(m *messages.ImmutableMessage) {
	if w.led == nil {
		if err := w.life.Apply(m); err != nil {
			w.log.Warn().Err(err).Uint64("id", uint64(m.ID())).Msg("replay: lifecycle message not applied")
		}
		if err := w.repl.apply(m); err != nil {
			w.log.Warn().Err(err).Uint64("id", uint64(m.ID())).Msg("replay: replication message not applied")
		}
		return
	}
	if m.ID() > w.led.next {
		w.led.skipTo(m.ID())
	}
	w.led.landed(m)
	// The replay starts at or below the BeginTxn of every transaction
	// still open: it sees each insert of theirs, and so what they hold.
	if tc := m.Txn(); tc != nil && m.Type() == messages.TypeInsert {
		if d, ok := m.DML(); ok && d.SegmentID != 0 {
			if w.replayHolds == nil {
				w.replayHolds = map[messages.TxnID]map[int64]struct{}{}
			}
			if w.replayHolds[tc.ID] == nil {
				w.replayHolds[tc.ID] = map[int64]struct{}{}
			}
			w.replayHolds[tc.ID][d.SegmentID] = struct{}{}
		}
	}
}

// goLive, with recovery storage, consumes the barrier and builds the live
// lifecycle table and shard manager from the ledger's.
func (w *WAL) goLive(barrier *messages.ImmutableMessage) error {
	if w.led == nil {
		return nil
	}
	w.led.skipTo(barrier.ID())
	w.led.landed(barrier)
	w.recovery.Skipped = w.led.skipped
	w.repl = w.led.repl.clone()
	// Segments whose Flush landed but that a crash kept from the object
	// store: store them now.
	w.led.uploads = w.led.uploads[:0]
	for _, s := range w.led.segs.Segments() {
		if s.State == shard.Sealed && s.FlushedAt > 0 {
			w.led.uploads = append(w.led.uploads, s.ID)
		}
	}
	if err := w.life.Restore(w.led.life.Export()); err != nil {
		return err
	}
	segs, err := shard.New(w.cfg.Storage.Shard)
	if err != nil {
		return err
	}
	if err := segs.Restore(w.led.segs.Segments(), barrier.ID()); err != nil {
		return err
	}
	// The transactions still open hold the segments they have rows in,
	// until they end.
	for txn, ids := range w.replayHolds {
		if _, live := w.txns.Get(txn); !live {
			continue
		}
		for id := range ids {
			if err := segs.Hold(txn, id); err == nil {
				w.held[txn] = struct{}{}
			}
		}
	}
	w.replayHolds = nil
	w.segs = segs
	return nil
}
