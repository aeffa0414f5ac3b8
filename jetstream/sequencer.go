package jetstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream/pipeline"
	"github.com/streamwal/streamwal/telemetry"
)

// sequencer is the I/O shell of a writer's pipeline (package pipeline): it
// feeds it the appends, the server's answers, the connection's events and
// the time, publishes the units it forms, reads the tail when a recovery
// asks, and completes the futures it resolves. One goroutine runs it.
type sequencer struct {
	w       *writer
	p       *pipeline.Pipeline[*AppendFuture]
	nc      *nats.Conn
	inbox   string
	sub     *nats.Subscription
	replies chan *nats.Msg   // commit and publish acks, straight from the connection
	status  chan nats.Status // reconnections of the connection
	// closedConn signals that the connection closed for good.
	closedConn chan nats.Status
	closing    bool
}

// newSequencer subscribes to commit acks.
func newSequencer(w *writer, barrierSeq uint64) (*sequencer, error) {
	o := w.b.opts
	s := &sequencer{
		w: w, nc: w.b.nc, inbox: w.b.nc.NewInbox(),
		replies: make(chan *nats.Msg, o.MaxInFlightMsgs+64),
		p: pipeline.New[*AppendFuture](pipeline.Config{
			PChannel: w.p.String(), Term: w.term, IDPrefix: w.idPrefix,
			Barrier: barrierSeq, BarrierID: w.barrier.MsgID(),
			Replicas: o.Replicas, GroupCommit: o.GroupCommit, PlainUpTo: max(o.PlainUpTo, 0), MaxBatch: o.MaxBatch,
			MaxInFlight: o.MaxInFlight, MaxInFlightMsgs: o.MaxInFlightMsgs,
			AckTimeout: o.AckTimeout, CloseBudget: closeBudget,
		}),
	}
	// A channel subscription hands replies to the sequencer without a
	// dispatcher goroutine in between. The channel holds more than the
	// pipeline can have in flight, so it never drops a reply.
	sub, err := s.nc.ChanSubscribe(s.inbox+".*", s.replies)
	if err != nil {
		return nil, classify(fmt.Errorf("subscribe to batch acks: %w", err))
	}
	s.sub = sub
	s.status = s.nc.StatusChanged(nats.CONNECTED)
	s.closedConn = s.nc.StatusChanged(nats.CLOSED)
	return s, nil
}

// run is the sequencer loop: it steps the pipeline with each event and
// carries out what the pipeline decided.
func (s *sequencer) run() {
	defer close(s.w.done)
	defer func() { _ = s.sub.Unsubscribe() }()
	defer s.nc.RemoveStatusListener(s.status)
	defer s.nc.RemoveStatusListener(s.closedConn)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	closeReq := s.w.closeReq
	for {
		s.collect()
		s.send()
		s.deliver()
		if s.p.NeedScan() {
			s.scan()
			continue
		}
		// A closed connection will answer nothing more: stop at once.
		if s.p.Done(time.Now()) || s.closing && s.nc.IsClosed() {
			break
		}
		s.arm(timer)
		select {
		case <-s.w.wake:
		case m := <-s.replies:
			if a, ok := s.parseReply(m); ok {
				s.p.Ack(time.Now(), a)
			}
		case <-timer.C:
			s.p.Tick(time.Now())
		case <-s.status:
			s.p.Reconnected(time.Now())
		case <-s.closedConn:
			s.p.Halt(streamwal.Errorf(streamwal.CodeUnavailable, "writer of %s: the connection is closed", s.w.p))
		case <-closeReq:
			s.closing, closeReq = true, nil
			s.p.Close(time.Now())
		}
	}
	s.finish()
}

// collect hands pending requests to the pipeline, dropping abandoned ones.
func (s *sequencer) collect() {
	for _, f := range s.w.takePending() {
		if f.take() {
			s.p.Enqueue(&f.req)
		}
	}
}

// send publishes units while the pipeline forms them.
func (s *sequencer) send() {
	for {
		u := s.p.Next(time.Now())
		if u == nil || !s.publish(u) {
			return
		}
	}
}

