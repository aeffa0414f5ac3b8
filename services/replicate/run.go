package replicate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// Run replicates into cfg.Target whenever the topology of its log makes
// its cluster a secondary, until ctx ends. It returns an error only for
// a bad configuration.
func Run(ctx context.Context, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	p := cfg.Target.PChannel()
	r := &replicator{cfg: cfg, self: cfg.Codec.Cluster(), p: p,
		log:     cfg.Logger.With().Str("component", "replicator").Str("pchannel", p.String()).Logger(),
		reports: telemetry.Has[telemetry.ReplicationHook](cfg.Hooks),
		traces:  telemetry.Has[telemetry.ReplicateAppendHook](cfg.Hooks)}
	var wg sync.WaitGroup
	wg.Go(func() { r.publishLoop(ctx) })
	r.loop(ctx)
	wg.Wait()
	r.setActive(false)
	return nil
}

// replicator replicates into one PChannel.
type replicator struct {
	cfg  Config
	self streamwal.Cluster
	p    streamwal.PChannel
	log  zerolog.Logger

	mu     sync.Mutex
	down   bool                     // cp.Error is linkDown's
	conns  uint64                   // connections to sources opened (the newest's number)
	cp     wire.ReplicateCheckpoint // as it stands
	dirty  bool                     // cp differs from the record published
	pub    wire.ReplicateCheckpoint // as last published
	pubAt  time.Time                // when
	loaded bool                     // cp was read back from the bucket

	kvMu sync.Mutex
	kv   njs.KeyValue // the replication bucket, once opened

	// late: the last catch-up started too late (errStartedLate); the
	// next starts at the source's first message. Only the loop's
	// goroutine touches it.
	late bool

	reports, traces bool // a hook follows replication, re-appends
	active          bool // replicating for a secondary (under mu)
	reportMu        sync.Mutex
	reported        bool // the last event reported was active (under reportMu)
}

// loop runs attempts while the cluster is a secondary, waiting for a
// change of the topology while it is not, and pausing after a failed
// attempt.
func (r *replicator) loop(ctx context.Context) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = retryFirst, retryMax
	for ctx.Err() == nil {
		topo, ok, source, changed := r.cfg.Target.Replication()
		src, secondary := topo.Source(r.self)
		if !ok || !secondary {
			r.setActive(false)
			wait(ctx, changed, nil)
			continue
		}
		r.setActive(true)
		edge, _ := topo.Edge(r.self)
		actx, cancel := context.WithCancel(ctx)
		go r.follow(actx, cancel, src, changed)
		progressed, err := r.attempt(actx, src, edge, source)
		cancel()
		_, _, _, next := r.cfg.Target.Replication() // before the look: a change after it wakes the wait
		switch {
		case ctx.Err() != nil:
			return
		case r.redirected(src):
			bo.Reset()
			continue
		case progressed:
			bo.Reset()
		}
		if errors.Is(err, errStartedLate) {
			r.late = true
		}
		r.fail(err)
		wait(ctx, next, time.After(bo.NextBackOff()))
	}
}

// follow cancels the attempt replicating from src (cancel) when the
// topology stops making src this cluster's source, until ctx ends. A
// change that leaves the source as it is (another member added or
// removed) does not stop the attempt, nor does a topology older than the
// one in force, which the WAL ignores.
func (r *replicator) follow(ctx context.Context, cancel context.CancelFunc, src messages.ReplicateMember, changed <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		_, _, _, changed = r.cfg.Target.Replication() // before the look, as in loop
		if r.redirected(src) {
			cancel()
			return
		}
	}
}

// redirected reports whether the topology in force no longer makes src
// this cluster's source.
func (r *replicator) redirected(src messages.ReplicateMember) bool {
	topo, ok, _, _ := r.cfg.Target.Replication()
	cur, secondary := topo.Source(r.self)
	return !ok || !secondary || !sameMember(cur, src)
}

