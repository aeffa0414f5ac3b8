package coord

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/coord/balance"
	"github.com/streamwal/streamwal/services/wire"
)

// member is a live node as the coordinator sees it: its session (one
// incarnation of the node) and what its last heartbeat said it serves.
type member struct {
	session  string // "" while unknown (seeded from records without one)
	lastSeen time.Time
	version  uint64            // of the served set in the last heartbeat
	serving  map[string]uint64 // PChannel -> term, as of version
}

// newMember is a node as its record describes it.
func newMember(rec *wire.NodeRecord) *member {
	m := &member{}
	m.heardFrom(rec)
	return m
}

// heardFrom takes in a heartbeat of the member's session.
func (m *member) heardFrom(rec *wire.NodeRecord) {
	m.session, m.lastSeen, m.version = rec.Session, time.Now(), rec.Version
	m.serving = make(map[string]uint64, len(rec.Serving))
	for _, s := range rec.Serving {
		m.serving[s.PChannel] = s.Term
	}
}

// nodeEvent is a change in the nodes bucket (record nil: deleted). A
// replayed event is one of the values the watch found when it started:
// it may be the last word of a node long gone, so it tells sessions and
// what a node no longer serves, but never confirms that a PChannel is
// served.
type nodeEvent struct {
	id       streamwal.NodeID
	record   *wire.NodeRecord
	replayed bool
}

// opResult is the end of an assignment operation.
type opResult struct {
	pchannel string
	node     string
	term     uint64
	reply    wire.OpenReply
	err      error
}

// control is the coordinator's state machine of membership, assignment
// and VChannel allocation. Only its loop goroutine touches its state;
// handlers hand it closures through calls.
type control struct {
	t         *tenure
	assign    *store
	vchan     *store
	names     []string // the PChannels, fixed at creation
	nodes     map[streamwal.NodeID]*member
	channels  []*wire.Assignment
	byName    map[string]*wire.Assignment
	busy      map[string]context.CancelFunc // assignments under way, cancelled when their node is lost
	alloc     wire.Collections
	view      wire.View
	events    chan nodeEvent
	results   chan opResult
	calls     chan func()
	rebalance bool
	warned    map[string]time.Time // last warning of an unserved PChannel
	retry     map[string]retry     // PChannels whose last open failed
	// stuckWarned is when stuck broadcasts were last warned of.
	stuckWarned time.Time
}

// retry is when a PChannel whose opens failed is tried again: after a
// delay that doubles with every failure in a row, from retryFirst up to
// retryMax, so that a node refusing a PChannel for good (its history was
// lost, say) is not asked again and again in a tight loop.
type retry struct {
	after time.Time
	delay time.Duration
}

// Bounds of the delay between failed opens of a PChannel.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 5 * time.Second
)

// newControl loads and fences the persisted state.
func newControl(ctx context.Context, t *tenure) (*control, error) {
	c := t.c
	ctl := &control{t: t, assign: newStore(c.buckets[streamwal.BucketAssignments]), vchan: newStore(c.buckets[streamwal.BucketVChannels]),
		nodes: map[streamwal.NodeID]*member{}, byName: map[string]*wire.Assignment{}, busy: map[string]context.CancelFunc{}, warned: map[string]time.Time{}, retry: map[string]retry{},
		events: make(chan nodeEvent, 64), results: make(chan opResult, 64), calls: make(chan func())}
	if _, err := ctl.assign.load(ctx, streamwal.KeyView, &ctl.view); err != nil {
		return nil, err
	}
	names, err := ctl.pchannelNames()
	if err != nil {
		return nil, err
	}
	ctl.names = names
	for _, name := range names {
		if err := ctl.loadChannel(ctx, name); err != nil {
			return nil, err
		}
	}
	if err := ctl.loadAllocation(ctx, names[0]); err != nil {
		return nil, err
	}
	ctl.seedMembers()
	ctl.view.Epoch = t.epoch
	ctl.view.Leader = c.cfg.ID
	if err := ctl.publish(ctx); err != nil {
		return nil, err
	}
	return ctl, nil
}

