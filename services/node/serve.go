package node

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/timetick"
	"github.com/streamwal/streamwal/services/node/wal"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// jsonEncode encodes a KV record.
func jsonEncode(v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeInternal, "encode: %v", err)
	}
	return data, nil
}

// opLock serializes opens and closes of one PChannel.
func (n *Node) opLock(p streamwal.PChannel) *sync.Mutex {
	n.mu.Lock()
	defer n.mu.Unlock()
	l, ok := n.opLocks[p]
	if !ok {
		l = &sync.Mutex{}
		n.opLocks[p] = l
	}
	return l
}

// handleOpen opens a PChannel's WAL under the requested term and starts
// serving its append subject. Opening the term already open is a no-op.
// The reply confirms the PChannel as served in this session.
func (n *Node) handleOpen(ctx context.Context, req wire.OpenRequest) (wire.OpenReply, error) {
	p, err := named(req.PChannel)
	if err != nil {
		return wire.OpenReply{}, err
	}
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	n.ready.want(p, req.Term)
	start := time.Now()
	reply, err := n.open(ctx, p, req.Term)
	if err != nil {
		n.noteOpen(p, req.Term, nil, start, err)
		ev, what := n.log.Debug(), "open refused"
		if telemetry.IsFailure(streamwal.CodeOf(err)) {
			ev, what = n.log.Warn(), "open failed"
		}
		ev.Err(err).Str("pchannel", p.String()).Uint64("term", req.Term).Msg(what)
	}
	return reply, err
}

// named refuses the zero PChannel: a request that names none (the other
// bad names are refused as the request is decoded).
func named(p streamwal.PChannel) (streamwal.PChannel, error) {
	if p.IsZero() {
		return p, streamwal.Errorf(streamwal.CodeInvalidArgument, "request names no pchannel")
	}
	return p, nil
}

// open opens p under term, one open or close of p at a time.
func (n *Node) open(ctx context.Context, p streamwal.PChannel, term uint64) (wire.OpenReply, error) {
	l := n.opLock(p)
	l.Lock()
	defer l.Unlock()
	if err := ctx.Err(); err != nil {
		return wire.OpenReply{}, streamwal.Errorf(streamwal.CodeUnavailable, "open %s under term %d: gave up waiting for an earlier open: %v", p, term, err)
	}
	if cur, ok := n.WAL(p); ok {
		if cur.Term() == term && cur.Err() == nil {
			return n.confirm(cur), nil
		}
		if cur.Term() > term {
			return wire.OpenReply{}, streamwal.Errorf(streamwal.CodeTermMismatch, "%s is open under term %d, not %d", p, cur.Term(), term)
		}
		if n.drop(p, cur, "superseded by term "+strconv.FormatUint(term, 10)) {
			n.noteClose(p, cur.Term(), telemetry.ReasonSuperseded)
		}
	}
	w, err := wal.Open(ctx, wal.Config{Backend: n.be, Codec: n.cfg.Codec, PChannel: p, Term: term, Node: string(n.cfg.ID),
		Oracle: n.oracle.For(p, term), SyncInterval: n.cfg.SyncInterval, Ticks: n.cfg.Conn, Logger: n.log, Storage: n.storage(p)})
	if err != nil {
		return wire.OpenReply{}, err
	}
	if err := n.serve(p, w); err != nil {
		_ = w.Close()
		return wire.OpenReply{}, err
	}
	r := w.Recovered()
	n.log.Info().Str("pchannel", p.String()).Uint64("term", term).Uint64("from", uint64(r.From)).Uint64("checkpoint", uint64(r.Checkpoint)).
		Int("replayed", r.Replayed).Int("skipped", r.Skipped).Int("open_txns", r.Txns).
		Uint64("barrier", uint64(r.Barrier)).Dur("took", r.Took).Msg("serving")
	n.noteOpen(p, term, w, time.Time{}, nil)
	return n.confirm(w), nil
}

// confirm is the reply to an open of w: its barrier, and the session and
// served-set version that list it.
func (n *Node) confirm(w *wal.WAL) wire.OpenReply {
	n.mu.Lock()
	defer n.mu.Unlock()
	return wire.OpenReply{Barrier: w.Barrier().ID(), Session: n.session, Version: n.version}
}