// sameMember reports whether a and b are the same member, reached the
// same way.
func sameMember(a, b messages.ReplicateMember) bool {
	return a.Cluster == b.Cluster && a.URL == b.URL && slices.Equal(a.PChannels, b.PChannels)
}

// wait blocks until ctx ends, changed is closed or after fires.
func wait(ctx context.Context, changed <-chan struct{}, after <-chan time.Time) {
	select {
	case <-ctx.Done():
	case <-changed:
	case <-after:
	}
}

// fail records why replication stopped.
func (r *replicator) fail(err error) {
	if err == nil {
		return
	}
	r.log.Warn().Err(err).Msg("replication attempt failed; retrying")
	r.mu.Lock()
	r.cp.Error, r.dirty, r.down = err.Error(), true, false
	r.mu.Unlock()
}

// linkDown records that the connection to member dropped (err nil: it
// was closed on purpose), so that the checkpoint record says why
// replication does not progress while the connection tries again: a
// reader waiting on a dropped connection fails nothing, and the lag alone
// would not say why it grows. Callbacks of an earlier connection than
// the newest (gen) change nothing: they come asynchronously, possibly
// after its replacement.
func (r *replicator) linkDown(gen uint64, member messages.ReplicateMember, err error) {
	if err == nil {
		return
	}
	r.log.Warn().Err(err).Str("source", string(member.Cluster)).Str("url", member.URL).Msg("connection to the source dropped; reconnecting")
	r.mu.Lock()
	if gen == r.conns {
		r.cp.Error, r.dirty, r.down = fmt.Sprintf("disconnected from %s at %s: %v", member.Cluster, member.URL, err), true, true
	}
	r.mu.Unlock()
}

// clearError clears the error of the record as the replicator
// progresses (under mu), except linkDown's: messages and watermarks
// already received go on arriving after the connection dropped, and only
// its return (linkUp) or a new attempt's connection clears that.
func (r *replicator) clearError() {
	if !r.down {
		r.cp.Error = ""
	}
}

// linkUp clears what linkDown recorded, once connection gen is back
// (or new).
func (r *replicator) linkUp(gen uint64) {
	r.mu.Lock()
	if r.down && gen == r.conns {
		r.cp.Error, r.dirty, r.down = "", true, false
	}
	r.mu.Unlock()
}

// source is a connection to the primary and a reader of its PChannel.
type source struct {
	member messages.ReplicateMember
	p      streamwal.PChannel
	codec  *messages.Codec
	nc     *nats.Conn
	be     *jetstream.JetStream
	// scope is what the attempt copies of the replicas the source holds.
	scope scope
}

// connect opens a connection to member and a backend on it.
func (r *replicator) connect(ctx context.Context, member messages.ReplicateMember) (*source, error) {
	idx := r.p.Index()
	if idx >= len(member.PChannels) {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "source %s lists %d pchannels, none of index %d", member.Cluster, len(member.PChannels), idx)
	}
	p, err := streamwal.ParsePChannel(member.PChannels[idx])
	if err != nil {
		return nil, err
	}
	codec, err := messages.NewCodec(member.Cluster, r.cfg.Codec.Registry())
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.conns++
	gen := r.conns
	r.mu.Unlock()
	opts := append([]nats.Option{nats.Name("streamwal-replicator-" + string(r.self) + "-" + r.p.String()),
		nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { r.linkDown(gen, member, err) }),
		nats.ReconnectHandler(func(*nats.Conn) { r.linkUp(gen) })}, r.cfg.ConnectOptions...)
	if r.cfg.SourceOptions != nil {
		opts = append(opts, r.cfg.SourceOptions(member.Cluster)...)
	}
	nc, err := nats.Connect(member.URL, opts...)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "connect to %s at %s: %v", member.Cluster, member.URL, err)
	}
	r.linkUp(gen)
	archived, err := hasArchive(ctx, nc, member.Cluster)
	if err != nil {
		nc.Close()
		return nil, err
	}
	be, err := jetstream.New(nc, codec, jetstream.Options{Archive: archived, Logger: r.log})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &source{member: member, p: p, codec: codec, nc: nc, be: be}, nil
}