// seedMembers counts the owners of the persisted assignments as alive,
// in the sessions that confirmed them, until NodeTTL says otherwise, so
// that a new active coordinator does not move PChannels of nodes it has
// not heard from yet. None of them counts as served until its owner
// confirms it: a heartbeat of another session is a new incarnation that
// serves nothing of the old one's, and one of the same session must list
// the PChannel under its term.
func (ctl *control) seedMembers() {
	for _, a := range ctl.channels {
		if a.Node == "" || a.State != wire.Assigned {
			continue
		}
		id := streamwal.NodeID(a.Node)
		if _, ok := ctl.nodes[id]; !ok {
			ctl.nodes[id] = &member{session: a.Session, lastSeen: time.Now()}
		}
	}
}

// pchannelNames are the cluster's PChannels: the persisted view's, or the
// configured ones for a new cluster.
func (ctl *control) pchannelNames() ([]string, error) {
	if len(ctl.view.Channels) > 0 {
		var out []string
		for _, a := range ctl.view.Channels {
			out = append(out, a.PChannel)
		}
		return out, nil
	}
	ps, err := streamwal.PChannels(ctl.t.c.cfg.Prefix, ctl.t.c.cfg.PChannels)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out, nil
}

// loadChannel loads and fences one PChannel's assignment.
func (ctl *control) loadChannel(ctx context.Context, name string) error {
	p, err := streamwal.ParsePChannel(name)
	if err != nil {
		return err
	}
	a := &wire.Assignment{PChannel: name, State: wire.Uninitialized}
	if _, err := ctl.assign.load(ctx, streamwal.AssignmentKey(p), a); err != nil {
		return err
	}
	if a.State == wire.Assigning {
		// The previous coordinator may never have told the node: assign
		// it again (under the next term) rather than wait for nothing.
		a.State, a.Node = wire.Unavailable, ""
	}
	// Served only once its owner confirms it to this coordinator.
	a.Serving, a.Since = false, time.Now().UTC()
	a.Epoch = ctl.t.epoch
	if err := ctl.assign.put(ctx, streamwal.AssignmentKey(p), a); err != nil {
		return err
	}
	ctl.channels = append(ctl.channels, a)
	ctl.byName[name] = a
	ctl.t.terms.set(name, a.Term)
	return nil
}

// loadAllocation loads and fences the VChannel allocation, placing the
// CChannel on the first PChannel when the cluster is new.
func (ctl *control) loadAllocation(ctx context.Context, first string) error {
	if _, err := ctl.vchan.load(ctx, streamwal.KeyCollections, &ctl.alloc); err != nil {
		return err
	}
	if ctl.alloc.CChannel == "" {
		p, err := streamwal.ParsePChannel(first)
		if err != nil {
			return err
		}
		ctl.alloc.CChannel = p.CChannel().String()
	}
	if ctl.alloc.Collections == nil {
		ctl.alloc.Collections = map[string][]string{}
	}
	ctl.alloc.Epoch = ctl.t.epoch
	if err := ctl.vchan.put(ctx, streamwal.KeyCollections, ctl.alloc); err != nil {
		return err
	}
	ctl.countVChannels()
	return nil
}

// countVChannels recomputes each PChannel's VChannel count.
func (ctl *control) countVChannels() {
	for _, a := range ctl.channels {
		a.VChannels = 0
	}
	for _, vs := range ctl.alloc.Collections {
		for _, name := range vs {
			if v, err := streamwal.ParseVChannel(name); err == nil {
				if a := ctl.byName[v.PChannel().String()]; a != nil {
					a.VChannels++
				}
			}
		}
	}
}

// publish writes the view.
func (ctl *control) publish(ctx context.Context) error {
	v := &ctl.view
	v.Version++
	v.CChannel = ctl.alloc.CChannel
	v.Channels = v.Channels[:0]
	for _, a := range ctl.channels {
		v.Channels = append(v.Channels, *a)
	}
	v.Nodes = v.Nodes[:0]
	for id := range ctl.nodes {
		v.Nodes = append(v.Nodes, string(id))
	}
	slices.Sort(v.Nodes)
	return ctl.assign.put(ctx, streamwal.KeyView, v)
}

