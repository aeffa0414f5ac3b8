package broadcast

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/logging"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// Appender appends one replica to the owner of its PChannel and returns
// where it landed (the stored message for a deduplicated retry).
type Appender interface {
	Append(ctx context.Context, m *messages.MutableMessage) (wire.AppendResult, error)
}

// Store persists tasks; the coordinator's writes are conditioned on its
// epoch, so a deposed coordinator's Save fails.
type Store interface {
	Save(ctx context.Context, t *Task) error
	List(ctx context.Context) ([]*Task, error)
	Delete(ctx context.Context, id uint64) error
}

// Callback runs once every target of a task is acknowledged. It must be
// idempotent: it is retried until it succeeds, and again after a takeover.
type Callback func(ctx context.Context, t *Task) error

// Defaults (DESIGN.md §9).
const (
	DefaultMaxTombstones = 8192
	DefaultTombstoneAge  = 24 * time.Hour
	DefaultGCInterval    = 5 * time.Minute
)

// Config configures a Broadcaster.
type Config struct {
	Codec    *messages.Codec
	Appender Appender
	Store    Store
	// NewID hands out broadcast IDs, unique and increasing (the TSO).
	NewID func(ctx context.Context) (uint64, error)
	// Callbacks by type name.
	Callbacks map[string]Callback
	// Tombstone retention: at most MaxTombstones, each at most
	// TombstoneAge old, collected every GCInterval.
	MaxTombstones int
	TombstoneAge  time.Duration
	GCInterval    time.Duration
	Logger        zerolog.Logger
	// Hooks follow each callback (telemetry.BroadcastCallbackHook: with
	// telemetry/oteltrace's adapter, a wal.bc_callback span under the
	// trace context of its broadcast's caller).
	Hooks telemetry.Hooks
}

// Request is one broadcast.
type Request struct {
	Type    *messages.Type
	Targets messages.Targets
	Scope   messages.KeyScope
	Payload []byte
	// IdempotencyKey, if set, makes a retry return the original's result.
	IdempotencyKey string
	// AppendFirst names a VChannel target appended (and persisted) before
	// every other target.
	AppendFirst streamwal.VChannel
	// TraceParent and TraceState are the caller's W3C trace context, which
	// every replica carries (none on untraced types).
	TraceParent, TraceState string
}

// Broadcaster runs broadcast tasks for one tenure of an active coordinator
// (one lease epoch).
type Broadcaster struct {
	cfg    Config
	log    zerolog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	locks   *KeyLocks
	granted map[uint64]chan struct{}
	runs    map[uint64]*run
	idem    map[string]*run
	queue   []*run // callbacks, in CChannel acknowledgement order
	wake    chan struct{}

	stuck atomic.Int64
}

// run is a task in memory.
type run struct {
	task     *Task
	replicas map[string]*messages.MutableMessage
	saveMu   sync.Mutex
	// asked counts the saves asked for (under the broadcaster's mutex),
	// saved the last of them a stored snapshot covers (under saveMu).
	asked, saved uint64
	acked        chan struct{} // signalled on every acknowledgement
	queued       bool
	called       chan struct{} // closed when its callback ran
	done         chan struct{} // closed when the task is a tombstone or stuck
	err          error
}

// New returns a broadcaster; call Resume before serving.
func New(cfg Config) *Broadcaster {
	if cfg.MaxTombstones <= 0 {
		cfg.MaxTombstones = DefaultMaxTombstones
	}
	if cfg.TombstoneAge <= 0 {
		cfg.TombstoneAge = DefaultTombstoneAge
	}
	if cfg.GCInterval <= 0 {
		cfg.GCInterval = DefaultGCInterval
	}
	b := &Broadcaster{cfg: cfg, log: logging.Component(cfg.Logger, "broadcaster"),
		locks: NewKeyLocks(), granted: map[uint64]chan struct{}{}, runs: map[uint64]*run{},
		idem: map[string]*run{}, wake: make(chan struct{}, 1)}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b
}

// Stuck is how many tasks a target refused for good.
func (b *Broadcaster) Stuck() int64 { return b.stuck.Load() }

// Resume loads the persisted tasks: tombstones serve idempotent retries,
// unfinished tasks re-take their keys in ID order and carry on, stuck ones
// keep their keys. It then starts the callback and collection loops.
func (b *Broadcaster) Resume(ctx context.Context) error {
	tasks, err := b.cfg.Store.List(ctx)
	if err != nil {
		return err
	}
	sort.Slice(tasks, func(i, j int) bool { return tasks[i].ID < tasks[j].ID })
	for _, t := range tasks {
		r, err := b.restore(t)
		if err != nil {
			b.log.Error().Err(err).Uint64("broadcast", t.ID).Msg("cannot resume task")
			continue
		}
		switch t.State {
		case Tombstone:
			if t.Error != "" {
				r.err = streamwal.Errorf(t.ErrorCode, "broadcast %d was refused: %s", t.ID, t.Error)
			}
			close(r.done)
		case Stuck:
			b.stuck.Add(1)
			b.lockNow(r)
			r.err = streamwal.Errorf(streamwal.CodeUnrecoverable, "broadcast %d is stuck: %s", t.ID, t.Error)
			close(r.done)
		default:
			b.start(r, b.lockNow(r))
		}
	}
	b.wg.Add(2)
	go b.callbacks()
	go b.collect()
	return nil
}