// hasArchive reports whether cluster c keeps an archive (of what its
// truncation removed) that a read below its streams' first message goes
// to; a backend that archives would create it, and a reader must not.
func hasArchive(ctx context.Context, nc *nats.Conn, c streamwal.Cluster) (bool, error) {
	js, err := njs.New(nc)
	if err != nil {
		return false, streamwal.Errorf(streamwal.CodeUnavailable, "jetstream of %s: %v", c, err)
	}
	_, err = js.ObjectStore(ctx, c.ObjectStoreName(streamwal.ObjectStoreSegments))
	if errors.Is(err, njs.ErrBucketNotFound) {
		return false, nil
	}
	if err != nil {
		return false, streamwal.Errorf(streamwal.CodeUnavailable, "object store of %s: %v", c, err)
	}
	return true, nil
}

// close closes the backend and the connection.
func (s *source) close() {
	_ = s.be.Close()
	s.nc.Close()
}

// attempt replicates from member until ctx ends or something fails;
// progressed says whether anything was replicated.
func (r *replicator) attempt(ctx context.Context, member messages.ReplicateMember, edge messages.ReplicateEdge, landed *messages.ReplicateHeader) (progressed bool, err error) {
	r.load(ctx)
	src, err := r.connect(ctx, member)
	if err != nil {
		return false, err
	}
	defer src.close()
	start, minTT, err := r.plan(ctx, src, landed, edge.Start)
	if err != nil {
		return false, fmt.Errorf("where to start in %s of %s: %w", src.p, member.Cluster, err)
	}
	sc, err := read.Open(ctx, read.Options{Backend: src.be, Codec: src.codec, Ticks: src.nc, PChannel: src.p, Start: start, MinTimeTick: minTT})
	if err != nil {
		return false, fmt.Errorf("read %s of %s: %w", src.p, member.Cluster, err)
	}
	defer func() { _ = sc.Close() }()
	ev := r.log.Info().Str("source", string(member.Cluster)).Str("source_pchannel", src.p.String()).
		Uint64("from", uint64(start.Position.ID)).Uint64("after_timetick", uint64(minTT))
	if src.scope.of != "" {
		ev = ev.Str("catch_up_of", string(src.scope.of)).Uint64("catch_up_after", uint64(src.scope.after))
	}
	ev.Msg("replicating")

	rctx, cancel := context.WithCancel(ctx)
	in := make(chan delivery, r.cfg.Batch)
	readErr := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // before the wait: the reader ends with it
	wg.Go(func() { readErr <- readAhead(rctx, sc, in) })
	for {
		batch, err := r.next(ctx, in, readErr)
		if err != nil {
			return progressed, err
		}
		n, err := r.appendBatch(ctx, src, batch)
		progressed = progressed || n > 0
		if err != nil {
			return progressed, err
		}
	}
}

// position is where in its source's log replication stands.
type position = messages.ReplicateHeader

// own is where the replicator stands in PChannel p of source c: the
// later of what landed in the WAL and what it acknowledged, nil for
// nowhere.
func (r *replicator) own(c streamwal.Cluster, p streamwal.PChannel, landed *position) *position {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cp.Source != c || r.cp.SourcePChannel != p.String() {
		r.cp = wire.ReplicateCheckpoint{Source: c, SourcePChannel: p.String()}
		r.dirty = true
	}
	if landed == nil || landed.Cluster != c || landed.TimeTick <= r.cp.TimeTick {
		if r.cp.TimeTick == 0 {
			return nil
		}
		return &position{Cluster: c, MessageID: r.cp.MessageID, TimeTick: r.cp.TimeTick, LastConfirmed: r.cp.LastConfirmed}
	}
	return landed
}

// delivery is what the reader hands on: a message of the source, or
// (m nil) the source's watermark at a moment the reader had delivered
// every message at or below it.
type delivery struct {
	m       *messages.ImmutableMessage
	through messages.TimeTick
}