// serve starts answering p's append subject with w, and watches w so that
// a fenced WAL is dropped at once.
func (n *Node) serve(p streamwal.PChannel, w *wal.WAL) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closing {
		return streamwal.Errorf(streamwal.CodeShuttingDown, "open %s: %w", p, errShuttingDown)
	}
	sub, err := n.cfg.Conn.Subscribe(n.cfg.Codec.Cluster().AppendSubject(p), n.appendHandler(w))
	if err != nil {
		return streamwal.Errorf(streamwal.CodeUnavailable, "subscribe appends of %s: %v", p, err)
	}
	n.channels[p] = &channel{wal: w, sub: sub, since: time.Now().UTC()}
	n.changedLocked()
	n.local.publish(w)
	n.loops.Add(2)
	go n.watch(p, w)
	go n.replicate(w)
	return nil
}

// watch drops p as soon as its WAL w stops by itself (fenced by a newer
// owner, or failed).
func (n *Node) watch(p streamwal.PChannel, w *wal.WAL) {
	defer n.loops.Done()
	select {
	case <-w.Done():
	case <-n.stop:
		return
	}
	if errors.Is(w.Err(), streamwal.ErrClosed) {
		return
	}
	why, reason := "failed", telemetry.ReasonFailed
	if errors.Is(w.Err(), streamwal.ErrFenced) {
		why, reason = "fenced by a newer owner", telemetry.ReasonFenced
		n.noteFence(p, w.Term())
	}
	if n.drop(p, w, why) {
		n.noteClose(p, w.Term(), reason)
		n.log.Warn().Err(w.Err()).Str("pchannel", p.String()).Uint64("term", w.Term()).Msg("stopped serving: " + why)
	}
}

// drop stops serving p if w is still its WAL, and closes w; it reports
// whether p was being served with w.
func (n *Node) drop(p streamwal.PChannel, w *wal.WAL, why string) bool {
	n.local.withdraw(w)
	n.mu.Lock()
	ch, ok := n.channels[p]
	ok = ok && ch.wal == w
	if ok {
		delete(n.channels, p)
		n.changedLocked()
	}
	n.mu.Unlock()
	if ok {
		_ = ch.sub.Unsubscribe()
		n.log.Debug().Str("pchannel", p.String()).Uint64("term", w.Term()).Str("why", why).Msg("dropping")
	}
	_ = w.Close()
	return ok
}

// handleClose closes a PChannel's WAL (of the given term, or any).
func (n *Node) handleClose(_ context.Context, req wire.CloseRequest) (wire.None, error) {
	p, err := named(req.PChannel)
	if err != nil {
		return wire.None{}, err
	}
	l := n.opLock(p)
	l.Lock()
	defer l.Unlock()
	n.ready.unwant(p, req.Term)
	if cur, ok := n.WAL(p); ok && (req.Term == 0 || cur.Term() <= req.Term) {
		if n.drop(p, cur, "closed by the coordinator") {
			n.noteClose(p, cur.Term(), telemetry.ReasonClosed)
			n.log.Info().Str("pchannel", p.String()).Uint64("term", cur.Term()).Msg("closed")
		}
	}
	return wire.None{}, nil
}

// handleStatus describes the open WALs.
func (n *Node) handleStatus(context.Context, []byte) (any, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	reply := wire.NodeStatusReply{Node: string(n.cfg.ID), Session: n.session}
	for p, ch := range n.channels {
		reply.Channels = append(reply.Channels, wire.ChannelStatus{PChannel: p.String(), Term: ch.wal.Term()})
	}
	return reply, nil
}

// appendHandler serves append requests for w, each in its own goroutine
// (bounded), so that requests pipeline into the WAL, once admitted (see
// AdmissionOptions): a request that finds no room within the admission
// wait is refused whole with streamwal.ErrResourceExhausted. The typed handler
// costs no allocation more per request than decoding by hand
// (wire.TestHandleAllocatesNoMore), and the request keeps sharing m.Data.
func (n *Node) appendHandler(w *wal.WAL) nats.MsgHandler {
	h := wire.Handle(func(_ context.Context, req wire.AppendRequest) (wire.AppendReply, error) {
		return n.appendRequest(w, req)
	})
	p := w.PChannel()
	return func(m *nats.Msg) {
		n.inflight.Add(1)
		weight := int64(len(m.Data))
		if err := n.admitAppend(n.stopped, p, weight); err != nil {
			n.inflight.Done()
			_ = wire.Respond(m, nil, err)
			return
		}
		select {
		case n.requests <- struct{}{}:
		case <-n.stop:
			n.admission.Release(p, weight)
			n.inflight.Done()
			_ = wire.Respond(m, nil, streamwal.Errorf(streamwal.CodeShuttingDown, "%s: %v", n.cfg.ID, errShuttingDown))
			return
		}
		go func() {
			defer n.inflight.Done()
			defer n.admission.Release(p, weight)
			defer func() { <-n.requests }()
			body, err := h(context.Background(), m.Data)
			_ = wire.Respond(m, body, err)
		}()
	}
}