// run is the loop: membership events, health checks, balance rounds,
// operation results and calls from handlers.
func (ctl *control) run() {
	cfg := ctl.t.c.cfg
	health := time.NewTicker(cfg.NodeTTL / 4)
	defer health.Stop()
	bal := time.NewTicker(cfg.BalanceInterval)
	defer bal.Stop()
	for {
		select {
		case <-ctl.t.ctx.Done():
			return
		case ev := <-ctl.events:
			ctl.onNode(ev)
		case <-health.C:
			ctl.checkHealth()
			ctl.noteStuck()
		case <-bal.C:
			ctl.rebalance = true
		case r := <-ctl.results:
			ctl.onResult(r)
		case f := <-ctl.calls:
			f()
		}
		ctl.schedule()
	}
}

// call runs f in the loop and waits for it.
func (ctl *control) call(ctx context.Context, f func()) error {
	done := make(chan struct{})
	select {
	case ctl.calls <- func() { f(); close(done) }:
	case <-ctx.Done():
		return streamwal.Errorf(streamwal.CodeUnavailable, "coordinator busy: %v", ctx.Err())
	}
	<-done
	return nil
}

// onNode applies a membership event.
func (ctl *control) onNode(ev nodeEvent) {
	m := ctl.nodes[ev.id]
	log := ctl.t.log.With().Str("node", string(ev.id)).Logger()
	switch {
	case ev.record == nil:
		if m != nil {
			log.Info().Str("session", m.session).Msg("node left")
			ctl.lose(ev.id)
		}
	case m == nil:
		log.Info().Str("session", ev.record.Session).Msg("node joined")
		ctl.join(ev)
	case m.session != "" && m.session != ev.record.Session:
		// A new incarnation under the same ID: whatever the old one
		// served, this one serves none of it until it opens it again
		// under a new term.
		log.Info().Str("session", ev.record.Session).Str("previous_session", m.session).Msg("node restarted")
		ctl.lose(ev.id)
		ctl.join(ev)
	default:
		if m.session == "" {
			log.Info().Str("session", ev.record.Session).Msg("node session learned")
		}
		m.heardFrom(ev.record)
		ctl.verify(ev.id, m, !ev.replayed)
	}
}

// join adds a node in the session its record names.
func (ctl *control) join(ev nodeEvent) {
	m := newMember(ev.record)
	ctl.nodes[ev.id] = m
	ctl.rebalance = true
	ctl.verify(ev.id, m, !ev.replayed)
	ctl.save(nil)
}

// verify compares the PChannels assigned to a node with what its last
// heartbeat says it serves. One it lists under the assigned term is
// served (when the heartbeat is live); one it does not list although the
// heartbeat is at least as new as the open that confirmed it, or one
// confirmed by another session, is not served and is reassigned.
func (ctl *control) verify(id streamwal.NodeID, m *member, live bool) {
	for _, a := range ctl.channels {
		if a.Node != string(id) || a.State != wire.Assigned || ctl.busy[a.PChannel] != nil {
			continue
		}
		term, listed := m.serving[a.PChannel]
		switch {
		case a.Session != "" && a.Session != m.session:
			ctl.reopen(a, "confirmed by an earlier incarnation of its owner")
		case listed && term == a.Term:
			if a.Session == "" {
				a.Session = m.session
			}
			if live {
				ctl.setServing(a, true)
			}
		case m.version >= a.Version:
			ctl.reopen(a, "its owner no longer serves it")
		}
	}
}

// reopen gives up an ASSIGNED PChannel its owner does not serve, so that
// the scheduler assigns it again under the next term.
func (ctl *control) reopen(a *wire.Assignment, why string) {
	ctl.t.log.Warn().Str("pchannel", a.PChannel).Str("node", a.Node).Uint64("term", a.Term).Msg("reassigning: " + why)
	ctl.setState(a, "", wire.Unavailable)
	ctl.rebalance = true
}