// restore rebuilds a run from a persisted task.
func (b *Broadcaster) restore(t *Task) (*run, error) {
	typ, err := b.cfg.Codec.Registry().Lookup(t.Type)
	if err != nil {
		return nil, err
	}
	tg, err := parseTargets(t)
	if err != nil {
		return nil, err
	}
	bm, err := b.cfg.Codec.NewBroadcast(typ, tg, t.Scope, t.Payload, traceOption(t.TraceParent, t.TraceState)...)
	if err != nil {
		return nil, err
	}
	bm.SetID(t.ID)
	r := newRun(t, bm)
	b.mu.Lock()
	b.runs[t.ID] = r
	if t.IdemKey != "" {
		b.idem[t.IdemKey] = r
	}
	b.mu.Unlock()
	return r, nil
}

// parseTargets reads a task's targets back.
func parseTargets(t *Task) (messages.Targets, error) {
	var tg messages.Targets
	for _, name := range t.VChannels {
		v, err := streamwal.ParseVChannel(name)
		if err != nil {
			return tg, err
		}
		tg.VChannels = append(tg.VChannels, v)
	}
	if t.CChannel != "" {
		v, err := streamwal.ParseVChannel(t.CChannel)
		if err != nil {
			return tg, err
		}
		tg.CChannel = v
	}
	for _, name := range t.PChannels {
		p, err := streamwal.ParsePChannel(name)
		if err != nil {
			return tg, err
		}
		tg.PChannels = append(tg.PChannels, p)
	}
	return tg, nil
}

// newRun wraps a task and its replicas.
func newRun(t *Task, bm *messages.BroadcastMessage) *run {
	if t.Appended == nil {
		t.Appended = map[string]wire.AppendResult{}
	}
	if t.Acked == nil {
		t.Acked = map[string]bool{}
	}
	r := &run{task: t, replicas: map[string]*messages.MutableMessage{}, acked: make(chan struct{}, 1),
		called: make(chan struct{}), done: make(chan struct{})}
	for _, m := range bm.Split() {
		name := m.VChannel().String()
		if m.VChannel().IsZero() {
			name = m.PChannel().String()
		}
		r.replicas[name] = m
	}
	return r
}

// lockNow asks for a resumed task's keys; the channel is closed when they
// are granted (nil: granted at once).
func (b *Broadcaster) lockNow(r *run) chan struct{} {
	keys, err := parseKeys(r)
	if err != nil {
		b.log.Error().Err(err).Uint64("broadcast", r.task.ID).Msg("keys")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ok, err := b.locks.Acquire(r.task.ID, keys)
	if err != nil || ok {
		return nil
	}
	ch := make(chan struct{})
	b.granted[r.task.ID] = ch
	return ch
}

// parseKeys are a run's resource keys (from its replicas' headers).
func parseKeys(r *run) ([]messages.ResourceKey, error) {
	for _, m := range r.replicas {
		if bh := m.Header().Broadcast; bh != nil {
			return bh.Keys, nil
		}
	}
	return nil, streamwal.Errorf(streamwal.CodeInternal, "broadcast %d has no replica", r.task.ID)
}

// Broadcast runs a broadcast and returns its result once its callback
// ran. If ctx ends while it waits for its keys, nothing happened; once it
// is persisted it completes even if ctx ends (or the coordinator changes),
// and a retry with the same idempotency key returns its result.
func (b *Broadcaster) Broadcast(ctx context.Context, req Request) (Result, error) {
	if req.Type == nil {
		return Result{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "broadcast without a type")
	}
	idem := ""
	if req.IdempotencyKey != "" {
		idem = req.Type.Name + "|" + req.IdempotencyKey
		b.mu.Lock()
		r := b.idem[idem]
		b.mu.Unlock()
		if r != nil {
			return b.wait(ctx, r)
		}
	}
	bm, err := b.cfg.Codec.NewBroadcast(req.Type, req.Targets, req.Scope, req.Payload, traceOption(req.TraceParent, req.TraceState)...)
	if err != nil {
		return Result{}, err
	}
	r, err := b.newTask(ctx, req, bm, idem)
	if err != nil {
		return Result{}, err
	}
	return b.wait(ctx, r)
}

// newTask locks, persists and starts a new task.
func (b *Broadcaster) newTask(ctx context.Context, req Request, bm *messages.BroadcastMessage, idem string) (*run, error) {
	if !req.AppendFirst.IsZero() && !slices.Contains(bm.Broadcast().VChannels, req.AppendFirst) {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "append-first %s is not a target", req.AppendFirst)
	}
	id, err := b.cfg.NewID(ctx)
	if err != nil {
		return nil, err
	}
	bm.SetID(id)
	t := &Task{ID: id, State: Pending, Type: req.Type.Name, Scope: req.Scope, Payload: req.Payload,
		IdemKey: idem, Created: time.Now().UTC(), TraceParent: req.TraceParent, TraceState: req.TraceState}
	if !req.AppendFirst.IsZero() {
		t.AppendFirst = req.AppendFirst.String()
	}
	for _, v := range req.Targets.VChannels {
		t.VChannels = append(t.VChannels, v.String())
	}
	if !req.Targets.CChannel.IsZero() {
		t.CChannel = req.Targets.CChannel.String()
	}
	for _, p := range req.Targets.PChannels {
		t.PChannels = append(t.PChannels, p.String())
	}
	r := newRun(t, bm)
	if prev := b.claimKey(idem, r); prev != nil {
		return prev, nil // a concurrent retry got there first
	}
	if err := b.acquire(ctx, id, bm.Keys()); err != nil {
		b.abandon(r, err)
		return nil, err
	}
	if err := b.cfg.Store.Save(ctx, t); err != nil {
		b.release(id)
		b.abandon(r, err)
		return nil, err
	}
	b.mu.Lock()
	b.runs[id] = r
	b.mu.Unlock()
	b.start(r, nil)
	return r, nil
}

