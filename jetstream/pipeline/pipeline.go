package pipeline

import (
	"strconv"
	"strings"
	"time"

	"github.com/streamwal/streamwal"
)

// Config is what a pipeline needs to know of its writer and stream.
type Config struct {
	// PChannel names the channel in errors.
	PChannel string
	// Term is the writer's ownership term; a message in the tail is the
	// writer's only if it carries this term.
	Term uint64
	// IDPrefix starts every message ID the writer gave.
	IDPrefix string
	// Barrier is the sequence of the writer's RecoveryBarrier, which the
	// fence expects to be the barrier subject's newest; BarrierID its
	// message ID, which the first plain publish follows.
	Barrier   uint64
	BarrierID string
	// Replicas is the stream's replica count.
	Replicas int
	// GroupCommit gathers queued appends into one unit.
	GroupCommit bool
	// PlainUpTo, with group commit, sends a short queue (at most this many
	// messages, every append of one) as pipelined plain publishes rather
	// than one atomic batch (see plainTrain); 0 never does.
	PlainUpTo int
	// MaxBatch bounds the messages of a unit.
	MaxBatch int
	// MaxInFlight bounds the units in flight (atomic batches without
	// group commit); MaxInFlightMsgs the messages without group commit.
	MaxInFlight, MaxInFlightMsgs int
	// AckTimeout is how long a unit's answer may take.
	AckTimeout time.Duration
	// CloseBudget bounds how long a closing writer keeps resolving.
	CloseBudget time.Duration
}

// Unit is one publish or atomic batch: the requests it takes, in order.
// The shell reads it; the pipeline alone changes it.
type Unit[T any] struct {
	// Num names the unit in its reply subject.
	Num uint64
	// Reqs are the requests it sends, N how many messages they hold.
	Reqs []*Request[T]
	N    int
	// Expect is the stream's last sequence the unit must follow; After
	// the message ID it must follow (a plain publish only).
	Expect uint64
	After  string
	// Fenced: the first message expects the barrier subject's last
	// sequence to be Fence, the writer's barrier.
	Fenced bool
	Fence  uint64
	// Quiet: sent without a reply subject; the ack of the unit after it
	// answers for it.
	Quiet bool

	deadline time.Time
	failed   error // the server refused it, or its answer is overdue
	dup      bool  // refused because a message ID was already stored
	// permanent: the server refused it for a reason a retry cannot cure
	// (message too large, stream full, sealed).
	permanent error
	oneReq    [1]*Request[T] // the storage of Reqs while it holds one
}

// Atomic reports whether the unit goes out as an atomic batch; a unit of
// one message is a plain publish, which is atomic by itself and cheaper.
func (u *Unit[T]) Atomic() bool { return u.N > 1 }

// lastID is the message ID of the unit's last message.
func (u *Unit[T]) lastID() string {
	r := u.Reqs[len(u.Reqs)-1]
	return r.ids[len(r.ids)-1]
}

// Ack is the server's answer to a unit.
type Ack struct {
	// Num is the unit answered.
	Num uint64
	// Seq is the sequence of the unit's last message, Count how many it
	// stored.
	Seq, Count uint64
	// Err is set when the server refused the unit.
	Err error
	// RefusedDup: refused because one of its message IDs was already
	// stored (an atomic batch).
	RefusedDup bool
	// WrongSeq: refused for not following the sequence it expected, which
	// an earlier unit that stored nothing (a duplicate) or failed causes.
	WrongSeq bool
	// Permanent: the refusal will not go away on a retry.
	Permanent bool
	// Duplicate: a plain publish whose message ID was already stored, at Seq.
	Duplicate bool
}

// Result is the outcome of a request: its messages' sequences (First and
// those after it, or Seqs one each), or Err.
type Result[T any] struct {
	Req   *Request[T]
	First uint64
	Seqs  []uint64
	Err   error
}

