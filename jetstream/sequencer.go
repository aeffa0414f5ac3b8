package jetstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/telemetry"
)

// batch is one atomic batch the sequencer sent and has not resolved.
type batch struct {
	num      uint64
	reqs     []*AppendFuture
	n        int
	expect   uint64 // the stream's last sequence the batch must follow
	after    string // the message ID the unit must follow
	deadline time.Time
	// quiet: sent without a reply subject; the ack of the unit after it
	// answers for it.
	quiet bool
	// fenced: the unit's first message expects our barrier to be the
	// newest (see fenced); a replicated stream allows one such
	// expectation in flight.
	fenced bool
	failed error // set once the server refused it or it timed out
	dup    bool  // refused because a message ID was already stored
	// permanent is set when the server refused the unit for a reason a
	// retry cannot cure (message too large, stream full, sealed).
	permanent error
	oneReq    [1]*AppendFuture // the storage of reqs while it holds one
}

// lastMsgID is the message ID of the unit's last message.
func (b *batch) lastMsgID() string {
	f := b.reqs[len(b.reqs)-1]
	return f.ids[len(f.ids)-1]
}

// atomic reports whether the unit goes out as an atomic batch; a unit of one
// message is a plain publish, which is atomic by itself and much cheaper.
func (b *batch) atomic() bool { return b.n > 1 }

// ack is the server's answer to a batch commit.
type ack struct {
	num   uint64
	seq   uint64
	count uint64
	err   error
	dup   bool
	// wrongSeq: refused for not following the sequence it expected, which
	// an earlier unit that stored nothing (a duplicate) or failed causes.
	wrongSeq bool
	// permanent: the refusal will not go away on a retry.
	permanent bool
	// duplicate: a plain publish whose message ID was already stored at seq.
	duplicate bool
}

// sequencer is the goroutine-owned state of a writer.
type sequencer struct {
	w       *writer
	nc      *nats.Conn
	inbox   string
	sub     *nats.Subscription
	replies chan *nats.Msg   // commit and publish acks, straight from the connection
	status  chan nats.Status // reconnections of the connection
	// closedConn signals that the connection closed for good.
	closedConn chan nats.Status
	queue      []*AppendFuture // taken, not yet sent, in order
	inflight   []*batch
	// inflightMsgs, inflightBatches and inflightFenced count what
	// inflight holds.
	inflightMsgs, inflightBatches, inflightFenced int
	tail                                          uint64 // the last sequence once every in-flight batch landed
	acked                                         uint64 // every message up to here is resolved
	// ackedID is the message ID at acked; lastID the ID of the last
	// message sent, which the next plain publish expects to follow.
	ackedID, lastID string
	fence           uint64 // our barrier's sequence
	nextNum         uint64
	quietRun        int // units sent unanswered since the last answered one
	closing         bool
	refusals        int // consecutive refusals, for backoff
	closeBy         time.Time
	fatal           error
}

