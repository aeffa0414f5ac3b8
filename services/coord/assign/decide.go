package assign

import (
	"maps"
	"slices"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/coord/balance"
)

// takeover loads and fences the persisted state.
func (m *Machine) takeover(ev Takeover) {
	m.view = ev.View
	m.alloc = cloneCollections(ev.Collections)
	m.channels, m.byName = nil, map[streamwal.PChannel]*channel{}
	for _, l := range ev.Channels {
		ch := &channel{p: l.PChannel, rec: l.Record, fence: l.Record.Term}
		m.channels = append(m.channels, ch)
		m.byName[ch.p] = ch
	}
	m.countVChannels()
	for _, ch := range m.channels {
		r := ch.rec
		if r.State == streamwal.Assigning {
			// The previous coordinator may never have told the node:
			// assign it again (under the next term) rather than wait.
			r.State, r.Node = streamwal.Unavailable, ""
		}
		// Served only once its owner confirms it to this coordinator.
		r.Serving, r.Since = false, m.now.UTC()
		r.Epoch = m.cfg.Epoch
		m.emit(Fence{PChannel: ch.p, Term: ch.fence})
		m.propose(ch, r, nil)
	}
	alloc := cloneCollections(m.alloc)
	if alloc.CChannel == "" && len(m.channels) > 0 {
		alloc.CChannel = m.channels[0].p.CChannel().String()
	}
	alloc.Epoch = m.cfg.Epoch
	m.proposeCollections(alloc, 0, nil)
	// The owners are seeded once the records are rewritten (Step), so
	// that the time the writes took does not count against them.
	m.seeding, m.dirty = true, true
}

// seedMembers counts the owners of the ASSIGNED records alive, in the
// sessions that confirmed them, until the node TTL says otherwise, so
// that a new active coordinator does not move PChannels of nodes it has
// not heard from yet. None of them counts as served until its owner
// confirms it: a heartbeat of another session is a new incarnation that
// serves nothing of the old one's, and one of the same session must list
// the PChannel under its term.
func (m *Machine) seedMembers() {
	for _, ch := range m.channels {
		r := m.cur(ch)
		if r.Node == "" || r.State != streamwal.Assigned {
			continue
		}
		if _, ok := m.nodes[r.Node]; !ok {
			m.nodes[r.Node] = &member{session: r.Session, lastSeen: m.now}
		}
	}
}

// nodeSeen applies a registration or heartbeat.
func (m *Machine) nodeSeen(ev NodeSeen) {
	mem := m.nodes[ev.Node]
	switch {
	case mem == nil:
		m.log(Info, "node joined", Field{"node", ev.Node}, Field{"session", ev.Session})
		m.join(ev)
	case mem.session != "" && mem.session != ev.Session:
		// A new incarnation under the same ID: whatever the old one
		// served, this one serves none of it until it opens it again
		// under a new term.
		m.log(Info, "node restarted", Field{"node", ev.Node}, Field{"session", ev.Session}, Field{"previous_session", mem.session})
		m.lose(ev.Node)
		m.join(ev)
	default:
		if mem.session == "" {
			m.log(Info, "node session learned", Field{"node", ev.Node}, Field{"session", ev.Session})
		}
		mem.heardFrom(ev, m.now)
		m.verify(ev.Node, mem, !ev.Replayed)
	}
}

// nodeGone applies a deleted registration.
func (m *Machine) nodeGone(id streamwal.NodeID) {
	if mem := m.nodes[id]; mem != nil {
		m.log(Info, "node left", Field{"node", id}, Field{"session", mem.session})
		m.lose(id)
	}
}

// heardFrom takes in a heartbeat of the member's session.
func (mem *member) heardFrom(ev NodeSeen, now time.Time) {
	mem.session, mem.lastSeen, mem.version = ev.Session, now, ev.Version
	mem.serving = maps.Clone(ev.Serving)
	if mem.serving == nil {
		mem.serving = map[streamwal.PChannel]uint64{}
	}
}

// join adds a node in the session its heartbeat names.
func (m *Machine) join(ev NodeSeen) {
	mem := &member{}
	mem.heardFrom(ev, m.now)
	m.nodes[ev.Node] = mem
	m.rebalance, m.dirty = true, true
	m.verify(ev.Node, mem, !ev.Replayed)
}