// Ready is what the pipeline decided since the last Ready.
type Ready[T any] struct {
	// Results are the requests resolved or failed, in no set order.
	Results []Result[T]
	// Recoveries are the causes of the recoveries that started.
	Recoveries []error
	// Late are messages of this writer found after a newer owner's
	// barrier: that must never happen.
	Late []TailMsg
}

// phase is where the pipeline is between sending and recovering.
type phase int

const (
	// running: units go out as the room allows.
	running phase = iota
	// draining: a recovery waits for the answers still due.
	draining
	// scanning: a recovery needs the tail (NeedScan).
	scanning
	// retrying: a tail read failed; the next one waits for resumeAt.
	retrying
	// pausing: units wait for resumeAt after refusals in a row.
	pausing
)

// Recovery timing: a failed tail read is retried after firstRetry,
// doubling up to maxDelay; refusals in a row pause sending for a
// millisecond doubling per refusal up to maxDelay.
const (
	firstRetry = 10 * time.Millisecond
	maxDelay   = time.Second
)

// maxQuietRun bounds the units sent in a row without a reply subject, so
// that acks keep resolving appends while a long run goes out.
const maxQuietRun = 64

// Pipeline is the state of one writer's appends. It is not safe for
// concurrent use: one goroutine, the shell, owns it.
type Pipeline[T any] struct {
	cfg      Config
	termText string
	queue    []*Request[T] // taken, not yet sent, in order
	inflight []*Unit[T]
	// inflightMsgs, inflightBatches and inflightFenced count what
	// inflight holds.
	inflightMsgs, inflightBatches, inflightFenced int
	tail                                          uint64 // the last sequence once every unit in flight landed
	acked                                         uint64 // every message up to here is resolved
	// ackedID is the message ID at acked; lastID the ID of the last
	// message sent, which the next plain publish follows.
	ackedID, lastID string
	nextNum         uint64
	quietRun        int // units sent unanswered since the last answered one
	// demand is the recent peak of appends queued and in flight when a
	// unit went out, decaying by an eighth a unit: the load plainTrain
	// judges by.
	demand int
	refusals        int // refusals in a row, for the pause
	phase           phase
	resumeAt        time.Time     // the end of a pause or of a retry's wait
	retry           time.Duration // the wait before the next tail read
	closing         bool
	closeBy         time.Time
	fatal           error
	ready           Ready[T]
}

// New returns the pipeline of a writer whose barrier landed as cfg says.
func New[T any](cfg Config) *Pipeline[T] {
	return &Pipeline[T]{
		cfg: cfg, termText: strconv.FormatUint(cfg.Term, 10),
		tail: cfg.Barrier, acked: cfg.Barrier,
		ackedID: cfg.BarrierID, lastID: cfg.BarrierID,
	}
}

// Enqueue queues a request behind the others.
func (p *Pipeline[T]) Enqueue(r *Request[T]) { p.queue = append(p.queue, r) }

// Ready returns what the pipeline decided since the last call. What it
// returns is valid until the next call of any method.
func (p *Pipeline[T]) Ready() Ready[T] {
	rd := p.ready
	p.ready.Results = p.ready.Results[:0]
	p.ready.Recoveries = p.ready.Recoveries[:0]
	p.ready.Late = p.ready.Late[:0]
	return rd
}

// Fatal is why the writer must stop, or nil.
func (p *Pipeline[T]) Fatal() error { return p.fatal }

// Done reports whether the shell may stop: the writer broke, or it is
// closing and nothing is left or its budget ran out.
func (p *Pipeline[T]) Done(now time.Time) bool {
	return p.fatal != nil || p.closing && (len(p.queue) == 0 && len(p.inflight) == 0 || now.After(p.closeBy))
}

// NeedScan reports whether a recovery waits for the shell to read the
// tail (StartScan).
func (p *Pipeline[T]) NeedScan() bool { return p.fatal == nil && p.phase == scanning }

