package pipeline

import (
	"strconv"
	"time"
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
	demand   int
	refusals int // refusals in a row, for the pause
	phase    phase
	resumeAt time.Time     // the end of a pause or of a retry's wait
	retry    time.Duration // the wait before the next tail read
	closing  bool
	closeBy  time.Time
	fatal    error
	ready    Ready[T]
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