// lose removes a node and makes its PChannels UNAVAILABLE; opens under
// way on it are cancelled (their outcomes then fail), so that a node lost
// during a long replay does not hold its PChannels for the open timeout.
func (m *Machine) lose(id streamwal.NodeID) {
	delete(m.nodes, id)
	for _, ch := range m.channels {
		if m.cur(ch).Node != id {
			continue
		}
		if ch.opening {
			m.emit(CancelOpen{PChannel: ch.p})
			continue
		}
		m.setState(ch, "", streamwal.Unavailable, nil, nil)
	}
	m.rebalance, m.dirty = true, true
}

// verify compares the PChannels assigned to a node with what its last
// heartbeat says it serves. One it lists under the assigned term is
// served (when the heartbeat is live); one it does not list although the
// heartbeat is at least as new as the open that confirmed it, or one
// confirmed by another session, is not served and is reassigned.
func (m *Machine) verify(id streamwal.NodeID, mem *member, live bool) {
	for _, ch := range m.channels {
		r := m.cur(ch)
		if r.Node != id || r.State != streamwal.Assigned || ch.opening {
			continue
		}
		term, listed := mem.serving[ch.p]
		switch {
		case r.Session != "" && r.Session != mem.session:
			m.reopen(ch, "confirmed by an earlier incarnation of its owner")
		case listed && term == r.Term:
			next := r
			if next.Session == "" {
				next.Session = mem.session
			}
			if live {
				m.markServing(&next, true)
			}
			if next != r {
				m.propose(ch, next, nil)
			}
		case mem.version >= r.Version:
			m.reopen(ch, "its owner no longer serves it")
		}
	}
}

// reopen gives up an ASSIGNED (or ASSIGNING) PChannel its owner does not
// serve, so that the scheduler assigns it again under the next term.
func (m *Machine) reopen(ch *channel, why string) {
	r := m.cur(ch)
	m.log(Warn, "reassigning: "+why, Field{"pchannel", ch.p}, Field{"node", r.Node}, Field{"term", r.Term})
	m.setState(ch, "", streamwal.Unavailable, nil, nil)
	m.rebalance = true
}

// checkHealth loses the nodes unheard for the node TTL, gives up the
// PChannels whose owner did not confirm them within the open timeout (or
// whose open ended without its outcome persisted), and warns of the
// PChannels unserved for long.
func (m *Machine) checkHealth() {
	for _, id := range slices.Sorted(maps.Keys(m.nodes)) {
		if mem := m.nodes[id]; m.now.Sub(mem.lastSeen) > m.cfg.NodeTTL {
			m.log(Warn, "node dead", Field{"node", id}, Field{"session", mem.session})
			m.lose(id)
		}
	}
	timeout := m.cfg.OpenTimeout
	warnAfter := min(timeout, m.cfg.UnservedWarning)
	for _, ch := range m.channels {
		r := m.cur(ch)
		if r.Serving {
			ch.warned = time.Time{}
			continue
		}
		unserved := m.now.Sub(r.Since)
		switch {
		case r.State == streamwal.Assigned && !ch.opening && unserved > timeout:
			m.reopen(ch, "its owner did not confirm it within the open timeout")
		case r.State == streamwal.Assigning && !ch.opening && !m.deposed:
			m.reopen(ch, "its open ended but its outcome was not persisted")
		}
		if unserved > warnAfter && (ch.warned.IsZero() || m.now.Sub(ch.warned) > warnAfter) {
			ch.warned = m.now
			r = m.cur(ch)
			m.log(Warn, "pchannel not serving", Field{"pchannel", ch.p}, Field{"state", string(r.State)}, Field{"node", r.Node},
				Field{"term", r.Term}, Field{"unserved_for", unserved.Round(time.Millisecond)}, Field{"nodes", len(m.nodes)})
		}
	}
}

// setState proposes ch's record in state s on node, edited first by edit
// if any; any state but ASSIGNED is not served.
func (m *Machine) setState(ch *channel, node streamwal.NodeID, s streamwal.AssignmentState, edit func(*Record), then func()) {
	r := m.cur(ch)
	if edit != nil {
		edit(&r)
	}
	r.Node, r.State = node, s
	if s != streamwal.Assigned {
		m.markServing(&r, false)
		r.Session, r.Version = "", 0
	}
	m.propose(ch, r, then)
}

// markServing changes Serving and its Since; a confirmed PChannel has no
// open error any more.
func (m *Machine) markServing(r *Record, serving bool) {
	if r.Serving != serving {
		r.Serving, r.Since = serving, m.now.UTC()
	}
	if serving {
		r.Error = ""
	}
}