// checkHealth declares dead the nodes unheard for NodeTTL, and gives up
// the PChannels whose owner did not confirm them within the open timeout.
func (ctl *control) checkHealth() {
	for id, m := range ctl.nodes {
		if time.Since(m.lastSeen) > ctl.t.c.cfg.NodeTTL {
			ctl.t.log.Warn().Str("node", string(id)).Str("session", m.session).Msg("node dead")
			ctl.lose(id)
		}
	}
	timeout := ctl.t.c.cfg.OpenTimeout
	warnAfter := min(timeout, unservedWarning)
	for _, a := range ctl.channels {
		if a.Serving {
			delete(ctl.warned, a.PChannel)
			continue
		}
		unserved := time.Since(a.Since)
		if a.State == wire.Assigned && ctl.busy[a.PChannel] == nil && unserved > timeout {
			ctl.reopen(a, "its owner did not confirm it within the open timeout")
		}
		if w, ok := ctl.warned[a.PChannel]; unserved > warnAfter && (!ok || time.Since(w) > warnAfter) {
			ctl.warned[a.PChannel] = time.Now()
			ctl.t.log.Warn().Str("pchannel", a.PChannel).Str("state", string(a.State)).Str("node", a.Node).
				Uint64("term", a.Term).Dur("unserved_for", unserved.Round(time.Millisecond)).Int("nodes", len(ctl.nodes)).
				Msg("pchannel not serving")
		}
	}
}

// lose removes a node and makes its PChannels UNAVAILABLE; opens under
// way on it are cancelled (their results then fail), so that a node lost
// during a long replay does not hold its PChannels for the open timeout.
func (ctl *control) lose(id streamwal.NodeID) {
	delete(ctl.nodes, id)
	for _, a := range ctl.channels {
		if a.Node != string(id) {
			continue
		}
		if cancel := ctl.busy[a.PChannel]; cancel != nil {
			cancel()
			continue
		}
		ctl.setState(a, "", wire.Unavailable)
	}
	ctl.rebalance = true
	ctl.save(nil)
}

// setServing records whether a PChannel's owner confirmed it, persisting
// a change.
func (ctl *control) setServing(a *wire.Assignment, serving bool) {
	if a.Serving == serving {
		return
	}
	ctl.markServing(a, serving)
	ctl.put(a)
}

// markServing changes Serving and its Since in memory; a confirmed
// PChannel has no open error any more.
func (ctl *control) markServing(a *wire.Assignment, serving bool) {
	if a.Serving != serving {
		a.Serving, a.Since = serving, time.Now().UTC()
	}
	if serving {
		a.Error = ""
	}
}

// setState changes an assignment in memory and persists it; any state
// but ASSIGNED is not served.
func (ctl *control) setState(a *wire.Assignment, node string, s wire.State) {
	a.Node, a.State = node, s
	if s != wire.Assigned {
		ctl.markServing(a, false)
		a.Session, a.Version = "", 0
	}
	ctl.put(a)
}

// put persists an assignment and publishes the view.
func (ctl *control) put(a *wire.Assignment) {
	p, _ := streamwal.ParsePChannel(a.PChannel)
	ctl.save(ctl.assign.put(ctl.t.ctx, streamwal.AssignmentKey(p), a))
	ctl.noteAssign(a)
}

// save handles the outcome of a persisted change, publishing the view.
func (ctl *control) save(err error) {
	if err == nil {
		err = ctl.publish(ctl.t.ctx)
	}
	switch {
	case errors.Is(err, errDeposed):
		ctl.t.depose()
	case err != nil && ctl.t.ctx.Err() == nil:
		ctl.t.log.Error().Err(err).Msg("persist")
	}
}

// schedule assigns every PChannel without a live owner and, when a
// rebalance is due, moves PChannels for balance.
func (ctl *control) schedule() {
	if ctl.t.isDeposed() || len(ctl.nodes) == 0 {
		return
	}
	var nodes []balance.Node
	for id := range ctl.nodes {
		nodes = append(nodes, balance.Node{ID: id})
	}
	var chans []balance.Channel
	for _, a := range ctl.channels {
		p, _ := streamwal.ParsePChannel(a.PChannel)
		chans = append(chans, balance.Channel{PChannel: p, Owner: streamwal.NodeID(a.Node), VChannels: a.VChannels})
	}
	rebalance := ctl.rebalance
	ctl.rebalance = false
	for _, mv := range ctl.t.c.cfg.Policy.Plan(nodes, chans) {
		name := mv.PChannel.String()
		if ctl.busy[name] != nil || mv.From != "" && !rebalance || time.Now().Before(ctl.retry[name].after) {
			continue
		}
		ctl.start(ctl.byName[name], mv.From, mv.To)
	}
}

