package wal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/lifecycle"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
)

// loadStorage reads the PChannel's recovery storage before the barrier
// lands: the checkpoint (a newer owner's is streamwal.ErrFenced), the
// check that the stream still holds the history it records, and the
// metadata, from which it builds the ledger. It then claims the
// checkpoint under this term, so that no older owner moves it again.
func loadStorage(ctx context.Context, cfg Config) (*keeper, *ledger, error) {
	s := cfg.Storage
	log := cfg.Logger.With().Str("pchannel", cfg.PChannel.String()).Uint64("term", cfg.Term).Logger()
	pers := recovery.NewPersister(s.Store, cfg.PChannel, cfg.Term, cfg.Node)
	snap, found, err := pers.Load(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("load the checkpoint of %s: %w", cfg.PChannel, err)
	}
	ledgerShard := s.Shard
	ledgerShard.Memory = nil // the ledger's segments are metadata, not growing data
	segs, err := shard.New(ledgerShard)
	if err != nil {
		return nil, nil, err
	}
	life := lifecycle.NewTable()
	st := &keeper{cfg: s, pers: pers, kick: make(chan struct{}, 1), tier: make(chan struct{}, 1), done: make(chan struct{}), lastRound: time.Now(), lastTrunc: time.Now()}
	if !found {
		return st, newLedger(recovery.Checkpoint{}, life, segs, log), nil
	}
	st.persisted = snap.Checkpoint
	cp := snap.Checkpoint
	accepted, err := checkHistory(ctx, cfg, &cp)
	if err != nil {
		return nil, nil, err
	}
	if err := restoreMeta(snap, cp, life, segs); err != nil {
		return nil, nil, fmt.Errorf("recovery metadata of %s: %w", cfg.PChannel, err)
	}
	if accepted {
		snap.Checkpoint = cp
		if err := pers.Persist(ctx, snap); err != nil {
			return nil, nil, fmt.Errorf("persist the checkpoint of %s after the accepted loss: %w", cfg.PChannel, err)
		}
		if err := recovery.ClearAcceptLoss(ctx, s.Store, cfg.PChannel); err != nil {
			return nil, nil, err
		}
	} else if err := pers.Claim(ctx); err != nil {
		return nil, nil, fmt.Errorf("claim the checkpoint of %s: %w", cfg.PChannel, err)
	}
	led := newLedger(cp, life, segs, log)
	led.lifeThrough, led.segsThrough = snap.VChannelsThrough, snap.SegmentsThrough
	if led.repl, err = decodeReplication(cp.Replication); err != nil {
		return nil, nil, fmt.Errorf("recovery checkpoint of %s: %w", cfg.PChannel, err)
	}
	return st, led, nil
}

// restoreMeta restores the lifecycle table and the ledger's segments
// from a snapshot.
func restoreMeta(snap recovery.Snapshot, cp recovery.Checkpoint, life *lifecycle.Table, segs *shard.Manager) error {
	records, err := lifecycleRecords(snap.VChannels)
	if err != nil {
		return err
	}
	if err := life.Restore(records); err != nil {
		return err
	}
	var list []shard.Segment
	if len(snap.Segments) > 0 {
		if err := json.Unmarshal(snap.Segments, &list); err != nil {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "segment metadata: %w", err)
		}
	}
	return segs.Restore(list, cp.Consumed)
}

// checkHistory makes sure the stream holds what the checkpoint says it
// reached: a stream that ends below the highest MessageID handed out, or
// holds another message at the last one consumed, lost acknowledged
// history (its files were cut or replaced). The PChannel is then refused
// with streamwal.ErrHistoryLost, unless an operator accepted the loss:
// then the stream continues above the highest ID ever handed out, so
// that no MessageID is reused, and cp is moved there (accepted is true).
func checkHistory(ctx context.Context, cfg Config, cp *recovery.Checkpoint) (accepted bool, err error) {
	p, tiers := cfg.PChannel, cfg.Storage.Tiers
	state, err := tiers.State(ctx, p)
	if err != nil {
		return false, fmt.Errorf("check the history of %s: %w", p, err)
	}
	reached := max(cp.Reached, cp.Consumed)
	lost, err := lostHistory(ctx, cfg, *cp, state, reached)
	if err != nil || lost == "" {
		return false, err
	}
	log := cfg.Logger.With().Str("pchannel", p.String()).Logger()
	acc, ok, err := recovery.ReadAcceptLoss(ctx, cfg.Storage.Store, p)
	if err != nil {
		return false, err
	}
	if !ok {
		log.Error().Str("loss", lost).Uint64("reached", uint64(reached)).Uint64("stream_last", uint64(state.Last)).
			Msg("HISTORY LOST: the stream holds less than was acknowledged; the pchannel is not served until an operator runs `streamwal pchannel accept-loss`")
		return false, streamwal.Errorf(streamwal.CodeHistoryLost, "%s: %s; it is not served until an operator accepts the loss (streamwal pchannel accept-loss %s), which continues it above %d", p, lost, p, reached)
	}
	next := max(reached, state.Last) + 1
	if err := tiers.Advance(ctx, p, next); err != nil {
		return false, fmt.Errorf("advance %s past its lost history: %w", p, err)
	}
	log.Warn().Str("loss", lost).Uint64("continues_at", uint64(next)).Str("accepted_by", acc.By).Time("accepted_at", acc.At).
		Msg("history loss accepted by an operator: the pchannel continues above every MessageID handed out")
	cp.Consumed, cp.MessageID, cp.Reached, cp.Digest = next-1, next, next-1, ""
	return true, nil
}

// lostHistory says what of the history the checkpoint records the stream
// lost ("" if nothing): a tail shorter than what was handed out, a
// message missing between the truncation point and the tail, or another
// message at the last one consumed.
func lostHistory(ctx context.Context, cfg Config, cp recovery.Checkpoint, state jetstream.StreamState, reached messages.MessageID) (string, error) {
	if state.Last < reached {
		return fmt.Sprintf("the stream ends at %d but MessageIDs up to %d were handed out", state.Last, reached), nil
	}
	// Nothing is ever deleted above the truncation point: a message
	// missing there was lost (a damaged block the server dropped).
	if state.Last >= state.First && state.First > 0 {
		if held := uint64(state.Last-state.First) + 1; state.Messages < held {
			return fmt.Sprintf("the stream is missing %d of its messages %d to %d", held-state.Messages, state.First, state.Last), nil
		}
	}
	if cp.Consumed == 0 || cp.Digest == "" {
		return "", nil
	}
	m, err := cfg.Backend.Get(ctx, cfg.PChannel, cp.Consumed)
	if errors.Is(err, jetstream.ErrNotStored) {
		return fmt.Sprintf("message %d, consumed before, is gone", cp.Consumed), nil
	}
	if err != nil {
		return "", fmt.Errorf("check the history of %s: %w", cfg.PChannel, err)
	}
	if recovery.Digest(m) != cp.Digest {
		return fmt.Sprintf("message %d differs from the one consumed before", cp.Consumed), nil
	}
	return "", nil
}