// idleRead is how long the reader waits for a message before it hands on
// the source's watermark.
const idleRead = 100 * time.Millisecond

// readAhead reads sc into in until ctx ends or a read fails. When nothing
// comes for idleRead, everything at or below the scanner's watermark has
// been delivered: it hands the watermark on (when it moved), so that the
// secondary is known to be through it once what came before landed.
func readAhead(ctx context.Context, sc *read.Scanner, in chan<- delivery) error {
	var last messages.TimeTick
	for {
		nctx, cancel := context.WithTimeout(ctx, idleRead)
		m, err := sc.Next(nctx)
		cancel()
		d := delivery{m: m}
		switch {
		case err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			w := sc.Watermark()
			if w <= last {
				continue
			}
			last, d = w, delivery{through: w}
		case err != nil:
			return err
		}
		select {
		case in <- d:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// next waits for what was read and takes all of it, up to Batch.
func (r *replicator) next(ctx context.Context, in <-chan delivery, readErr <-chan error) ([]delivery, error) {
	var first delivery
	select {
	case first = <-in:
	case err := <-readErr:
		return nil, fmt.Errorf("read the source: %w", err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	batch := []delivery{first}
	for len(batch) < r.cfg.Batch {
		select {
		case m := <-in:
			batch = append(batch, m)
		default:
			return batch, nil
		}
	}
	return batch, nil
}

// appendBatch appends the replicas of batch and advances the checkpoint
// over the contiguous prefix acknowledged (a replica the WAL already has
// counts as acknowledged); it returns how many units it appended.
func (r *replicator) appendBatch(ctx context.Context, src *source, batch []delivery) (int, error) {
	units := make([][]*messages.MutableMessage, len(batch))
	var todo [][]*messages.MutableMessage
	var from []*messages.ImmutableMessage // todo's source messages, when traced
	for i, d := range batch {
		if d.m == nil {
			continue
		}
		u, err := r.replicas(src, d.m)
		if err != nil {
			return 0, err
		}
		units[i] = u
		if u != nil {
			todo = append(todo, u)
			if r.traces {
				from = append(from, d.m)
			}
		}
	}
	if err := r.learn(ctx, batch, units); err != nil {
		return 0, err
	}
	var errs []error
	if len(todo) > 0 {
		t := r.traceStart(src.member.Cluster, from, todo)
		var out [][]*messages.ImmutableMessage
		out, errs = r.cfg.Target.AppendUnits(ctx, todo)
		t.end(out, errs)
	}
	appended, j := 0, 0
	for i, d := range batch {
		if d.m == nil {
			r.through(d.through)
			continue
		}
		m, landed := d.m, false
		if units[i] != nil {
			err := errs[j]
			j++
			if err != nil && !errors.Is(err, streamwal.ErrDuplicate) {
				return appended, fmt.Errorf("append the replica of %s message %d (%s): %w", src.member.Cluster, m.ID(), m.Type(), err)
			}
			landed = err == nil
		}
		if landed {
			appended++
		}
		r.advance(m, landed)
	}
	return appended, nil
}

// replicas is the unit to append for m (nil: m is not replicated). A
// replica the source holds is relayed when the attempt's scope copies
// it (see scope), as a message of the source's log.
func (r *replicator) replicas(src *source, m *messages.ImmutableMessage) ([]*messages.MutableMessage, error) {
	head := m
	if m.Type() == messages.TypeTxn {
		head = m.TxnCommit()
	}
	relay := head.Replicate() != nil
	if copied, err := src.scope.copies(head); !copied || err != nil {
		return nil, err
	}
	newReplica := r.cfg.Codec.NewReplicate
	if relay {
		newReplica = r.cfg.Codec.NewRelay
	}
	if m.Type() == messages.TypeTxn {
		parts := append(append([]*messages.ImmutableMessage{m.TxnBegin()}, m.TxnBody()...), m.TxnCommit())
		unit := make([]*messages.MutableMessage, 0, len(parts))
		for _, part := range parts {
			if part.Unreplicable() {
				continue
			}
			rep, err := newReplica(part, src.member.Cluster, r.p)
			if err != nil {
				return nil, err
			}
			unit = append(unit, rep)
		}
		return unit, nil
	}
	if m.Type().Is(messages.FlagSelfControlled) || m.Unreplicable() {
		return nil, nil
	}
	rep, err := newReplica(m, src.member.Cluster, r.p)
	if err != nil {
		return nil, err
	}
	return []*messages.MutableMessage{rep}, nil
}

// advance moves the checkpoint past m.
func (r *replicator) advance(m *messages.ImmutableMessage, appended bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cp.MessageID, r.cp.TimeTick, r.cp.LastConfirmed = m.ID(), m.TimeTick(), m.LastConfirmed()
	r.cp.Through = max(r.cp.Through, m.TimeTick())
	r.cp.SourceTimeTick = max(r.cp.SourceTimeTick, m.TimeTick())
	if appended {
		r.cp.Replicated++
	}
	r.clearError()
	r.dirty = true
}

// through records that the secondary holds everything of the source up
// to its watermark w.
func (r *replicator) through(w messages.TimeTick) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w > r.cp.Through {
		r.cp.Through, r.cp.SourceTimeTick, r.dirty = w, max(r.cp.SourceTimeTick, w), true
		r.clearError()
	}
}

// bucket is the local replication bucket, opened on first use.
func (r *replicator) bucket(ctx context.Context) (njs.KeyValue, error) {
	r.kvMu.Lock()
	defer r.kvMu.Unlock()
	if r.kv != nil {
		return r.kv, nil
	}
	js, err := njs.New(r.cfg.Local)
	if err != nil {
		return nil, err
	}
	name := r.self.BucketName(streamwal.BucketReplication)
	if r.kv, err = js.KeyValue(ctx, name); err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", name, err)
	}
	return r.kv, nil
}

// load reads the checkpoint record an earlier replicator of the
// PChannel published, once: its position and Through carry on (a lag
// that starts again from zero at every restart would look healthy).
func (r *replicator) load(ctx context.Context) {
	r.mu.Lock()
	loaded := r.loaded
	r.mu.Unlock()
	if loaded {
		return
	}
	kv, err := r.bucket(ctx)
	if err != nil {
		r.log.Debug().Err(err).Msg("read the replicate checkpoint")
		return
	}
	var rec wire.ReplicateCheckpoint
	e, err := kv.Get(ctx, streamwal.ReplicateCheckpointKey(r.p))
	switch {
	case errors.Is(err, njs.ErrKeyNotFound):
	case err != nil:
		r.log.Debug().Err(err).Msg("read the replicate checkpoint")
		return
	case json.Unmarshal(e.Value(), &rec) != nil:
		r.log.Warn().Str("key", e.Key()).Msg("replicate checkpoint record does not decode; starting from the wal's position")
		rec = wire.ReplicateCheckpoint{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.loaded && r.cp.Source == "" {
		rec.Error = ""
		r.cp = rec
	}
	r.loaded = true
}

// publishLoop publishes the checkpoint record every CheckpointInterval
// while it changes, and once more when ctx ends.
func (r *replicator) publishLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), time.Second)
			r.publish(fctx, true)
			cancel()
			return
		case <-t.C:
			r.publish(ctx, false)
			r.report()
		}
	}
}