// Deadline is when the pipeline next needs a Tick; zero for never.
func (p *Pipeline[T]) Deadline() time.Time {
	var d time.Time
	switch p.phase {
	case running:
		if len(p.inflight) > 0 {
			d = p.inflight[0].deadline // units go out in deadline order
		}
	case draining:
		for _, u := range p.inflight {
			if p.due(u) && u.deadline.After(d) {
				d = u.deadline // the wait ends when the last answer is overdue
			}
		}
	case retrying, pausing:
		d = p.resumeAt
	}
	if p.closing && (d.IsZero() || p.closeBy.Before(d)) {
		d = p.closeBy
	}
	return d
}

// Next reserves the next unit and returns it for the shell to publish at
// once, or nil when nothing may go out now. The unit's answer is due
// AckTimeout after now.
func (p *Pipeline[T]) Next(now time.Time) *Unit[T] {
	if p.fatal != nil || p.phase != running || len(p.queue) == 0 || !p.room() {
		return nil
	}
	u := p.reserve()
	u.Quiet = p.quiet(u)
	p.quietRun++
	if !u.Quiet {
		p.quietRun = 0
	}
	for _, r := range u.Reqs {
		r.wasSent = r.sent
		r.resend = r.sent || r.parent != nil
		r.sent = true
	}
	u.deadline = now.Add(p.cfg.AckTimeout)
	return u
}

// room reports whether the next unit may go out. With group commit, at
// most MaxInFlight units of any kind are in flight, so that the appends
// arriving meanwhile gather into the next unit, or two when a full batch
// waits (it could gather nothing more). Without it, atomic batches are
// bounded by MaxInFlight and messages by MaxInFlightMsgs. A replicated
// stream is different, see replicatedRoom.
func (p *Pipeline[T]) room() bool {
	if len(p.inflight) == 0 {
		return true
	}
	if last := p.inflight[len(p.inflight)-1]; last.Reqs[0].parent != nil {
		// The parts of a request re-sent message by message go one at a
		// time: a stored ID does not grow the stream, which would fail every
		// part pipelined behind it.
		return false
	}
	if p.cfg.Replicas > 1 {
		return p.replicatedRoom()
	}
	if p.cfg.GroupCommit && p.plainTrain() {
		return p.inflightMsgs < p.cfg.MaxInFlightMsgs
	}
	if p.cfg.GroupCommit {
		return len(p.inflight) < p.cfg.MaxInFlight || len(p.inflight) < 2 && p.queuedAtLeast(p.cfg.MaxBatch)
	}
	n := p.queue[0].Len()
	return p.inflightMsgs+n <= p.cfg.MaxInFlightMsgs && (n == 1 || p.inflightBatches < p.cfg.MaxInFlight)
}

// replicatedRoom is room on a replicated stream, where the server refuses
// a second pending expectation on the barrier subject: a fenced unit goes
// out only when no other is in flight, and gathers (with group commit)
// what waited meanwhile; a plain publish of this writer's chain, which
// needs no fence, goes out at once behind it, so that appends that trickle
// in do not wait a whole unit's round trip.
func (p *Pipeline[T]) replicatedRoom() bool {
	_, n := p.unitSize()
	if p.fenced(n, p.lastID) {
		return p.inflightFenced == 0
	}
	return p.inflightMsgs+n <= p.cfg.MaxInFlightMsgs
}

// fenced reports whether a unit of n messages that follows message ID
// after must expect our barrier to be the stream's newest. A plain
// publish of this writer's chain need not: it expects the message ID
// before it, which only this writer stores, so it cannot land after a
// newer owner's barrier. An atomic batch cannot expect a message ID, and
// a caller's message ID may be stored again by a newer owner.
func (p *Pipeline[T]) fenced(n int, after string) bool {
	return n > 1 || !strings.HasPrefix(after, p.cfg.IDPrefix)
}

// unitSize is how many queued requests the next unit takes and how many
// messages they hold: with group commit every queued request up to
// MaxBatch messages, otherwise one; a solo request (retried after a
// duplicate refusal) always goes alone.
func (p *Pipeline[T]) unitSize() (reqs, n int) {
	if p.plainTrain() {
		return 1, 1
	}
	for i, r := range p.queue {
		if i > 0 && (!p.cfg.GroupCommit || r.solo || n+r.Len() > p.cfg.MaxBatch) {
			break
		}
		reqs, n = i+1, n+r.Len()
		if r.solo {
			break
		}
	}
	return reqs, n
}