// start begins an assignment: the next term is persisted as ASSIGNING,
// and the oracle refuses the earlier terms' owners, before the node hears
// of it.
func (ctl *control) start(a *wire.Assignment, from, to streamwal.NodeID) {
	oldTerm := a.Term
	a.Term++
	ctl.t.terms.set(a.PChannel, a.Term)
	ctl.setState(a, string(to), wire.Assigning)
	if ctl.t.isDeposed() {
		return
	}
	ctx, cancel := context.WithCancel(ctl.t.ctx)
	ctl.busy[a.PChannel] = cancel
	ctl.t.log.Info().Str("pchannel", a.PChannel).Str("from", string(from)).Str("to", string(to)).Uint64("term", a.Term).Msg("assign")
	req := wire.OpenRequest{PChannel: a.PChannel, Term: a.Term, Timeout: ctl.t.c.cfg.OpenTimeout}
	ctl.t.wg.Add(1)
	go func() {
		defer ctl.t.wg.Done()
		defer cancel()
		r := ctl.assignOn(ctx, from, to, oldTerm, req)
		select {
		case ctl.results <- r:
		case <-ctl.t.ctx.Done():
		}
	}()
}

// assignOn closes the WAL on the old owner (if it is still alive; its
// barrier fences it anyway) and opens it on the new one.
func (ctl *control) assignOn(ctx context.Context, from, to streamwal.NodeID, oldTerm uint64, req wire.OpenRequest) opResult {
	cfg := ctl.t.c.cfg
	nc := cfg.Conn
	if from != "" {
		closeCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := wire.Call(closeCtx, nc, cfg.Cluster.NodeSubject(from, streamwal.NodeClose), wire.CloseRequest{PChannel: req.PChannel, Term: oldTerm}, nil)
		cancel()
		if err != nil {
			ctl.t.log.Debug().Err(err).Str("pchannel", req.PChannel).Msg("close on the old owner")
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.OpenTimeout)
	defer cancel()
	r := opResult{pchannel: req.PChannel, node: string(to), term: req.Term}
	r.err = wire.Call(ctx, nc, cfg.Cluster.NodeSubject(to, streamwal.NodeOpen), req, &r.reply)
	return r
}

// onResult completes an assignment: the PChannel is ASSIGNED and served
// once the owner's current session confirmed it.
func (ctl *control) onResult(r opResult) {
	if cancel := ctl.busy[r.pchannel]; cancel != nil {
		cancel()
	}
	delete(ctl.busy, r.pchannel)
	a := ctl.byName[r.pchannel]
	if a == nil || a.Term != r.term || a.Node != r.node {
		return
	}
	log := ctl.t.log.With().Str("pchannel", r.pchannel).Str("node", r.node).Uint64("term", r.term).Logger()
	m, alive := ctl.nodes[streamwal.NodeID(r.node)]
	switch {
	case r.err != nil:
		next := retry{delay: min(max(2*ctl.retry[r.pchannel].delay, retryFirst), retryMax)}
		next.after = time.Now().Add(next.delay)
		ctl.retry[r.pchannel] = next
		log.Warn().Err(r.err).Dur("retry_in", next.delay).Msg("assignment failed")
		a.Error = r.err.Error()
		ctl.setState(a, "", wire.Unavailable)
		return
	case !alive:
		log.Warn().Msg("assignment confirmed by a node since lost")
		ctl.setState(a, "", wire.Unavailable)
		return
	case m.session != "" && r.reply.Session != m.session:
		log.Warn().Str("session", r.reply.Session).Str("live_session", m.session).Msg("assignment confirmed by an incarnation since replaced")
		ctl.setState(a, "", wire.Unavailable)
		return
	}
	delete(ctl.retry, r.pchannel)
	a.Session, a.Version = r.reply.Session, r.reply.Version
	ctl.markServing(a, true)
	ctl.setState(a, r.node, wire.Assigned)
	log.Info().Str("session", a.Session).Uint64("barrier", uint64(r.reply.Barrier)).Msg("assigned")
	// A heartbeat newer than the open may already say otherwise.
	ctl.verify(streamwal.NodeID(r.node), m, false)
	// A round moves at most MaxMoves PChannels: go on until the plan is
	// empty (the policy's tolerance keeps it from flapping).
	ctl.rebalance = true
}

// watchNodes feeds membership events to the loop.
func (ctl *control) watchNodes() {
	kv := ctl.t.c.buckets[streamwal.BucketNodes]
	w, err := kv.WatchAll(ctl.t.ctx)
	if err != nil {
		ctl.t.log.Error().Err(err).Msg("watch nodes")
		return
	}
	defer func() { _ = w.Stop() }()
	replaying := true
	for {
		select {
		case <-ctl.t.ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				replaying = false // the values found at start are through
				continue
			}
			ev, ok := decodeNodeEvent(e)
			if !ok {
				continue
			}
			ev.replayed = replaying
			select {
			case ctl.events <- ev:
			case <-ctl.t.ctx.Done():
				return
			}
		}
	}
}