// claimKey registers r under its idempotency key before it waits for its
// resource keys, so that a retry arriving meanwhile joins it; it returns
// the run already registered, if any.
func (b *Broadcaster) claimKey(idem string, r *run) *run {
	if idem == "" {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if prev := b.idem[idem]; prev != nil {
		return prev
	}
	b.idem[idem] = r
	return nil
}

// abandon ends a task that never started: it leaves the idempotency
// index, and whoever joined it gets the error.
func (b *Broadcaster) abandon(r *run, err error) {
	b.mu.Lock()
	if r.task.IdemKey != "" && b.idem[r.task.IdemKey] == r {
		delete(b.idem, r.task.IdemKey)
	}
	r.err = err
	b.mu.Unlock()
	close(r.done)
}

// acquire takes keys for id, waiting (bounded by ctx) for conflicting
// broadcasts.
func (b *Broadcaster) acquire(ctx context.Context, id uint64, keys []messages.ResourceKey) error {
	b.mu.Lock()
	ok, err := b.locks.Acquire(id, keys)
	if err != nil || ok {
		b.mu.Unlock()
		return err
	}
	ch := make(chan struct{})
	b.granted[id] = ch
	b.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	case <-b.ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.locks.Held(id) {
		b.wakeLocked(b.locks.Release(id))
	} else {
		delete(b.granted, id)
		b.wakeLocked(b.locks.Cancel(id))
	}
	if ctx.Err() != nil {
		return streamwal.Errorf(streamwal.CodeResourceBusy, "broadcast waited for its resource keys: %v", ctx.Err())
	}
	return streamwal.Errorf(streamwal.CodeShuttingDown, "broadcaster stopped")
}

// release gives a task's keys back.
func (b *Broadcaster) release(id uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.wakeLocked(b.locks.Release(id))
}

// wakeLocked signals the broadcasts a release let through.
func (b *Broadcaster) wakeLocked(ids []uint64, err error) {
	if err != nil {
		b.log.Error().Err(err).Msg("key locks")
		return
	}
	for _, id := range ids {
		if ch, ok := b.granted[id]; ok {
			close(ch)
			delete(b.granted, id)
		}
	}
}

// wait returns a task's result once it is done.
func (b *Broadcaster) wait(ctx context.Context, r *run) (Result, error) {
	select {
	case <-r.done:
	case <-ctx.Done():
		return Result{ID: r.task.ID}, streamwal.Errorf(streamwal.CodeUnavailable, "broadcast %d still running: %v", r.task.ID, ctx.Err())
	case <-b.ctx.Done():
		return Result{ID: r.task.ID}, streamwal.Errorf(streamwal.CodeShuttingDown, "broadcast %d: the broadcaster stopped; the next coordinator resumes it", r.task.ID)
	}
	if r.err != nil {
		return Result{ID: r.task.ID}, r.err
	}
	return Result{ID: r.task.ID, Appended: r.task.Appended}, nil
}

// Close stops the broadcaster; unfinished tasks are resumed by the next
// active coordinator.
func (b *Broadcaster) Close() {
	b.cancel()
	b.wg.Wait()
}

// errStopped ends a task's work when the broadcaster stops.
var errStopped = errors.New("broadcaster stopped")

// traceOption carries a trace context into a broadcast's replicas (none
// when there is none).
func traceOption(parent, state string) []messages.Option {
	if parent == "" {
		return nil
	}
	return []messages.Option{messages.WithTrace(parent, state)}
}