// newSequencer subscribes to commit acks.
func newSequencer(w *writer, barrierSeq uint64) (*sequencer, error) {
	s := &sequencer{
		w: w, nc: w.b.nc, inbox: w.b.nc.NewInbox(),
		replies: make(chan *nats.Msg, w.b.opts.MaxInFlightMsgs+64),
		tail:    barrierSeq,
		acked:   barrierSeq,
		ackedID: w.barrier.MsgID(),
		lastID:  w.barrier.MsgID(),
		fence:   barrierSeq,
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

// run is the sequencer loop.
func (s *sequencer) run() {
	defer close(s.w.done)
	defer func() { _ = s.sub.Unsubscribe() }()
	defer s.nc.RemoveStatusListener(s.status)
	defer s.nc.RemoveStatusListener(s.closedConn)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for s.fatal == nil {
		s.collect()
		s.send()
		// A closed connection will answer nothing more: stop at once.
		if s.closing && (len(s.queue) == 0 && len(s.inflight) == 0 || time.Now().After(s.closeBy) || s.nc.IsClosed()) {
			break
		}
		s.arm(timer)
		select {
		case <-s.w.wake:
		case m := <-s.replies:
			if a, ok := s.parseReply(m); ok {
				s.onAck(a)
			}
		case <-timer.C:
			s.onTimer()
		case <-s.status:
			s.onReconnect()
		case <-s.closedConn:
			s.fatal = streamwal.Errorf(streamwal.CodeUnavailable, "writer of %s: the connection is closed", s.w.p)
		case <-s.w.closeReq:
			if !s.closing {
				s.closing, s.closeBy = true, time.Now().Add(closeBudget)
			}
		}
	}
	s.finish()
}

// collect moves pending requests into the queue, dropping abandoned ones.
func (s *sequencer) collect() {
	for _, f := range s.w.takePending() {
		if f.take() {
			s.queue = append(s.queue, f)
		}
	}
}

// send forms and sends units while the pipeline has room.
func (s *sequencer) send() {
	for len(s.queue) > 0 && s.fatal == nil {
		b := s.nextUnit()
		if b == nil {
			return
		}
		if !s.sendBatch(b) {
			return // recovered: let the loop look at Close and replies first
		}
	}
}

// room reports whether the next unit may go out. With group commit, at
// most MaxInFlight units of any kind are in flight, so that the appends
// arriving meanwhile gather into the next unit, or two when a full batch
// waits (it could gather nothing more). Without it, atomic batches are
// bounded by MaxInFlight and messages by MaxInFlightMsgs. A replicated
// stream is different, see replicatedRoom.
func (s *sequencer) room() bool {
	o := s.w.b.opts
	if len(s.inflight) == 0 {
		return true
	}
	if last := s.inflight[len(s.inflight)-1]; last.reqs[0].parent != nil {
		// The parts of a request re-sent message by message go one at a
		// time: a stored ID does not grow the stream, which would fail every
		// part pipelined behind it.
		return false
	}
	if o.Replicas > 1 {
		return s.replicatedRoom()
	}
	if o.GroupCommit {
		return len(s.inflight) < o.MaxInFlight || len(s.inflight) < 2 && s.queuedAtLeast(o.MaxBatch)
	}
	n := len(s.queue[0].msgs)
	return s.inflightMsgs+n <= o.MaxInFlightMsgs && (n == 1 || s.inflightBatches < o.MaxInFlight)
}

// replicatedRoom is room on a replicated stream, where the server refuses
// a second pending expectation on the barrier subject: a fenced unit goes
// out only when no other is in flight, and gathers (with group commit)
// what waited meanwhile; a plain publish of this writer's chain, which
// needs no fence, goes out at once behind it, so that appends that trickle
// in do not wait a whole unit's round trip.
func (s *sequencer) replicatedRoom() bool {
	_, n := s.unitSize()
	if s.fenced(n, s.lastID) {
		return s.inflightFenced == 0
	}
	return s.inflightMsgs+n <= s.w.b.opts.MaxInFlightMsgs
}

// fenced reports whether a unit of n messages that follows message ID
// after must expect our barrier to be the stream's newest. A plain
// publish of this writer's chain need not: it expects the message ID
// before it, which only this writer stores, so it cannot land after a
// newer owner's barrier. An atomic batch cannot expect a message ID, and
// a caller's message ID may be stored again by a newer owner.
func (s *sequencer) fenced(n int, after string) bool {
	return n > 1 || !strings.HasPrefix(after, s.w.idPrefix)
}

// unitSize is how many queued requests the next unit takes and how many
// messages they hold: with group commit every queued request up to
// MaxBatch messages, otherwise one; a solo request (retried after a
// duplicate refusal) always goes alone.
func (s *sequencer) unitSize() (reqs, n int) {
	o := s.w.b.opts
	for i, f := range s.queue {
		if i > 0 && (!o.GroupCommit || f.solo || n+len(f.msgs) > o.MaxBatch) {
			break
		}
		reqs, n = i+1, n+len(f.msgs)
		if f.solo {
			break
		}
	}
	return reqs, n
}

// queuedAtLeast reports whether the queue holds at least n messages.
func (s *sequencer) queuedAtLeast(n int) bool {
	for _, f := range s.queue {
		if n -= len(f.msgs); n <= 0 {
			return true
		}
	}
	return false
}

// nextUnit takes the next unit (see unitSize) off the queue and reserves
// its place in the pipeline, or returns nil if the pipeline is full.
func (s *sequencer) nextUnit() *batch {
	if !s.room() {
		return nil
	}
	k, n := s.unitSize()
	b := &batch{num: s.nextNum, expect: s.tail, after: s.lastID, n: n}
	b.reqs = append(b.oneReq[:0], s.queue[:k]...)
	s.queue = s.queue[k:]
	s.nextNum++
	b.fenced = s.fenced(b.n, b.after)
	s.tail += uint64(b.n)
	s.lastID = b.lastMsgID()
	s.push(b)
	return b
}

// maxQuietRun bounds the units sent in a row without a reply subject, so
// that acks keep resolving appends while a long run goes out.
const maxQuietRun = 64

// quiet reports whether unit b, just reserved, may go out without a reply
// subject: a first-time plain publish followed at once by another one with
// a message ID of this writer. The follower lands only right after b (it
// expects b's message ID and the sequence after b), and it cannot be a
// duplicate, so its ack answers for b as well; if b was refused, the
// follower fails too, and recovery reads what landed. Re-sent requests
// always get their own answer, which is how a refusal of b is learnt.
func (s *sequencer) quiet(b *batch) bool {
	if s.quietRun >= maxQuietRun || !fresh(b.reqs[0]) || b.atomic() || len(s.queue) == 0 {
		return false
	}
	next := s.queue[0]
	return fresh(next) && len(next.msgs) == 1 && strings.HasPrefix(next.ids[0], s.w.idPrefix) && s.room()
}

// fresh reports whether a request goes out for the first time, whole.
func fresh(f *AppendFuture) bool { return !f.sent && !f.solo && f.parent == nil }

// sendBatch publishes a unit: the conditions on its first message; for an
// atomic batch the batch headers, and the commit and reply subject on its
// last message.
// It reports false if the unit could not go out whole and the sequencer
// recovered or dropped a request.
func (s *sequencer) sendBatch(b *batch) bool {
	id := ""
	if b.atomic() {
		id = nuid.Next()
	}
	b.quiet = s.quiet(b)
	s.quietRun++
	if !b.quiet {
		s.quietRun = 0
	}
	i := 0
	for k, f := range b.reqs {
		resend := f.sent || f.parent != nil
		f.sent = true
		for _, m := range f.msgs {
			if resend {
				clearBatchHeaders(m) // what the previous send set
			}
			s.prepare(m, b, id, i)
			err := s.nc.PublishMsg(m)
			if err != nil && !connectionError(err) {
				// The client refused the message itself (it never left):
				// fail its request, queue the rest again. An unfinished
				// batch is never committed, so nothing of it is stored.
				f.fail(streamwal.Errorf(streamwal.CodeInvalidArgument, "publish refused by the client: %v", err))
				s.queue = append(append(append([]*AppendFuture(nil), b.reqs[:k]...), b.reqs[k+1:]...), s.queue...)
				s.unreserve(b)
				return false
			}
			if err != nil && b.failed == nil {
				b.failed = classify(fmt.Errorf("publish: %w", err))
			}
			i++
		}
	}
	b.deadline = time.Now().Add(s.w.b.opts.AckTimeout)
	s.w.stats.units.Add(1)
	s.w.stats.msgs.Add(uint64(b.n))
	if b.atomic() {
		s.w.stats.batches.Add(1)
	}
	s.w.b.opts.Hooks.OnUnit(telemetry.UnitEvent{PChannel: s.w.p, Messages: b.n, Batch: b.atomic()})
	if b.failed != nil {
		s.recover(b.failed)
		return false
	}
	return true
}

// unreserve gives back the place of unit b, the last reserved, which did
// not go out. If the unit before it went out unanswered, only the tail can
// tell whether it landed.
func (s *sequencer) unreserve(b *batch) {
	s.remove(len(s.inflight)-1, len(s.inflight))
	s.tail -= uint64(b.n)
	s.lastID = b.after
	if n := len(s.inflight); n > 0 && s.inflight[n-1].quiet {
		s.recover(streamwal.Errorf(streamwal.CodeUnavailable, "an unanswered unit lost its follower"))
	}
}

// connectionError reports whether a publish failed because of the
// connection (the message may or may not have left) rather than the message.
func connectionError(err error) bool {
	return errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionDraining) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrStaleConnection)
}