// decodeNodeEvent reads a nodes-bucket entry.
func decodeNodeEvent(e njs.KeyValueEntry) (nodeEvent, bool) {
	var rec wire.NodeRecord
	if e.Operation() == njs.KeyValuePut {
		if err := wire.Decode(e.Value(), &rec); err != nil {
			return nodeEvent{}, false
		}
		id, err := streamwal.ParseNodeID(rec.Node)
		if err != nil {
			return nodeEvent{}, false
		}
		return nodeEvent{id: id, record: &rec}, true
	}
	const prefix = "node."
	key := e.Key()
	if len(key) <= len(prefix) {
		return nodeEvent{}, false
	}
	id, err := streamwal.ParseNodeID(key[len(prefix):])
	if err != nil {
		return nodeEvent{}, false
	}
	return nodeEvent{id: id}, true
}

// handleAllocate places a new collection's VChannels on the PChannels
// with the fewest, or returns the ones it already has.
func (ctl *control) handleAllocate(ctx context.Context, data []byte) (any, error) {
	var req wire.AllocateRequest
	if err := wire.Decode(data, &req); err != nil {
		return nil, err
	}
	if req.Lookup {
		req.Shards = 1
	}
	if req.CollectionID <= 0 || req.Shards <= 0 || req.Shards > len(ctl.channels) {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "allocate collection %d with %d shards: want a positive id and 1 to %d shards", req.CollectionID, req.Shards, len(ctl.channels))
	}
	var reply wire.AllocateReply
	var err error
	if cerr := ctl.call(ctx, func() { reply, err = ctl.allocate(req) }); cerr != nil {
		return nil, cerr
	}
	return reply, err
}

// allocate runs in the loop.
func (ctl *control) allocate(req wire.AllocateRequest) (wire.AllocateReply, error) {
	key := strconv.FormatInt(req.CollectionID, 10)
	name := ""
	if req.Name != "" {
		name = req.DBName + "." + req.Name
	}
	if vs, ok := ctl.alloc.Collections[key]; ok {
		if err := sameName(req.CollectionID, ctl.alloc.Names[key], name); err != nil {
			return wire.AllocateReply{}, err
		}
		return wire.AllocateReply{VChannels: vs}, nil
	}
	if have, dropped := ctl.alloc.Dropped[key]; dropped {
		if err := sameName(req.CollectionID, have, name); err != nil {
			return wire.AllocateReply{}, err
		}
		if !req.Lookup {
			return wire.AllocateReply{}, streamwal.Errorf(streamwal.CodeLifecycle, "collection %d: %w (collection IDs are never reused)", req.CollectionID, streamwal.ErrCollectionDropped)
		}
		return wire.AllocateReply{Dropped: true}, nil
	}
	if req.Lookup {
		return wire.AllocateReply{}, nil
	}
	if err := ctl.nameFree(req.CollectionID, name); err != nil {
		return wire.AllocateReply{}, err
	}
	order := slices.Clone(ctl.channels)
	slices.SortStableFunc(order, func(a, b *wire.Assignment) int { return a.VChannels - b.VChannels })
	var vs []string
	for shard := range req.Shards {
		p, err := streamwal.ParsePChannel(order[shard].PChannel)
		if err != nil {
			return wire.AllocateReply{}, err
		}
		v, err := p.VChannel(req.CollectionID, shard)
		if err != nil {
			return wire.AllocateReply{}, err
		}
		vs = append(vs, v.String())
	}
	ctl.alloc.Collections[key] = vs
	if name != "" {
		if ctl.alloc.Names == nil {
			ctl.alloc.Names = map[string]string{}
		}
		ctl.alloc.Names[key] = name
	}
	if err := ctl.vchan.put(ctl.t.ctx, streamwal.KeyCollections, ctl.alloc); err != nil {
		delete(ctl.alloc.Collections, key)
		delete(ctl.alloc.Names, key)
		ctl.save(err)
		return wire.AllocateReply{}, err
	}
	ctl.countVChannels()
	ctl.save(nil)
	return wire.AllocateReply{VChannels: vs}, nil
}

