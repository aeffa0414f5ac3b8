// Package assign is the coordinator's assignment state machine (DESIGN.md
// §3; issue 20 item 2): which node owns which PChannel under which term,
// which nodes are alive, and where the VChannels are placed. It decides;
// it does no I/O and reads no clock.
//
// Events go in through [Machine.Step], with the time they happen at: a
// node seen (a heartbeat) or gone, a health check (nodes unheard for the
// node TTL are lost, by the time given, not the wall clock), a balance
// round, an open confirmed or failed, a takeover's loaded records, an
// allocation or release, and the answer to each persist. Effects come
// out, in the order the caller must carry them out: persist an assignment,
// the VChannel allocation or the view (each under a [Rev] that its answer
// names), raise a PChannel's fence at the oracle, send an open (after a
// close on the previous owner) or cancel one, report a change, reply to
// a call, log.
//
// # Persist first
//
// A change of a persisted record is proposed, not made: the machine keeps
// the record as it was persisted, and takes the proposed one only when
// its [Persisted] answer comes; a [PersistFailed] leaves the record as it
// was, with nothing to undo. What follows from a change (the open of an
// ASSIGNING record, an allocation's reply, the report) follows its
// answer. Decisions within one step see the step's own proposals, so
// that a step can change a PChannel twice (confirm it, then find that its
// owner no longer serves it). The caller answers every persist of a step
// before it steps the next event (the answers' effects, carried out at
// once, come first); the view is published once a step's persists are
// all answered and something changed.
//
// # Terms
//
// A term is a PChannel's ownership term, nothing else: each assignment of
// a PChannel is under the next term, the fence ([Fence]) is raised to it
// before the record is persisted and before the new owner hears of it, and
// a term proposed is never proposed again, whether or not its record was
// persisted. The coordinator's own lease epoch is [Config.Epoch].
package assign

import (
	"fmt"
	"slices"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/coord/balance"
	"github.com/streamwal/streamwal/services/wire"
)

// Defaults of the delays between failed opens of a PChannel.
const (
	DefaultRetryFirst = 100 * time.Millisecond
	DefaultRetryMax   = 5 * time.Second
)

// Config configures a machine.
type Config struct {
	// Epoch is the coordinator's lease epoch, written into every record;
	// Leader its ID, written into the view.
	Epoch  uint64
	Leader string
	// NodeTTL is how long a node may go unheard before it is lost.
	NodeTTL time.Duration
	// OpenTimeout is how long an ASSIGNED PChannel may go unconfirmed by
	// its owner before it is reassigned.
	OpenTimeout time.Duration
	// UnservedWarning is how long a PChannel may go unserved before it is
	// warned of (and again every as long), or OpenTimeout if shorter.
	UnservedWarning time.Duration
	// RetryFirst and RetryMax bound the delay before a PChannel whose
	// open failed is tried again: it doubles with every failure in a row,
	// so that a node refusing a PChannel for good (its history was lost,
	// say) is not asked again and again in a tight loop. Zero: the
	// defaults.
	RetryFirst, RetryMax time.Duration
	// Policy is the balance policy.
	Policy balance.Policy
}

// Rev names one persist among those the machine proposed.
type Rev uint64

// Record is a PChannel's assignment as the machine keeps it: typed, and
// without the VChannel count, which follows from the allocation.
type Record struct {
	Node  streamwal.NodeID
	Term  uint64
	State streamwal.AssignmentState
	// Epoch is the coordinator epoch that wrote it.
	Epoch uint64
	// Session and Version are those of the owner's open reply.
	Session string
	Version uint64
	// Serving says whether the owner confirmed it; Since is when that last
	// changed. Error is why the last open failed, until it serves.
	Serving bool
	Since   time.Time
	Error   string
}

// FromWire reads a persisted assignment.
func FromWire(a streamwal.Assignment) (streamwal.PChannel, Record, error) {
	p, err := streamwal.ParsePChannel(a.PChannel)
	if err != nil {
		return p, Record{}, fmt.Errorf("assignment: %w", err)
	}
	var node streamwal.NodeID
	if a.Node != "" {
		if node, err = streamwal.ParseNodeID(a.Node); err != nil {
			return p, Record{}, fmt.Errorf("assignment of %s: %w", p, err)
		}
	}
	return p, Record{Node: node, Term: a.Term, State: a.State, Epoch: a.Epoch, Session: a.Session,
		Version: a.Version, Serving: a.Serving, Since: a.Since, Error: a.Error}, nil
}