// prepare sets the headers of message i of unit b.
func (s *sequencer) prepare(m *nats.Msg, b *batch, id string, i int) {
	if b.atomic() {
		m.Header.Set(hdrBatchID, id)
		m.Header.Set(hdrBatchSeq, strconv.Itoa(i+1))
	}
	if i == 0 {
		m.Header.Set(njs.ExpectedLastSeqHeader, strconv.FormatUint(b.expect, 10))
		if !b.atomic() {
			m.Header.Set(njs.ExpectedLastMsgIDHeader, b.after) // batches cannot
		}
		if b.fenced {
			m.Header.Set(njs.ExpectedLastSubjSeqHeader, strconv.FormatUint(s.fence, 10))
			m.Header.Set(njs.ExpectedLastSubjSeqSubjHeader, s.w.fenceSubj)
		}
	}
	if i == b.n-1 {
		if b.atomic() {
			m.Header.Set(hdrBatchCommit, "1")
		}
		if !b.quiet {
			m.Reply = s.inbox + "." + strconv.FormatUint(b.num, 10)
		}
	}
}

// parseReply decodes a reply; false for a subject that names no unit.
func (s *sequencer) parseReply(m *nats.Msg) (ack, bool) {
	num, err := strconv.ParseUint(m.Subject[len(s.inbox)+1:], 10, 64)
	if err != nil {
		return ack{}, false
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
func parseAck(num uint64, m *nats.Msg) ack {
	if len(m.Data) == 0 && m.Header.Get("Status") != "" {
		return ack{num: num, err: streamwal.Errorf(streamwal.CodeUnavailable, "batch commit answered status %s %s",
			m.Header.Get("Status"), m.Header.Get("Description"))}
	}
	if a, ok := parseAckFast(num, m.Data); ok {
		return a
	}
	var r batchReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return ack{num: num, err: streamwal.Errorf(streamwal.CodeInternal, "bad batch ack %q: %v", m.Data, err)}
	}
	if r.Error != nil {
		if permanentRefusals[r.Error.ErrCode] {
			return ack{num: num, permanent: true, err: streamwal.Errorf(streamwal.CodeUnrecoverable,
				"refused by the server: %s (err_code %d)", r.Error.Description, r.Error.ErrCode)}
		}
		return ack{num: num, dup: r.Error.ErrCode == errCodeDuplicateInBatch, wrongSeq: r.Error.ErrCode == errCodeWrongLastSequence,
			err: streamwal.Errorf(streamwal.CodeUnavailable, "refused: %s (err_code %d)", r.Error.Description, r.Error.ErrCode)}
	}
	if r.Count == 0 {
		r.Count = 1 // a plain publish
	}
	return ack{num: num, seq: r.Seq, count: r.Count, duplicate: r.Duplicate}
}

// parseAckFast decodes the common successful acks without reflection:
// {"stream":"S","seq":N} for a publish, {...,"batch":"B","count":C} for a
// batch. Anything else (an error, a duplicate, an unexpected shape) falls
// back to encoding/json.
func parseAckFast(num uint64, data []byte) (ack, bool) {
	if bytes.Contains(data, []byte(`"error"`)) || bytes.Contains(data, []byte(`"duplicate"`)) {
		return ack{}, false // rare: let encoding/json read it
	}
	seq, ok := jsonUint(data, `"seq":`)
	if !ok {
		return ack{}, false
	}
	count, ok := jsonUint(data, `"count":`)
	if !ok || count == 0 {
		count = 1 // a plain publish
	}
	return ack{num: num, seq: seq, count: count}, true
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

// find returns the in-flight batch of a number.
func (s *sequencer) find(num uint64) (int, *batch) {
	for i, b := range s.inflight {
		if b.num == num {
			return i, b
		}
	}
	return -1, nil
}

// onAck resolves a unit or starts recovery.
func (s *sequencer) onAck(a ack) {
	if err := s.noteAck(a); err != nil {
		s.recover(err)
	}
}

// duplicate resolves a plain publish whose message ID was already stored:
// the append is idempotent, so its caller gets the original's sequence. The
// stream did not grow, so the units after it will fail their expected
// sequence and be re-sent by recovery.
func (s *sequencer) duplicate(i int, seq uint64) {
	b := s.inflight[i]
	s.refusals = 0
	b.reqs[0].resolveEach([]uint64{seq})
	s.remove(i, i+1)
	s.tail--
	if i == len(s.inflight) {
		// Nothing was sent after it: the next unit follows what came before.
		s.lastID = s.ackedID
		if i > 0 {
			s.lastID = s.inflight[i-1].lastMsgID()
		}
	}
}

// landed resolves the in-flight batches up to index i once batch i's ack
// arrived: batch i followed exactly the sequence its predecessors were to
// end at, under this writer's fence, so they landed too.
//
// It reports false, resolving nothing, if a unit before it was refused: then
// only the tail can tell what happened.
func (s *sequencer) landed(i int) bool {
	for _, b := range s.inflight[:i] {
		if b.failed != nil {
			return false
		}
	}
	s.refusals = 0
	for _, b := range s.inflight[:i+1] {
		s.complete(b, b.expect+1)
		if end := b.expect + uint64(b.n); end > s.acked {
			s.acked, s.ackedID = end, b.lastMsgID()
		}
	}
	s.remove(0, i+1)
	return true
}

// push adds a sent unit to the in-flight list.
func (s *sequencer) push(b *batch) {
	s.inflight = append(s.inflight, b)
	s.inflightMsgs += b.n
	if b.atomic() {
		s.inflightBatches++
	}
	if b.fenced {
		s.inflightFenced++
	}
}

// remove drops the in-flight units [from, to). Removing a prefix reslices,
// so resolving acks in order costs O(1) each.
func (s *sequencer) remove(from, to int) {
	for _, b := range s.inflight[from:to] {
		s.inflightMsgs -= b.n
		if b.atomic() {
			s.inflightBatches--
		}
		if b.fenced {
			s.inflightFenced--
		}
	}
	if from == 0 {
		s.inflight = s.inflight[to:]
		return
	}
	s.inflight = append(s.inflight[:from], s.inflight[to:]...)
}

// clearInflight empties the in-flight list.
func (s *sequencer) clearInflight() {
	s.inflight, s.inflightMsgs, s.inflightBatches, s.inflightFenced = nil, 0, 0, 0
}

// complete resolves a landed batch whose first message is at first.
func (s *sequencer) complete(b *batch, first uint64) {
	for _, f := range b.reqs {
		f.resolve(first)
		first += uint64(len(f.msgs))
	}
}

// arm sets the timer to the earliest in-flight deadline: the first unit's,
// since units go out in deadline order.
func (s *sequencer) arm(t *time.Timer) {
	next := time.Hour
	if len(s.inflight) > 0 {
		next = time.Until(s.inflight[0].deadline)
	}
	if s.closing {
		next = min(next, time.Until(s.closeBy))
	}
	t.Reset(max(next, time.Millisecond))
}

// onTimer recovers when a batch's ack is overdue.
func (s *sequencer) onTimer() {
	for _, b := range s.inflight {
		if time.Now().After(b.deadline) {
			s.recover(streamwal.Errorf(streamwal.CodeUnavailable, "batch ack timed out after %v", s.w.b.opts.AckTimeout))
			return
		}
	}
}

// onReconnect resolves the tail at once after a reconnection: the answers
// to what was in flight may have been lost with the old connection, and
// waiting for every deadline would stall appends for AckTimeout.
func (s *sequencer) onReconnect() {
	if len(s.inflight) == 0 {
		return
	}
	err := streamwal.Errorf(streamwal.CodeUnavailable, "connection re-established with units in flight")
	for _, b := range s.inflight {
		if b.failed == nil {
			b.failed = err
		}
	}
	s.recover(err)
}

// recover settles every in-flight batch against the stream: it waits for
// the answers still due, reads the tail, resolves what landed, and queues
// the rest again in order. It retries until it succeeds, the writer is
// fenced or broken, or a closing writer runs out of time.
func (s *sequencer) recover(cause error) {
	s.w.log.Debug().Err(cause).Int("inflight", len(s.inflight)).Msg("resolving the tail")
	s.w.stats.recoveries.Add(1)
	s.w.b.opts.Hooks.OnWriterRecovery(telemetry.WriterRecoveryEvent{PChannel: s.w.p, Term: s.w.term})
	s.drain()
	delay := 10 * time.Millisecond
	for s.fatal == nil && len(s.inflight) > 0 {
		err := s.reconcile()
		if err == nil {
			s.backoff()
			return
		}
		var se *streamwal.Error
		if errors.As(err, &se) && (se.Code == streamwal.CodeFenced || se.Code == streamwal.CodeUnrecoverable) {
			s.fatal = err
			return
		}
		if s.nc.IsClosed() {
			s.fatal = streamwal.Errorf(streamwal.CodeUnavailable, "connection closed while resolving the tail: %w", err)
			return
		}
		s.w.log.Warn().Err(err).Msg("cannot read the tail yet; retrying")
		if s.closing && time.Now().After(s.closeBy) {
			return
		}
		s.pause(delay)
		delay = min(2*delay, time.Second)
	}
}

// backoff pauses before re-sending after consecutive refusals by the server
// (for example too many batches in flight), so a refusal that persists does
// not become a busy loop.
func (s *sequencer) backoff() {
	if s.refusals == 0 {
		return
	}
	delay := min(time.Millisecond<<min(s.refusals, 10), time.Second)
	s.pause(delay)
}

// pause waits for d; a Close arriving meanwhile cuts it short and starts the
// close budget (once closing, it just waits).
func (s *sequencer) pause(d time.Duration) {
	closeReq := s.w.closeReq
	if s.closing {
		closeReq = nil
	}
	select {
	case <-time.After(d):
	case <-closeReq:
		s.closing, s.closeBy = true, time.Now().Add(closeBudget)
	}
}

// drain waits until every in-flight batch was answered or is overdue
// (quiet units get no answer of their own).
func (s *sequencer) drain() {
	for {
		var wait time.Duration = -1
		for _, b := range s.inflight {
			if b.failed == nil && !b.quiet {
				wait = max(wait, time.Until(b.deadline))
			}
		}
		if wait < 0 || s.nc.IsClosed() {
			return // nothing due, or nothing will come on a closed connection
		}
		select {
		case m := <-s.replies:
			if a, ok := s.parseReply(m); ok {
				_ = s.noteAck(a) // drain runs inside recovery
			}
		case <-s.closedConn:
			return
		case <-time.After(wait):
			for _, b := range s.inflight {
				if b.failed == nil {
					b.failed = streamwal.Errorf(streamwal.CodeUnavailable, "batch ack timed out")
				}
			}
		}
	}
}

// noteAck records an answer: a success resolves its unit (and the units
// before it); anything else marks the unit failed and is returned, for the
// caller to recover from (drain, which is recovering already, does not).
func (s *sequencer) noteAck(a ack) error {
	i, b := s.find(a.num)
	if b == nil {
		return nil // a unit already resolved by recovery
	}
	if a.duplicate && a.err == nil {
		s.duplicate(i, a.seq)
		return nil
	}
	if a.err == nil && (a.count != uint64(b.n) || a.seq != b.expect+uint64(b.n)) {
		a.err = streamwal.Errorf(streamwal.CodeInternal, "batch ack %d/%d does not match %d after %d", a.seq, a.count, b.n, b.expect)
	}
	if a.err != nil {
		s.noteRefusal(b, a)
		return a.err
	}
	if !s.landed(i) {
		b.failed = streamwal.Errorf(streamwal.CodeInternal, "unit landed after a refused unit")
		return b.failed
	}
	return nil
}

// noteRefusal records why the server refused a unit.
func (s *sequencer) noteRefusal(b *batch, a ack) {
	b.failed, b.dup = a.err, a.dup
	if a.permanent {
		b.permanent = a.err
	}
	if !a.dup && !a.wrongSeq {
		// Duplicate refusals are cured by re-sending differently, and a
		// unit refused for its expected sequence by re-sending after
		// recovery read the tail (a newer owner's barrier there stops the
		// writer as fenced), not by waiting: only the other refusals back
		// off.
		s.refusals++
	}
}

// finish fails whatever is left and records why the writer stopped.
func (s *sequencer) finish() {
	reason := s.fatal
	if reason == nil {
		reason = streamwal.Errorf(streamwal.CodeClosed, "writer of %s (term %d) is closed", s.w.p, s.w.term)
	}
	for _, b := range s.inflight {
		for _, f := range b.reqs {
			f.fail(streamwal.Errorf(streamwal.CodeUnknownOutcome, "writer stopped before the append was confirmed: %v", reason))
		}
	}
	for _, f := range append(s.queue, s.w.stop(reason)...) {
		f.state.CompareAndSwap(stateQueued, stateTaken)
		if f.sent && streamwal.CodeOf(reason) != streamwal.CodeFenced {
			// It went out once and was queued again: it may still land.
			f.fail(streamwal.Errorf(streamwal.CodeUnknownOutcome, "writer stopped before the append was confirmed: %v", reason))
			continue
		}
		f.fail(reason)
	}
	s.clearInflight()
	s.queue = nil
	s.w.final.Store(&reason)
	if s.fatal != nil {
		s.w.log.Warn().Err(s.fatal).Msg("writer stopped")
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
