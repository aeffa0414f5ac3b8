package node

import (
	"errors"
	"slices"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/shard"
	"github.com/streamwal/streamwal/services/node/wal"
	"github.com/streamwal/streamwal/telemetry"
)

// noteOpen reports an open of p under term: w when it serves, err when
// it failed after start.
func (n *Node) noteOpen(p streamwal.PChannel, term uint64, w *wal.WAL, start time.Time, err error) {
	e := telemetry.OpenEvent{PChannel: p, Term: term, Node: string(n.cfg.ID), Took: time.Since(start), Err: err}
	if w != nil {
		r := w.Recovered()
		e.Replayed, e.Took = r.Replayed, r.Took
	}
	n.cfg.Hooks.OnOpen(e)
	if errors.Is(err, streamwal.ErrFenced) {
		n.noteFence(p, term)
	}
}

// noteFence reports that a newer owner fenced p's WAL of term, which is
// then no longer assigned here.
func (n *Node) noteFence(p streamwal.PChannel, term uint64) {
	n.ready.unwant(p, term)
	n.cfg.Hooks.OnFence(telemetry.FenceEvent{PChannel: p, Node: string(n.cfg.ID), Term: term})
}

// noteClose reports that the node stopped serving p's WAL of term.
func (n *Node) noteClose(p streamwal.PChannel, term uint64, reason string) {
	n.cfg.Hooks.OnClose(telemetry.CloseEvent{PChannel: p, Term: term, Node: string(n.cfg.ID), Reason: reason})
}

// noteBeat reports a heartbeat, and the recovery storage of every WAL
// served.
func (n *Node) noteBeat(err error) {
	n.ready.beat(err)
	n.mu.Lock()
	wals := make([]*wal.WAL, 0, len(n.channels))
	for _, ch := range n.channels {
		wals = append(wals, ch.wal)
	}
	n.mu.Unlock()
	n.cfg.Hooks.OnHeartbeat(telemetry.HeartbeatEvent{Node: string(n.cfg.ID), Serving: len(wals), Err: err})
	if len(n.cfg.Hooks) == 0 {
		return
	}
	now := time.Now()
	for _, w := range wals {
		if st, ok := w.StorageState(); ok {
			n.cfg.Hooks.OnStorage(storageEvent(w.PChannel(), st, now))
		}
	}
}

// storageEvent describes a WAL's recovery storage as of now.
func storageEvent(p streamwal.PChannel, st wal.StorageState, now time.Time) telemetry.StorageEvent {
	e := telemetry.StorageEvent{PChannel: p, Truncated: uint64(st.Persisted.Truncated)}
	if tt := st.Persisted.TimeTick; tt != 0 {
		e.CheckpointAge = max(now.Sub(tt.Physical()), 0)
	}
	if tt := st.Consumed.TimeTick; tt != 0 {
		e.WatermarkLag = max(now.Sub(tt.Physical()), 0)
	}
	for _, s := range st.Segments {
		switch s.State {
		case shard.Growing:
			e.Growing++
		case shard.Sealed:
			e.Sealed++
		case shard.Flushed:
			e.Flushed++
		}
	}
	return e
}

// failedMessage is a message of an append request that was not appended.
type failedMessage struct {
	index int
	err   error
}

// appendOutcome reports an append request of total messages, of which
// msgs were decoded (index gives their places in the request) and fails
// were not appended, as runs of equal results; it logs a request that
// failed (warn) or was refused (debug), once.
func (n *Node) appendOutcome(p streamwal.PChannel, total int, msgs []*messages.MutableMessage, index []int, fails []failedMessage, start time.Time) {
	if len(n.cfg.Hooks) == 0 && len(fails) == 0 {
		return
	}
	took := time.Since(start)
	types := make([]string, total)
	codes := make([]streamwal.Code, total)
	for j, i := range index {
		types[i] = msgs[j].Type().String()
	}
	for _, f := range fails {
		codes[f.index] = streamwal.CodeOf(f.err)
	}
	for i := 0; i < total; {
		j := i + 1
		for j < total && codes[j] == codes[i] && types[j] == types[i] {
			j++
		}
		n.cfg.Hooks.OnAppend(telemetry.AppendEvent{PChannel: p, Type: types[i], Code: codes[i], Messages: j - i, Latency: took})
		i = j
	}
	if len(fails) > 0 {
		f := slices.MinFunc(fails, func(a, b failedMessage) int { return a.index - b.index })
		code := streamwal.CodeOf(f.err)
		ev, what := n.log.Debug(), "append refused"
		if telemetry.IsFailure(code) {
			ev, what = n.log.Warn(), "append failed"
		}
		ev.Err(f.err).Str("pchannel", p.String()).Str("code", string(code)).Int("message", f.index).
			Int("failed", len(fails)).Int("messages", total).Dur("took", took).Msg(what)
	}
}