// plainTrain reports whether, with group commit, the next unit is a plain
// publish of the first queued append although a batch could gather more:
// the load is light (at most PlainUpTo appends queued and in flight, now
// and at the recent sends, every queued append of one message, none to go
// alone), so a batch would pay its fixed staging cost for a handful of
// messages, while plain publishes pipelined one behind the other cost
// only their writes. Under a heavier load units go as batches, which wait
// for the unit in flight and so gather what arrives meanwhile; the recent
// peak keeps a load that arrives in bursts (callers that all wait for the
// same batch, then append again together) from starting each burst with
// a few plain publishes that the batch behind them would wait for.
func (p *Pipeline[T]) plainTrain() bool {
	if !p.cfg.GroupCommit || p.cfg.PlainUpTo <= 0 || max(p.demand, p.inflightMsgs+len(p.queue)) > p.cfg.PlainUpTo {
		return false
	}
	for _, r := range p.queue {
		if r.Len() != 1 || r.solo {
			return false
		}
	}
	return true
}

// queuedAtLeast reports whether the queue holds at least n messages.
func (p *Pipeline[T]) queuedAtLeast(n int) bool {
	for _, r := range p.queue {
		if n -= r.Len(); n <= 0 {
			return true
		}
	}
	return false
}

// reserve takes the next unit (see unitSize) off the queue and reserves
// its place in the stream.
func (p *Pipeline[T]) reserve() *Unit[T] {
	p.demand = max(p.inflightMsgs+len(p.queue), p.demand-(p.demand+7)/8)
	k, n := p.unitSize()
	u := &Unit[T]{Num: p.nextNum, Expect: p.tail, After: p.lastID, N: n}
	u.Reqs = append(u.oneReq[:0], p.queue[:k]...)
	p.queue = p.queue[k:]
	p.nextNum++
	if u.Fenced = p.fenced(u.N, u.After); u.Fenced {
		u.Fence = p.cfg.Barrier
	}
	p.tail += uint64(u.N)
	p.lastID = u.lastID()
	p.push(u)
	return u
}

// quiet reports whether unit u, just reserved, may go out without a reply
// subject: a first-time plain publish followed at once by another one with
// a message ID of this writer. The follower lands only right after u (it
// expects u's message ID and the sequence after u), and it cannot be a
// duplicate, so its ack answers for u as well; if u was refused, the
// follower fails too, and recovery reads what landed. Re-sent requests
// always get their own answer, which is how a refusal of u is learnt.
func (p *Pipeline[T]) quiet(u *Unit[T]) bool {
	if p.quietRun >= maxQuietRun || !u.Reqs[0].fresh() || u.Atomic() || len(p.queue) == 0 {
		return false
	}
	next := p.queue[0]
	return next.fresh() && next.Len() == 1 && strings.HasPrefix(next.ids[0], p.cfg.IDPrefix) && p.room()
}

// Refused records that the client library refused request k of unit u,
// the unit Next returned last, before it left: the request fails with
// err, the unit's other requests go back to the front of the queue, and
// its place in the stream is given back. An unfinished batch is never
// committed, so nothing of it is stored.
func (p *Pipeline[T]) Refused(now time.Time, u *Unit[T], k int, err error) {
	for _, r := range u.Reqs[k+1:] {
		r.sent = r.wasSent // never left
	}
	p.fail(u.Reqs[k], err)
	rest := append(append([]*Request[T](nil), u.Reqs[:k]...), u.Reqs[k+1:]...)
	p.queue = append(rest, p.queue...)
	p.unreserve(now, u)
}