// publish writes the checkpoint record if it changed; a change of the
// watermark alone waits for IdleCheckpointInterval since the last
// write, unless final.
func (r *replicator) publish(ctx context.Context, final bool) {
	now := time.Now()
	r.mu.Lock()
	if !r.dirty || !r.loaded || (!final && r.onlyWatermark() && now.Sub(r.pubAt) < r.cfg.IdleCheckpointInterval) {
		r.mu.Unlock()
		return
	}
	cp := r.cp
	r.dirty, r.pub, r.pubAt = false, cp, now
	r.mu.Unlock()
	cp.Updated = now.UTC()
	kv, err := r.bucket(ctx)
	var data []byte
	if err == nil {
		data, err = json.Marshal(cp)
	}
	if err == nil {
		_, err = kv.Put(ctx, streamwal.ReplicateCheckpointKey(r.p), data)
	}
	if err != nil {
		r.redirty()
		r.log.Debug().Err(err).Msg("publish the replicate checkpoint")
	}
}

// onlyWatermark reports whether the record differs from the one last
// published only in how far the source's watermark moved (under mu).
func (r *replicator) onlyWatermark() bool {
	c, p := r.cp, r.pub
	c.Through, c.SourceTimeTick, c.Updated = p.Through, p.SourceTimeTick, p.Updated
	return c == p
}