// appendTimeout bounds one append request at the node.
const appendTimeout = 30 * time.Second

// appendRequest appends the messages of one request.
func (n *Node) appendRequest(w *wal.WAL, req wire.AppendRequest) (wire.AppendReply, error) {
	if len(req.Messages) == 0 {
		return wire.AppendReply{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "append request without messages")
	}
	start := time.Now()
	n.cfg.Hooks.OnAppendStart(telemetry.AppendStartEvent{PChannel: w.PChannel(), Messages: len(req.Messages)})
	reply := wire.AppendReply{Results: make([]wire.AppendResult, len(req.Messages))}
	msgs := make([]*messages.MutableMessage, 0, len(req.Messages))
	index := make([]int, 0, len(req.Messages))
	var fails []failedMessage
	for i, wm := range req.Messages {
		m, err := n.cfg.Codec.DecodeMutable(&nats.Msg{Subject: wm.Subject, Header: wm.Header, Data: wm.Data})
		if err != nil {
			reply.Results[i].Error = wire.ErrorOf(err)
			fails = append(fails, failedMessage{index: i, err: err})
			continue
		}
		msgs = append(msgs, m)
		index = append(index, i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	tr := n.traceAppend(msgs, func(i int) map[string][]string { return req.Messages[index[i]].Header })
	out, errs := w.AppendMany(ctx, msgs)
	tr.end(out, errs)
	for j, i := range index {
		reply.Results[i] = wire.ResultOf(out[j], errs[j])
		if errs[j] != nil {
			fails = append(fails, failedMessage{index: i, err: errs[j]})
		}
	}
	n.appendOutcome(w.PChannel(), len(req.Messages), msgs, index, fails, start)
	return reply, nil
}

// remoteOracle is the coordinator's TSO over request-reply, shared by the
// node's WALs, each through its view (For).
type remoteOracle struct {
	nc      *nats.Conn
	subject string
}

// oracleBudget bounds how long an allocation retries through a
// coordinator takeover.
const oracleBudget = 5 * time.Second

// For is the oracle of p's WAL under term: the coordinator refuses it
// (streamwal.CodeFenced) once p is assigned under a later term.
func (o *remoteOracle) For(p streamwal.PChannel, term uint64) timetick.Oracle {
	return &walOracle{o: o, pchannel: p, term: term}
}

// walOracle is the view of a remoteOracle one WAL draws from.
type walOracle struct {
	o        *remoteOracle
	pchannel streamwal.PChannel
	term     uint64
}

// Allocate implements timetick.Oracle.
func (w *walOracle) Allocate(ctx context.Context, n uint32) (messages.TimeTick, error) {
	return w.o.allocate(ctx, wire.TSORequest{Count: n, PChannel: w.pchannel, Term: w.term})
}

// allocate asks for req, retrying while no coordinator answers (a
// takeover) within oracleBudget; a refusal that is not retriable (a
// superseded owner is fenced) is returned at once.
func (o *remoteOracle) allocate(ctx context.Context, req wire.TSORequest) (messages.TimeTick, error) {
	ctx, cancel := context.WithTimeout(ctx, oracleBudget)
	defer cancel()
	delay := 20 * time.Millisecond
	for {
		var reply wire.TSOReply
		callCtx, callCancel := context.WithTimeout(ctx, time.Second)
		err := wire.Call(callCtx, o.nc, o.subject, req, &reply)
		callCancel()
		if err == nil {
			return reply.First, nil
		}
		if !streamwal.IsRetriable(err) || o.nc.IsClosed() {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(delay):
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}