// unreserve gives back the place of unit u, the last reserved, which did
// not go out. If the unit before it went out unanswered, only the tail can
// tell whether it landed.
func (p *Pipeline[T]) unreserve(now time.Time, u *Unit[T]) {
	p.remove(len(p.inflight)-1, len(p.inflight))
	p.tail -= uint64(u.N)
	p.lastID = u.After
	if n := len(p.inflight); n > 0 && p.inflight[n-1].Quiet {
		p.recover(now, streamwal.Errorf(streamwal.CodeUnavailable, "an unanswered unit lost its follower"))
	}
}

// SendFailed records that the connection failed while unit u went out:
// some of it may have left.
func (p *Pipeline[T]) SendFailed(now time.Time, u *Unit[T], err error) {
	if u.failed == nil {
		u.failed = err
	}
	p.recover(now, err)
}

// Ack records the server's answer to a unit: a success resolves it and
// the units before it; anything else starts a recovery.
func (p *Pipeline[T]) Ack(now time.Time, a Ack) {
	err := p.noteAck(a)
	switch {
	case p.phase == draining:
		p.drained(now)
	case err != nil && p.phase == running:
		p.recover(now, err)
	}
}

// noteAck records an answer: a success resolves its unit (and the units
// before it); anything else marks the unit failed and is returned.
func (p *Pipeline[T]) noteAck(a Ack) error {
	i, u := p.find(a.Num)
	if u == nil {
		return nil // a unit already resolved by recovery
	}
	if a.Duplicate && a.Err == nil && !p.landedLate(i, a.Seq) {
		p.duplicate(i, a.Seq)
		return nil
	}
	if a.Duplicate {
		a.Count = 1
	}
	if a.Err == nil && (a.Count != uint64(u.N) || a.Seq != u.Expect+uint64(u.N)) {
		a.Err = streamwal.Errorf(streamwal.CodeInternal, "batch ack %d/%d does not match %d after %d", a.Seq, a.Count, u.N, u.Expect)
	}
	if a.Err != nil {
		p.noteRefusal(u, a)
		return a.Err
	}
	if !p.landed(i) {
		u.failed = streamwal.Errorf(streamwal.CodeInternal, "unit landed after a refused unit")
		return u.failed
	}
	return nil
}

// find returns the in-flight unit of a number.
func (p *Pipeline[T]) find(num uint64) (int, *Unit[T]) {
	for i, u := range p.inflight {
		if u.Num == num {
			return i, u
		}
	}
	return -1, nil
}

// duplicate resolves a plain publish whose message ID was already stored:
// the append is idempotent, so its caller gets the original's sequence. The
// stream did not grow, so the units after it will fail their expected
// sequence and be re-sent by recovery.
func (p *Pipeline[T]) duplicate(i int, seq uint64) {
	u := p.inflight[i]
	p.refusals = 0
	p.resolveEach(u.Reqs[0], []uint64{seq})
	p.remove(i, i+1)
	p.tail--
	if i == len(p.inflight) {
		// Nothing was sent after it: the next unit follows what came before.
		p.lastID = p.ackedID
		if i > 0 {
			p.lastID = p.inflight[i-1].lastID()
		}
	}
}

// landedLate reports whether a plain publish answered as a duplicate of
// a message at seq found an earlier send of its own, which landed after a
// recovery read the tail: the message is the first after everything this
// writer acknowledged, where the unit expected to land, so the stream is
// where the writer expects. Only the first unit in flight can tell: a
// duplicate says nothing of the units before it.
func (p *Pipeline[T]) landedLate(i int, seq uint64) bool {
	return i == 0 && p.inflight[0].Expect == p.acked && seq == p.acked+1
}

// landed resolves the in-flight units up to index i once unit i's ack
// arrived: unit i followed exactly the sequence its predecessors were to
// end at, under this writer's fence, so they landed too.
//
// It reports false, resolving nothing, if a unit before it was refused:
// then only the tail can tell what happened.
func (p *Pipeline[T]) landed(i int) bool {
	for _, u := range p.inflight[:i] {
		if u.failed != nil {
			return false
		}
	}
	p.refusals = 0
	for _, u := range p.inflight[:i+1] {
		p.complete(u, u.Expect+1)
		if end := u.Expect + uint64(u.N); end > p.acked {
			p.acked, p.ackedID = end, u.lastID()
		}
	}
	p.remove(0, i+1)
	// The landing shows where the stream ends: after a duplicate the units
	// behind it may have expected more than the writer's tail counted.
	p.tail = p.acked + uint64(p.inflightMsgs)
	return true
}