// sameName refuses a request that names collection id otherwise than it
// was allocated (either name may be unknown: "").
func sameName(id int64, have, name string) error {
	if name != "" && have != "" && have != name {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "collection %d is %s, not %s", id, have, name)
	}
	return nil
}

// nameFree refuses a new collection id whose name ("<db>.<name>", or ""
// when unknown) a live collection already has: a name may be taken again
// once its collection is dropped, never while it lives.
func (ctl *control) nameFree(id int64, name string) error {
	if name == "" {
		return nil
	}
	for key, have := range ctl.alloc.Names {
		if have == name {
			if _, live := ctl.alloc.Collections[key]; live {
				return streamwal.Errorf(streamwal.CodeInvalidArgument, "collection %d: the name %s is taken by collection %s", id, name, key)
			}
		}
	}
	return nil
}

// handleRelease forgets a dropped collection's VChannels.
func (ctl *control) handleRelease(ctx context.Context, data []byte) (any, error) {
	var req wire.ReleaseRequest
	if err := wire.Decode(data, &req); err != nil {
		return nil, err
	}
	var err error
	if cerr := ctl.call(ctx, func() { err = ctl.release(req.CollectionID) }); cerr != nil {
		return nil, cerr
	}
	return nil, err
}

// release runs in the loop; releasing an unknown collection is a no-op.
func (ctl *control) release(id int64) error {
	key := strconv.FormatInt(id, 10)
	vs, ok := ctl.alloc.Collections[key]
	if !ok {
		return nil
	}
	name := ctl.alloc.Names[key]
	delete(ctl.alloc.Collections, key)
	delete(ctl.alloc.Names, key)
	if ctl.alloc.Dropped == nil {
		ctl.alloc.Dropped = map[string]string{}
	}
	ctl.alloc.Dropped[key] = name
	if err := ctl.vchan.put(ctl.t.ctx, streamwal.KeyCollections, ctl.alloc); err != nil {
		ctl.alloc.Collections[key] = vs
		if name != "" {
			ctl.alloc.Names[key] = name
		}
		delete(ctl.alloc.Dropped, key)
		ctl.save(err)
		return err
	}
	ctl.countVChannels()
	ctl.save(nil)
	return nil
}

// handleBalance runs a balance round now and returns the view.
func (ctl *control) handleBalance(ctx context.Context, _ []byte) (any, error) {
	var v wire.View
	if err := ctl.call(ctx, func() { ctl.rebalance = true; ctl.schedule(); v = ctl.snapshot() }); err != nil {
		return nil, err
	}
	return v, nil
}

// handleStatus returns the view.
func (ctl *control) handleStatus(ctx context.Context, _ []byte) (any, error) {
	var v wire.View
	if err := ctl.call(ctx, func() { v = ctl.snapshot() }); err != nil {
		return nil, err
	}
	return v, nil
}

// snapshot copies the view.
func (ctl *control) snapshot() wire.View {
	v := ctl.view
	v.Channels = slices.Clone(v.Channels)
	v.Nodes = slices.Clone(v.Nodes)
	return v
}