// redirty marks the record as still to publish, at the next tick.
func (r *replicator) redirty() {
	r.mu.Lock()
	r.dirty, r.pubAt = true, time.Time{}
	r.mu.Unlock()
}

// setActive records whether the replicator replicates for a secondary,
// and reports a change.
func (r *replicator) setActive(active bool) {
	r.mu.Lock()
	changed := r.active != active
	r.active = active
	r.mu.Unlock()
	if changed {
		r.report()
	}
}

// report tells the hooks where replication stands: while active, at
// every call (the publish loop calls it every CheckpointInterval, so
// that an exporter sees a stuck replicator as alive and lagging); once
// when it stops being active. Events are reported one at a time, in the
// order of the state they tell.
func (r *replicator) report() {
	if !r.reports {
		return
	}
	r.reportMu.Lock()
	defer r.reportMu.Unlock()
	r.mu.Lock()
	e := telemetry.ReplicationEvent{PChannel: r.p, Active: r.active}
	if e.Active {
		e.Source, e.Through, e.SourceTimeTick, e.Replicated, e.Err = r.cp.Source, r.cp.Through, r.cp.SourceTimeTick, r.cp.Replicated, r.cp.Error
	}
	r.mu.Unlock()
	if !e.Active && !r.reported {
		return
	}
	r.reported = e.Active
	r.cfg.Hooks.OnReplication(e)
}

// unitTrace is what the hooks that follow re-appends
// (telemetry.ReplicateAppendHook) keep of a batch's units: the context
// each returned (nil where they kept none). The zero unitTrace tells
// nobody anything.
type unitTrace struct {
	hooks telemetry.Hooks
	ctxs  []context.Context
}

// traceStart tells the hooks that the units, replicas of the source
// cluster's messages from, start; the zero unitTrace when no hook
// follows re-appends. Contexts are kept only once a hook returns one of
// its own.
func (r *replicator) traceStart(source streamwal.Cluster, from []*messages.ImmutableMessage, units [][]*messages.MutableMessage) unitTrace {
	if !r.traces {
		return unitTrace{}
	}
	t := unitTrace{hooks: r.cfg.Hooks}
	bg := context.Background()
	for i, u := range units {
		ctx := t.hooks.OnReplicateAppendStart(bg, telemetry.ReplicateAppendEvent{PChannel: r.p, Source: source, Message: from[i], Replicas: u})
		if ctx == bg {
			continue
		}
		if t.ctxs == nil {
			t.ctxs = make([]context.Context, len(units))
		}
		t.ctxs[i] = ctx
	}
	return t
}

// end tells the hooks each unit's outcome.
func (t unitTrace) end(out [][]*messages.ImmutableMessage, errs []error) {
	if t.hooks == nil {
		return
	}
	for i, err := range errs {
		ctx := context.Background()
		if t.ctxs != nil && t.ctxs[i] != nil {
			ctx = t.ctxs[i]
		}
		e := telemetry.ReplicateAppendEndEvent{Err: err}
		if err == nil && i < len(out) {
			e.Messages = out[i]
		}
		t.hooks.OnReplicateAppendEnd(ctx, e)
	}
}