// Wire is r as persisted for p, carrying vchannels VChannels.
func (r Record) Wire(p streamwal.PChannel, vchannels int) streamwal.Assignment {
	return streamwal.Assignment{PChannel: p.String(), Node: string(r.Node), Term: r.Term, State: r.State, VChannels: vchannels,
		Epoch: r.Epoch, Session: r.Session, Version: r.Version, Serving: r.Serving, Since: r.Since, Error: r.Error}
}

// Machine is the assignment state machine. It is not safe for concurrent
// use: one goroutine steps it.
type Machine struct {
	cfg      Config
	channels []*channel // in the cluster's order
	byName   map[streamwal.PChannel]*channel
	nodes    map[streamwal.NodeID]*member
	alloc    wire.Collections // as persisted
	counts   map[streamwal.PChannel]int
	view     wire.View // as last published
	// rebalance: the next schedule may move live-owned PChannels.
	rebalance bool
	deposed   bool
	// dirty: something the view shows changed since it was published.
	dirty bool
	// seeding: the takeover's owners are to be seeded once its records
	// are rewritten.
	seeding bool
	lastRev Rev
	pending map[Rev]*proposal
	now     time.Time
	out     []Effect
}

// channel is one PChannel.
type channel struct {
	p       streamwal.PChannel
	rec     Record  // as persisted
	next    *Record // the latest proposal not answered yet
	nextRev Rev
	fence   uint64 // the highest term proposed
	opening bool   // an open is under way (ASSIGNING)
	retry   retry
	warned  time.Time // last warning that it is not served; zero: none
}

// retry is when a PChannel whose opens failed may be tried again.
type retry struct {
	after time.Time
	delay time.Duration
}

// member is a live node: its session (one incarnation of the node) and
// what its last heartbeat said it serves.
type member struct {
	session  string // "" while unknown (seeded from records without one)
	lastSeen time.Time
	version  uint64 // of the served set in the last heartbeat
	serving  map[streamwal.PChannel]uint64
}

// proposal is a persist not answered yet.
type proposal struct {
	ch    *channel          // an assignment's, with rec
	rec   Record            //
	alloc *wire.Collections // the allocation's
	call  uint64            // the call an allocation answers (0: none)
	reply wire.AllocateReply
	then  func() // what follows the assignment's persist
}

// New is a machine with no PChannels: a [Takeover] loads them.
func New(cfg Config) *Machine {
	if cfg.RetryFirst <= 0 {
		cfg.RetryFirst = DefaultRetryFirst
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = DefaultRetryMax
	}
	return &Machine{cfg: cfg, byName: map[streamwal.PChannel]*channel{}, nodes: map[streamwal.NodeID]*member{},
		counts: map[streamwal.PChannel]int{}, pending: map[Rev]*proposal{}}
}

// Step takes in ev, which happened at now, and returns the effects to
// carry out, in order. Every persist among them must be answered
// ([Persisted] or [PersistFailed]) before another event is stepped; an
// answer's effects are carried out before the effects after the persist.
func (m *Machine) Step(now time.Time, ev Event) []Effect {
	m.now, m.out = now, nil
	switch ev := ev.(type) {
	case Persisted:
		m.answered(ev.Rev, nil, false)
	case PersistFailed:
		m.answered(ev.Rev, ev.Err, ev.Deposed)
	case Takeover:
		m.mustBeAnswered(ev)
		m.takeover(ev)
	default:
		m.mustBeAnswered(ev)
		m.handle(ev)
		m.schedule()
	}
	if m.seeding && len(m.pending) == 0 {
		m.seeding = false
		m.seedMembers()
	}
	if m.dirty && len(m.pending) == 0 {
		m.publish()
	}
	out := m.out
	m.out = nil
	return out
}

// mustBeAnswered panics when ev comes before the answers of the persists
// of the step before: the caller broke Step's contract.
func (m *Machine) mustBeAnswered(ev Event) {
	if len(m.pending) > 0 {
		panic(fmt.Sprintf("assign: %T stepped with %d persists unanswered", ev, len(m.pending)))
	}
}