// schedule assigns every PChannel without a live owner and, when a
// rebalance is due, moves PChannels for balance.
func (m *Machine) schedule() {
	if m.deposed || len(m.nodes) == 0 {
		return
	}
	var nodes []balance.Node
	for _, id := range slices.Sorted(maps.Keys(m.nodes)) {
		nodes = append(nodes, balance.Node{ID: id})
	}
	var chans []balance.Channel
	for _, ch := range m.channels {
		chans = append(chans, balance.Channel{PChannel: ch.p, Owner: m.cur(ch).Node, VChannels: m.counts[ch.p]})
	}
	rebalance := m.rebalance
	m.rebalance = false
	for _, mv := range m.cfg.Policy.Plan(nodes, chans) {
		ch := m.byName[mv.PChannel]
		if ch == nil || ch.opening || mv.From != "" && !rebalance || m.now.Before(ch.retry.after) {
			continue
		}
		m.start(ch, mv.From, mv.To)
	}
}

// start begins an assignment: the oracle's fence is raised to the next
// term, which is persisted as ASSIGNING; once it is, the node hears of
// it.
func (m *Machine) start(ch *channel, from, to streamwal.NodeID) {
	oldTerm := m.cur(ch).Term
	ch.fence++
	term := ch.fence
	m.emit(Fence{PChannel: ch.p, Term: term})
	m.setState(ch, to, streamwal.Assigning, func(r *Record) { r.Term = term }, func() {
		if m.deposed {
			return
		}
		ch.opening = true
		m.log(Info, "assign", Field{"pchannel", ch.p}, Field{"from", from}, Field{"to", to}, Field{"term", term})
		open := Open{PChannel: ch.p, Node: to, Term: term}
		if from != "" {
			open.Close = &Close{Node: from, Term: oldTerm}
		}
		m.emit(open)
	})
}

// ended ends the open under way of p to node under term, and reports
// whether there was one: an outcome of any other open is ignored.
func (m *Machine) ended(p streamwal.PChannel, node streamwal.NodeID, term uint64) (*channel, bool) {
	ch := m.byName[p]
	if ch == nil || !ch.opening {
		return nil, false
	}
	if r := m.cur(ch); r.Term != term || r.Node != node {
		return nil, false
	}
	ch.opening = false
	return ch, true
}

// openFailed gives up a PChannel whose open failed, and tries it again
// after a delay that doubles with every failure in a row.
func (m *Machine) openFailed(ev OpenFailed) {
	ch, ok := m.ended(ev.PChannel, ev.Node, ev.Term)
	if !ok {
		return
	}
	ch.retry.delay = min(max(2*ch.retry.delay, m.cfg.RetryFirst), m.cfg.RetryMax)
	ch.retry.after = m.now.Add(ch.retry.delay)
	m.log(Warn, "assignment failed", Field{"pchannel", ev.PChannel}, Field{"node", ev.Node}, Field{"term", ev.Term},
		Field{"error", ev.Err}, Field{"retry_in", ch.retry.delay})
	m.setState(ch, "", streamwal.Unavailable, func(r *Record) { r.Error = ev.Err.Error() }, nil)
}

// openConfirmed completes an assignment: the PChannel is ASSIGNED and
// served once the owner's current session confirmed it.
func (m *Machine) openConfirmed(ev OpenConfirmed) {
	ch, ok := m.ended(ev.PChannel, ev.Node, ev.Term)
	if !ok {
		return
	}
	at := []Field{{"pchannel", ev.PChannel}, {"node", ev.Node}, {"term", ev.Term}}
	mem, alive := m.nodes[ev.Node]
	switch {
	case !alive:
		m.log(Warn, "assignment confirmed by a node since lost", at...)
		m.setState(ch, "", streamwal.Unavailable, nil, nil)
		return
	case mem.session != "" && ev.Session != mem.session:
		m.log(Warn, "assignment confirmed by an incarnation since replaced", append(at, Field{"session", ev.Session}, Field{"live_session", mem.session})...)
		m.setState(ch, "", streamwal.Unavailable, nil, nil)
		return
	}
	ch.retry = retry{}
	m.setState(ch, ev.Node, streamwal.Assigned, func(r *Record) {
		r.Session, r.Version = ev.Session, ev.Version
		m.markServing(r, true)
	}, func() {
		m.log(Info, "assigned", append(at, Field{"session", ev.Session}, Field{"barrier", uint64(ev.Barrier)})...)
	})
	// A heartbeat newer than the open may already say otherwise.
	m.verify(ev.Node, mem, false)
	// A round moves at most MaxMoves PChannels: go on until the plan is
	// empty (the policy's tolerance keeps it from flapping).
	m.rebalance = true
}
