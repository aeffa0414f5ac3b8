package coord

import (
	"context"
	"errors"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/coord/assign"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

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

// control is the I/O shell of the coordinator's assignment state machine
// (package assign): its loop steps the machine with membership events,
// health checks, balance rounds, open outcomes and handlers' calls, each
// at the time it happens, and carries out the effects, persisting with
// compare-and-set, sending opens and closes, logging and reporting. Only
// its loop goroutine touches the machine; handlers hand it closures
// through calls.
type control struct {
	t      *tenure
	m      *assign.Machine
	assign *store
	vchan  *store
	// names are the PChannels, fixed at creation; alloc is the allocation
	// as the takeover found it, of which only the CChannel (fixed for the
	// cluster's life) is read.
	names   []string
	alloc   wire.Collections
	opens   map[streamwal.PChannel]context.CancelFunc // under way, cancelled when their node is lost
	events  chan nodeEvent
	results chan assign.Event
	calls   chan func()
	// lastCall numbers the machine's calls; replies holds their answers
	// until the call that stepped them takes them.
	lastCall uint64
	replies  map[uint64]assign.Reply
	// deposed: the machine was told that the tenure is deposed.
	deposed bool
	// stuckWarned is when stuck broadcasts were last warned of.
	stuckWarned time.Time
}

// newControl loads and fences the persisted state.
func newControl(ctx context.Context, t *tenure) (*control, error) {
	c := t.c
	ctl := &control{t: t, assign: newStore(c.buckets[streamwal.BucketAssignments]), vchan: newStore(c.buckets[streamwal.BucketVChannels]),
		opens: map[streamwal.PChannel]context.CancelFunc{}, replies: map[uint64]assign.Reply{},
		events: make(chan nodeEvent, 64), results: make(chan assign.Event, 64), calls: make(chan func())}
	ctl.m = assign.New(assign.Config{Epoch: t.epoch, Leader: c.cfg.ID, NodeTTL: c.cfg.NodeTTL, OpenTimeout: c.cfg.OpenTimeout,
		UnservedWarning: unservedWarning, Policy: *c.cfg.Policy})
	ev, err := ctl.load(ctx)
	if err != nil {
		return nil, err
	}
	if err := ctl.carry(ctx, ctl.m.Step(time.Now(), ev)); err != nil {
		return nil, err
	}
	for _, p := range ctl.m.PChannels() {
		ctl.names = append(ctl.names, p.String())
	}
	ctl.alloc.CChannel = ctl.m.View().CChannel
	return ctl, nil
}

// load reads the persisted view, each PChannel's assignment and the
// VChannel allocation.
func (ctl *control) load(ctx context.Context) (assign.Takeover, error) {
	var ev assign.Takeover
	if _, err := ctl.assign.load(ctx, streamwal.KeyView, &ev.View); err != nil {
		return ev, err
	}
	ps, err := ctl.pchannels(ev.View)
	if err != nil {
		return ev, err
	}
	for _, p := range ps {
		a := wire.Assignment{PChannel: p.String(), State: wire.Uninitialized}
		if _, err := ctl.assign.load(ctx, streamwal.AssignmentKey(p), &a); err != nil {
			return ev, err
		}
		a.PChannel = p.String()
		_, rec, err := assign.FromWire(a)
		if err != nil {
			return ev, streamwal.Errorf(streamwal.CodeUnrecoverable, "load %s: %v", streamwal.AssignmentKey(p), err)
		}
		ev.Channels = append(ev.Channels, assign.Loaded{PChannel: p, Record: rec})
	}
	if _, err := ctl.vchan.load(ctx, streamwal.KeyCollections, &ev.Collections); err != nil {
		return ev, err
	}
	return ev, nil
}

// pchannels are the cluster's PChannels: the persisted view's, or the
// configured ones for a new cluster.
func (ctl *control) pchannels(v wire.View) ([]streamwal.PChannel, error) {
	if len(v.Channels) == 0 {
		return streamwal.PChannels(ctl.t.c.cfg.Prefix, ctl.t.c.cfg.PChannels)
	}
	out := make([]streamwal.PChannel, 0, len(v.Channels))
	for _, a := range v.Channels {
		p, err := streamwal.ParsePChannel(a.PChannel)
		if err != nil {
			return nil, streamwal.Errorf(streamwal.CodeUnrecoverable, "the persisted view names a pchannel %q: %v", a.PChannel, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// run is the loop: membership events, health checks, balance rounds,
// open outcomes and calls from handlers.
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
			ctl.step(ev.step())
		case <-health.C:
			ctl.step(assign.HealthCheck{})
			ctl.noteStuck()
		case <-bal.C:
			ctl.step(assign.Balance{})
		case r := <-ctl.results:
			ctl.ended(r)
			ctl.step(r)
		case f := <-ctl.calls:
			f()
		}
	}
}

// step steps the machine with ev, now, and carries out its effects; a
// deposition the tenure noticed is told first.
func (ctl *control) step(ev assign.Event) {
	if !ctl.deposed && ctl.t.isDeposed() {
		ctl.deposed = true
		_ = ctl.carry(ctl.t.ctx, ctl.m.Step(time.Now(), assign.Deposed{}))
	}
	// A failed persist is logged (answer) and left to the machine.
	_ = ctl.carry(ctl.t.ctx, ctl.m.Step(time.Now(), ev))
}

// request steps a call's event and returns its reply.
func (ctl *control) request(ev func(call uint64) assign.Event) assign.Reply {
	ctl.lastCall++
	call := ctl.lastCall
	ctl.step(ev(call))
	r := ctl.replies[call]
	delete(ctl.replies, call)
	return r
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

// carry carries out effects in order, each persist's answer (and what
// follows from it) before the next effect, and returns the first persist
// that failed.
func (ctl *control) carry(ctx context.Context, effects []assign.Effect) error {
	var first error
	failed := func(err error) {
		if first == nil {
			first = err
		}
	}
	for _, e := range effects {
		switch e := e.(type) {
		case assign.PersistAssignment:
			failed(ctl.answer(ctx, e.Rev, ctl.assign.put(ctx, streamwal.AssignmentKey(e.PChannel), e.Assignment)))
		case assign.PersistCollections:
			failed(ctl.answer(ctx, e.Rev, ctl.vchan.put(ctx, streamwal.KeyCollections, e.Collections)))
		case assign.PublishView:
			failed(ctl.answer(ctx, e.Rev, ctl.assign.put(ctx, streamwal.KeyView, e.View)))
		case assign.Fence:
			ctl.t.terms.set(e.PChannel, e.Term)
		case assign.Open:
			ctl.open(e)
		case assign.CancelOpen:
			if cancel := ctl.opens[e.PChannel]; cancel != nil {
				cancel()
			}
		case assign.Report:
			ctl.report(e)
		case assign.Reply:
			ctl.replies[e.Call] = e
		case assign.Log:
			ctl.log(e)
		}
	}
	return first
}

// answer steps the answer to persist rev, which ended with err, and
// carries out its effects; it returns err, or the first persist of those
// effects that failed. A refused write deposes the tenure.
func (ctl *control) answer(ctx context.Context, rev assign.Rev, err error) error {
	if err == nil {
		return ctl.carry(ctx, ctl.m.Step(time.Now(), assign.Persisted{Rev: rev}))
	}
	deposed := errors.Is(err, errDeposed)
	switch {
	case deposed:
		ctl.t.depose()
	case ctx.Err() == nil:
		ctl.t.log.Error().Err(err).Msg("persist")
	}
	_ = ctl.carry(ctx, ctl.m.Step(time.Now(), assign.PersistFailed{Rev: rev, Err: err, Deposed: deposed}))
	return err
}

// open starts an assignment's open (after the close on the previous
// owner) in its own goroutine, whose outcome comes back through results.
func (ctl *control) open(o assign.Open) {
	ctx, cancel := context.WithCancel(ctl.t.ctx)
	ctl.opens[o.PChannel] = cancel
	ctl.t.wg.Add(1)
	go func() {
		defer ctl.t.wg.Done()
		defer cancel()
		r := ctl.openOn(ctx, o)
		select {
		case ctl.results <- r:
		case <-ctl.t.ctx.Done():
		}
	}()
}

// openOn closes the WAL on the old owner (if it is still alive; its
// barrier fences it anyway) and opens it on the new one.
func (ctl *control) openOn(ctx context.Context, o assign.Open) assign.Event {
	cfg := ctl.t.c.cfg
	nc := cfg.Conn
	if o.Close != nil {
		closeCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := wire.Call(closeCtx, nc, cfg.Cluster.NodeSubject(o.Close.Node, streamwal.NodeClose), wire.CloseRequest{PChannel: o.PChannel, Term: o.Close.Term}, nil)
		cancel()
		if err != nil {
			ctl.t.log.Debug().Err(err).Str("pchannel", o.PChannel.String()).Msg("close on the old owner")
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.OpenTimeout)
	defer cancel()
	var reply wire.OpenReply
	req := wire.OpenRequest{PChannel: o.PChannel, Term: o.Term, Timeout: cfg.OpenTimeout}
	if err := wire.Call(ctx, nc, cfg.Cluster.NodeSubject(o.Node, streamwal.NodeOpen), req, &reply); err != nil {
		return assign.OpenFailed{PChannel: o.PChannel, Node: o.Node, Term: o.Term, Err: err}
	}
	return assign.OpenConfirmed{PChannel: o.PChannel, Node: o.Node, Term: o.Term, Session: reply.Session, Version: reply.Version, Barrier: reply.Barrier}
}

// ended forgets the open an outcome ends.
func (ctl *control) ended(r assign.Event) {
	var p streamwal.PChannel
	switch r := r.(type) {
	case assign.OpenConfirmed:
		p = r.PChannel
	case assign.OpenFailed:
		p = r.PChannel
	}
	if cancel := ctl.opens[p]; cancel != nil {
		cancel()
	}
	delete(ctl.opens, p)
}

// report reports a change of an assignment.
func (ctl *control) report(r assign.Report) {
	if hooks := ctl.t.c.cfg.Hooks; len(hooks) > 0 {
		hooks.OnAssign(telemetry.AssignEvent{PChannel: r.PChannel, Node: string(r.Node), Term: r.Term, State: string(r.State), Serving: r.Serving})
	}
}

// log writes a log line of the machine's.
func (ctl *control) log(l assign.Log) {
	level := zerolog.InfoLevel
	if l.Level == assign.Warn {
		level = zerolog.WarnLevel
	}
	ev := ctl.t.log.WithLevel(level)
	for _, f := range l.Fields {
		switch v := f.Value.(type) {
		case string:
			ev = ev.Str(f.Key, v)
		case streamwal.NodeID:
			ev = ev.Str(f.Key, string(v))
		case streamwal.PChannel:
			ev = ev.Str(f.Key, v.String())
		case uint64:
			ev = ev.Uint64(f.Key, v)
		case int:
			ev = ev.Int(f.Key, v)
		case time.Duration:
			ev = ev.Dur(f.Key, v)
		case error:
			ev = ev.AnErr(f.Key, v)
		default:
			ev = ev.Interface(f.Key, v)
		}
	}
	ev.Msg(l.Msg)
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

// step is the machine's event of a membership change. A served
// PChannel whose name does not parse is not one of the cluster's: it is
// left out.
func (ev nodeEvent) step() assign.Event {
	if ev.record == nil {
		return assign.NodeGone{Node: ev.id}
	}
	serving := make(map[streamwal.PChannel]uint64, len(ev.record.Serving))
	for _, s := range ev.record.Serving {
		if p, err := streamwal.ParsePChannel(s.PChannel); err == nil {
			serving[p] = s.Term
		}
	}
	return assign.NodeSeen{Node: ev.id, Session: ev.record.Session, Version: ev.record.Version, Serving: serving, Replayed: ev.replayed}
}

// handleAllocate places a new collection's VChannels on the PChannels
// with the fewest, or returns the ones it already has.
func (ctl *control) handleAllocate(ctx context.Context, req wire.AllocateRequest) (wire.AllocateReply, error) {
	var r assign.Reply
	if cerr := ctl.call(ctx, func() {
		r = ctl.request(func(call uint64) assign.Event { return assign.Allocate{Call: call, Request: req} })
	}); cerr != nil {
		return wire.AllocateReply{}, cerr
	}
	return r.Allocate, r.Err
}

// handleRelease forgets a dropped collection's VChannels.
func (ctl *control) handleRelease(ctx context.Context, req wire.ReleaseRequest) (wire.None, error) {
	var err error
	if cerr := ctl.call(ctx, func() { err = ctl.release(req.CollectionID) }); cerr != nil {
		return wire.None{}, cerr
	}
	return wire.None{}, err
}

// release runs in the loop; releasing an unknown collection is a no-op.
func (ctl *control) release(id int64) error {
	return ctl.request(func(call uint64) assign.Event { return assign.Release{Call: call, CollectionID: id} }).Err
}

// handleBalance runs a balance round now and returns the view.
func (ctl *control) handleBalance(ctx context.Context, _ []byte) (any, error) {
	var v wire.View
	if err := ctl.call(ctx, func() { ctl.step(assign.Balance{}); v = ctl.m.View() }); err != nil {
		return nil, err
	}
	return v, nil
}

// handleStatus returns the view.
func (ctl *control) handleStatus(ctx context.Context, _ []byte) (any, error) {
	var v wire.View
	if err := ctl.call(ctx, func() { v = ctl.m.View() }); err != nil {
		return nil, err
	}
	return v, nil
}