// handle applies one event of the coordinator's loop.
func (m *Machine) handle(ev Event) {
	switch ev := ev.(type) {
	case NodeSeen:
		m.nodeSeen(ev)
	case NodeGone:
		m.nodeGone(ev.Node)
	case HealthCheck:
		m.checkHealth()
	case Balance:
		m.rebalance = true
	case OpenConfirmed:
		m.openConfirmed(ev)
	case OpenFailed:
		m.openFailed(ev)
	case Allocate:
		m.allocate(ev)
	case Release:
		m.release(ev)
	case Deposed:
		m.deposed = true
	default:
		panic(fmt.Sprintf("assign: unknown event %T", ev))
	}
}

// View is the view as last published.
func (m *Machine) View() wire.View {
	v := m.view
	v.Channels = slices.Clone(v.Channels)
	v.Nodes = slices.Clone(v.Nodes)
	return v
}

// PChannels are the cluster's PChannels, in order.
func (m *Machine) PChannels() []streamwal.PChannel {
	out := make([]streamwal.PChannel, len(m.channels))
	for i, ch := range m.channels {
		out[i] = ch.p
	}
	return out
}

// emit adds effects to the step's.
func (m *Machine) emit(es ...Effect) { m.out = append(m.out, es...) }

// newRev names a new persist.
func (m *Machine) newRev() Rev {
	m.lastRev++
	return m.lastRev
}

// cur is ch's record as the step's decisions see it: its latest
// proposal, or the persisted record.
func (m *Machine) cur(ch *channel) Record {
	if ch.next != nil {
		return *ch.next
	}
	return ch.rec
}

// propose persists rec as ch's record; then, if any, runs once it is
// persisted.
func (m *Machine) propose(ch *channel, rec Record, then func()) {
	rev := m.newRev()
	ch.next, ch.nextRev = &rec, rev
	m.pending[rev] = &proposal{ch: ch, rec: rec, then: then}
	m.emit(PersistAssignment{Rev: rev, PChannel: ch.p, Assignment: rec.Wire(ch.p, m.counts[ch.p])})
}

// answered takes in the answer to persist rev.
func (m *Machine) answered(rev Rev, err error, deposed bool) {
	pr, ok := m.pending[rev]
	if !ok {
		return
	}
	delete(m.pending, rev)
	if deposed {
		m.deposed = true
	}
	switch {
	case pr.ch != nil:
		m.answeredAssignment(rev, pr, err)
	case pr.alloc != nil:
		m.answeredCollections(pr, err)
	}
}

// answeredAssignment takes in the answer to an assignment's persist.
func (m *Machine) answeredAssignment(rev Rev, pr *proposal, err error) {
	ch := pr.ch
	if ch.nextRev == rev {
		ch.next = nil
	}
	if err != nil {
		return
	}
	ch.rec = pr.rec
	m.dirty = true
	m.emit(Report{PChannel: ch.p, Node: ch.rec.Node, Term: ch.rec.Term, State: ch.rec.State, Serving: ch.rec.Serving})
	if pr.then != nil {
		pr.then()
	}
}

// publish proposes the view of what is persisted and alive.
func (m *Machine) publish() {
	m.dirty = false
	v := &m.view
	v.Version++
	v.Epoch, v.Leader = m.cfg.Epoch, m.cfg.Leader
	v.CChannel = m.alloc.CChannel
	v.Channels = make([]wire.Assignment, 0, len(m.channels))
	for _, ch := range m.channels {
		v.Channels = append(v.Channels, ch.rec.Wire(ch.p, m.counts[ch.p]))
	}
	v.Nodes = make([]string, 0, len(m.nodes))
	for id := range m.nodes {
		v.Nodes = append(v.Nodes, string(id))
	}
	slices.Sort(v.Nodes)
	rev := m.newRev()
	m.pending[rev] = &proposal{}
	m.emit(PublishView{Rev: rev, View: m.View()})
}

// log emits a log line.
func (m *Machine) log(level Level, msg string, fields ...Field) {
	m.emit(Log{Level: level, Msg: msg, Fields: fields})
}
