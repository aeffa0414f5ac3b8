package node

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/shard"
	"github.com/streamwal/streamwal/services/node/wal"
	"github.com/streamwal/streamwal/telemetry"
)

// readiness is what a node knows of its assignments, from the requests
// it answered: the term the coordinator last asked it to open each
// PChannel under, until it closed it or a newer owner fenced it.
type readiness struct {
	mu       sync.Mutex
	wanted   map[streamwal.PChannel]uint64
	lastBeat time.Time // of the last heartbeat written
	beatErr  error     // of the last heartbeat that failed
}

// want records that the coordinator asked for p under term.
func (r *readiness) want(p streamwal.PChannel, term uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wanted == nil {
		r.wanted = map[streamwal.PChannel]uint64{}
	}
	if term >= r.wanted[p] {
		r.wanted[p] = term
	}
}

// unwant records that p is no longer assigned here at or below term (0:
// any term).
func (r *readiness) unwant(p streamwal.PChannel, term uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.wanted[p]; ok && (term == 0 || t <= term) {
		delete(r.wanted, p)
	}
}

// beat records a heartbeat's outcome.
func (r *readiness) beat(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.beatErr = err
	if err == nil {
		r.lastBeat = time.Now()
	}
}

// ErrNotReady is wrapped by Ready's errors.
var ErrNotReady = errors.New("not ready")

// Ready reports whether the node serves: its last heartbeat was written
// within four heartbeat periods, and it serves every PChannel the
// coordinator asked it to open, under the term asked for, unless the
// coordinator closed it since or a newer owner fenced it. A PChannel
// whose open failed, or whose WAL failed, keeps the node unready until
// the coordinator reopens or moves it. A node told of no PChannel yet
// (a spare, or one just started) is ready once it heartbeats.
func (n *Node) Ready() error {
	n.ready.mu.Lock()
	last, beatErr := n.ready.lastBeat, n.ready.beatErr
	wanted := make(map[streamwal.PChannel]uint64, len(n.ready.wanted))
	for p, t := range n.ready.wanted {
		wanted[p] = t
	}
	n.ready.mu.Unlock()
	if age := time.Since(last); age > 4*n.cfg.Heartbeat {
		return fmt.Errorf("%w: node %s has not written a heartbeat for %s (last error: %v)", ErrNotReady, n.cfg.ID, age.Round(time.Millisecond), beatErr)
	}
	var missing []string
	for p, term := range wanted {
		w, ok := n.WAL(p)
		if !ok || w.Term() != term || w.Err() != nil {
			missing = append(missing, fmt.Sprintf("%s (term %d)", p, term))
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("%w: node %s does not yet serve %s, assigned to it", ErrNotReady, n.cfg.ID, strings.Join(missing, ", "))
	}
	return nil
}

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