// deliver completes the futures the pipeline resolved and reports what
// else it decided.
func (s *sequencer) deliver() {
	rd := s.p.Ready()
	for _, r := range rd.Results {
		r.Req.Payload().settle(r)
	}
	for _, cause := range rd.Recoveries {
		s.w.log.Debug().Err(cause).Msg("resolving the tail")
		s.w.stats.recoveries.Add(1)
		s.w.b.opts.Hooks.OnWriterRecovery(telemetry.WriterRecoveryEvent{PChannel: s.w.p, Term: s.w.term})
	}
	for _, m := range rd.Late {
		s.w.log.Error().Uint64("seq", m.Seq).Str("msg_id", m.ID).
			Msg("INVARIANT VIOLATED: a message of this writer landed after a newer owner's barrier")
	}
}

// arm sets the timer to when the pipeline next needs the time.
func (s *sequencer) arm(t *time.Timer) {
	next := time.Hour
	if d := s.p.Deadline(); !d.IsZero() {
		next = time.Until(d)
	}
	t.Reset(max(next, time.Millisecond))
}

// publish sends unit u: the conditions on its first message; for an
// atomic batch the batch headers, and the commit and reply subject on its
// last message. It reports false if the unit could not go out whole (the
// pipeline then recovers or has queued the unit's requests again).
func (s *sequencer) publish(u *pipeline.Unit[*AppendFuture]) bool {
	id := ""
	if u.Atomic() {
		id = nuid.Next()
	}
	var failed error
	i := 0
	for k, r := range u.Reqs {
		from, to := r.Span()
		for _, m := range r.Payload().msgs[from:to] {
			if r.Resend() {
				clearBatchHeaders(m) // what the previous send set
			}
			s.prepare(m, u, id, i)
			err := s.nc.PublishMsg(m)
			if err != nil && !connectionError(err) {
				// The client refused the message itself (it never left).
				s.p.Refused(time.Now(), u, k, streamwal.Errorf(streamwal.CodeInvalidArgument, "publish refused by the client: %v", err))
				return false
			}
			if err != nil && failed == nil {
				failed = classify(fmt.Errorf("publish: %w", err))
			}
			i++
		}
	}
	s.w.stats.units.Add(1)
	s.w.stats.msgs.Add(uint64(u.N))
	if u.Atomic() {
		s.w.stats.batches.Add(1)
	}
	s.w.b.opts.Hooks.OnUnit(telemetry.UnitEvent{PChannel: s.w.p, Messages: u.N, Batch: u.Atomic()})
	if failed != nil {
		s.p.SendFailed(time.Now(), u, failed)
		return false
	}
	return true
}

// connectionError reports whether a publish failed because of the
// connection (the message may or may not have left) rather than the message.
func connectionError(err error) bool {
	return errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionDraining) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrStaleConnection)
}

// prepare sets the headers of message i of unit u.
func (s *sequencer) prepare(m *nats.Msg, u *pipeline.Unit[*AppendFuture], id string, i int) {
	if u.Atomic() {
		m.Header.Set(hdrBatchID, id)
		m.Header.Set(hdrBatchSeq, strconv.Itoa(i+1))
	}
	if i == 0 {
		m.Header.Set(njs.ExpectedLastSeqHeader, strconv.FormatUint(u.Expect, 10))
		if !u.Atomic() {
			m.Header.Set(njs.ExpectedLastMsgIDHeader, u.After) // batches cannot
		}
		if u.Fenced {
			m.Header.Set(njs.ExpectedLastSubjSeqHeader, strconv.FormatUint(u.Fence, 10))
			m.Header.Set(njs.ExpectedLastSubjSeqSubjHeader, s.w.fenceSubj)
		}
	}
	if i == u.N-1 {
		if u.Atomic() {
			m.Header.Set(hdrBatchCommit, "1")
		}
		if !u.Quiet {
			m.Reply = s.inbox + "." + strconv.FormatUint(u.Num, 10)
		}
	}
}

// parseReply decodes a reply; false for a subject that names no unit.
func (s *sequencer) parseReply(m *nats.Msg) (pipeline.Ack, bool) {
	num, err := strconv.ParseUint(m.Subject[len(s.inbox)+1:], 10, 64)
	if err != nil {
		return pipeline.Ack{}, false
	}
	return parseAck(num, m), true
}

// batchReply is the JSON of a batch commit's answer.
type batchReply struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Count     uint64 `json:"count"`
	Duplicate bool   `json:"duplicate,omitempty"`
	Error     *struct {
		Code        int    `json:"code"`
		ErrCode     uint16 `json:"err_code"`
		Description string `json:"description"`
	} `json:"error,omitempty"`
}

// permanentRefusals are the server's refusals that a retry cannot cure:
// message over the stream's maximum size, store failure (stream full),
// insufficient resources, sealed stream.
var permanentRefusals = map[uint16]bool{10054: true, 10077: true, 10023: true, 10109: true}