// noteRefusal records why the server refused a unit.
func (p *Pipeline[T]) noteRefusal(u *Unit[T], a Ack) {
	u.failed, u.dup = a.Err, a.RefusedDup
	if a.Permanent {
		u.permanent = a.Err
	}
	if !a.RefusedDup && !a.WrongSeq {
		// Duplicate refusals are cured by re-sending differently, and a
		// unit refused for its expected sequence by re-sending after
		// recovery read the tail (a newer owner's barrier there stops the
		// writer as fenced), not by waiting: only the other refusals pause.
		p.refusals++
	}
}

// Tick tells the pipeline the time: an answer overdue starts a recovery,
// a recovery stops waiting for it, a pause or a retry's wait ends.
func (p *Pipeline[T]) Tick(now time.Time) {
	switch p.phase {
	case running:
		for _, u := range p.inflight {
			if now.After(u.deadline) {
				p.recover(now, streamwal.Errorf(streamwal.CodeUnavailable, "batch ack timed out after %v", p.cfg.AckTimeout))
				return
			}
		}
	case draining:
		p.drained(now)
	case retrying:
		if !now.Before(p.resumeAt) {
			p.phase = scanning
		}
	case pausing:
		if !now.Before(p.resumeAt) {
			p.phase = running
		}
	}
}

// Reconnected records that the connection was re-established: the answers
// to what was in flight may have been lost with the old one, and waiting
// for every deadline would stall appends for AckTimeout, so the tail is
// read at once.
func (p *Pipeline[T]) Reconnected(now time.Time) {
	if len(p.inflight) == 0 {
		return
	}
	err := streamwal.Errorf(streamwal.CodeUnavailable, "connection re-established with units in flight")
	for _, u := range p.inflight {
		if u.failed == nil {
			u.failed = err
		}
	}
	if p.phase == running {
		p.recover(now, err)
	} else if p.phase == draining {
		p.drained(now)
	}
}

// Close starts the close: the pipeline keeps resolving what is queued for
// CloseBudget, without the pause or wait a recovery was in.
func (p *Pipeline[T]) Close(now time.Time) {
	if p.closing {
		return
	}
	p.closing, p.closeBy = true, now.Add(p.cfg.CloseBudget)
	switch p.phase {
	case pausing:
		p.phase = running
	case retrying:
		p.phase = scanning
	}
}

// Halt stops the writer with err (the connection closed for good).
func (p *Pipeline[T]) Halt(err error) {
	if p.fatal == nil {
		p.fatal = err
	}
}

// recover starts a recovery: wait for the answers still due, then read
// the tail (NeedScan) and settle every unit in flight against it.
func (p *Pipeline[T]) recover(now time.Time, cause error) {
	p.ready.Recoveries = append(p.ready.Recoveries, cause)
	p.phase, p.retry = draining, firstRetry
	p.drained(now)
}

// due reports whether a recovery waits for unit u's answer until its
// deadline: it was neither refused nor sent quiet.
func (p *Pipeline[T]) due(u *Unit[T]) bool { return u.failed == nil && !u.Quiet }

// drained ends the wait of a recovery once no answer is due: the tail is
// read next, unless the answers resolved every unit.
func (p *Pipeline[T]) drained(now time.Time) {
	for _, u := range p.inflight {
		if p.due(u) && now.Before(u.deadline) {
			return
		}
	}
	if len(p.inflight) == 0 {
		p.phase = running
		return
	}
	p.phase = scanning
}