// errCodeDuplicateInBatch is the server's refusal of a batch holding an
// already-stored message ID.
const errCodeDuplicateInBatch = 10201

// errCodeWrongLastSequence is the server's refusal of a unit whose
// expected last sequence is not the stream's.
const errCodeWrongLastSequence = 10071

// parseAck decodes a commit reply.
func parseAck(num uint64, m *nats.Msg) pipeline.Ack {
	if len(m.Data) == 0 && m.Header.Get("Status") != "" {
		return pipeline.Ack{Num: num, Err: streamwal.Errorf(streamwal.CodeUnavailable, "batch commit answered status %s %s",
			m.Header.Get("Status"), m.Header.Get("Description"))}
	}
	if a, ok := parseAckFast(num, m.Data); ok {
		return a
	}
	var r batchReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return pipeline.Ack{Num: num, Err: streamwal.Errorf(streamwal.CodeInternal, "bad batch ack %q: %v", m.Data, err)}
	}
	if r.Error != nil {
		if permanentRefusals[r.Error.ErrCode] {
			return pipeline.Ack{Num: num, Permanent: true, Err: streamwal.Errorf(streamwal.CodeUnrecoverable,
				"refused by the server: %s (err_code %d)", r.Error.Description, r.Error.ErrCode)}
		}
		return pipeline.Ack{Num: num, RefusedDup: r.Error.ErrCode == errCodeDuplicateInBatch, WrongSeq: r.Error.ErrCode == errCodeWrongLastSequence,
			Err: streamwal.Errorf(streamwal.CodeUnavailable, "refused: %s (err_code %d)", r.Error.Description, r.Error.ErrCode)}
	}
	if r.Count == 0 {
		r.Count = 1 // a plain publish
	}
	return pipeline.Ack{Num: num, Seq: r.Seq, Count: r.Count, Duplicate: r.Duplicate}
}

// parseAckFast decodes the common successful acks without reflection:
// {"stream":"S","seq":N} for a publish, {...,"batch":"B","count":C} for a
// batch. Anything else (an error, a duplicate, an unexpected shape) falls
// back to encoding/json.
func parseAckFast(num uint64, data []byte) (pipeline.Ack, bool) {
	if bytes.Contains(data, []byte(`"error"`)) || bytes.Contains(data, []byte(`"duplicate"`)) {
		return pipeline.Ack{}, false // rare: let encoding/json read it
	}
	seq, ok := jsonUint(data, `"seq":`)
	if !ok {
		return pipeline.Ack{}, false
	}
	count, ok := jsonUint(data, `"count":`)
	if !ok || count == 0 {
		count = 1 // a plain publish
	}
	return pipeline.Ack{Num: num, Seq: seq, Count: count}, true
}

// jsonUint reads the unsigned number after key.
func jsonUint(data []byte, key string) (uint64, bool) {
	i := bytes.Index(data, []byte(key))
	if i < 0 {
		return 0, false
	}
	i += len(key)
	j := i
	for j < len(data) && data[j] >= '0' && data[j] <= '9' {
		j++
	}
	if j == i || j-i > 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(data[i:j]), 10, 64)
	return n, err == nil
}

// finish fails whatever is left and records why the writer stopped.
func (s *sequencer) finish() {
	reason := s.p.Fatal()
	if reason == nil {
		reason = streamwal.Errorf(streamwal.CodeClosed, "writer of %s (term %d) is closed", s.w.p, s.w.term)
	}
	for _, f := range s.w.stop(reason) {
		f.state.CompareAndSwap(stateQueued, stateTaken)
		s.p.Enqueue(&f.req)
	}
	reason = s.p.Stop(reason)
	s.deliver()
	s.w.final.Store(&reason)
	if s.p.Fatal() != nil {
		s.w.log.Warn().Err(reason).Msg("writer stopped")
	}
}

// lastSeq reads the stream's last sequence.
func (s *sequencer) lastSeq(ctx context.Context) (uint64, error) {
	str, err := s.w.b.js.Stream(ctx, s.w.stream)
	if errors.Is(err, njs.ErrStreamNotFound) {
		return 0, streamwal.Errorf(streamwal.CodeUnrecoverable, "stream %s is gone", s.w.stream)
	}
	if err != nil {
		return 0, classify(err)
	}
	return str.CachedInfo().State.LastSeq, nil
}