// push adds a sent unit to the in-flight list.
func (p *Pipeline[T]) push(u *Unit[T]) {
	p.inflight = append(p.inflight, u)
	p.inflightMsgs += u.N
	if u.Atomic() {
		p.inflightBatches++
	}
	if u.Fenced {
		p.inflightFenced++
	}
}

// remove drops the in-flight units [from, to). Removing a prefix reslices,
// so resolving acks in order costs O(1) each.
func (p *Pipeline[T]) remove(from, to int) {
	for _, u := range p.inflight[from:to] {
		p.inflightMsgs -= u.N
		if u.Atomic() {
			p.inflightBatches--
		}
		if u.Fenced {
			p.inflightFenced--
		}
	}
	if from == 0 {
		p.inflight = p.inflight[to:]
		return
	}
	p.inflight = append(p.inflight[:from], p.inflight[to:]...)
}

// clearInflight empties the in-flight list.
func (p *Pipeline[T]) clearInflight() {
	p.inflight, p.inflightMsgs, p.inflightBatches, p.inflightFenced = nil, 0, 0, 0
}

// complete resolves a landed unit whose first message is at first.
func (p *Pipeline[T]) complete(u *Unit[T], first uint64) {
	for _, r := range u.Reqs {
		p.resolve(r, first)
		first += uint64(r.Len())
	}
}

// resolve reports that request r's messages are stored from first on.
func (p *Pipeline[T]) resolve(r *Request[T], first uint64) {
	if r.parent != nil {
		p.partResolved(r, first)
		return
	}
	p.ready.Results = append(p.ready.Results, Result[T]{Req: r, First: first})
}

// resolveEach reports that request r's messages are stored at seqs.
func (p *Pipeline[T]) resolveEach(r *Request[T], seqs []uint64) {
	if r.parent != nil {
		p.partResolved(r, seqs[0])
		return
	}
	p.ready.Results = append(p.ready.Results, Result[T]{Req: r, Seqs: seqs})
}

// fail reports that request r failed with err.
func (p *Pipeline[T]) fail(r *Request[T], err error) {
	if r.parent != nil {
		p.partFailed(r.parent, err)
		return
	}
	p.ready.Results = append(p.ready.Results, Result[T]{Req: r, Err: err})
}

// partResolved records that part r is stored at seq; the parent resolves
// with its last part.
func (p *Pipeline[T]) partResolved(r *Request[T], seq uint64) {
	f := r.parent
	if f.settled {
		return
	}
	f.seqs[r.index] = seq
	f.landed = true
	if f.parts--; f.parts == 0 {
		f.settled = true
		p.ready.Results = append(p.ready.Results, Result[T]{Req: f, Seqs: f.seqs})
	}
}

// partFailed fails request f with the first failure of a part. If another
// part already landed, the request is partly written.
func (p *Pipeline[T]) partFailed(f *Request[T], err error) {
	if f.settled {
		return
	}
	f.settled = true
	if f.landed {
		err = streamwal.Errorf(streamwal.CodeUnknownOutcome, "part of the append landed before: %v", err)
	}
	p.ready.Results = append(p.ready.Results, Result[T]{Req: f, Err: err})
}

// Stop fails whatever is left, as the writer stops for reason (Fatal,
// if set, wins): what is in flight, and what went out once and was queued
// again, may still land (an unknown outcome, unless the writer was fenced:
// then it never will); the rest fails with the reason. It returns the
// reason.
func (p *Pipeline[T]) Stop(reason error) error {
	if p.fatal != nil {
		reason = p.fatal
	}
	unknown := streamwal.Errorf(streamwal.CodeUnknownOutcome, "writer stopped before the append was confirmed: %v", reason)
	for _, u := range p.inflight {
		for _, r := range u.Reqs {
			p.fail(r, unknown)
		}
	}
	for _, r := range p.queue {
		if r.sent && streamwal.CodeOf(reason) != streamwal.CodeFenced {
			p.fail(r, unknown)
			continue
		}
		p.fail(r, reason)
	}
	p.clearInflight()
	p.tail, p.lastID = p.acked, p.ackedID
	p.queue = nil
	return reason
}
