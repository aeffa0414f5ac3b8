// Package node is the StreamingNode service (DESIGN.md §3): it registers
// and heartbeats in the nodes bucket, opens and closes PChannel WALs (see
// package wal) when the coordinator assigns and unassigns them, and serves
// append requests for the PChannels it owns on their append subjects, so
// that a client reaches the owner without knowing it.
//
// A node answers a PChannel's append subject only while it holds the WAL.
// Appends of one request are ordered as listed and each gets its own
// result; once one is refused with an error worth a retry, the later ones
// are refused too (see wal.AppendMany), so that a client's retry keeps a
// call's order. Appends are admitted within bounds of bytes being
// appended, per PChannel and node-wide (Config.Admission: 32 MiB and
// 256 MiB by default): a request that finds no room within the admission
// wait (100 ms) is refused whole with streamwal.ErrResourceExhausted,
// which the client retries after a backoff, so that the node's memory
// stays bounded under more load than its streams absorb. When a WAL is
// fenced by a newer owner the node drops the channel at once. Close is graceful: the node stops taking appends,
// finishes those in flight, closes its WALs within a bounded time and
// says goodbye (deletes its registration), so the coordinator reassigns
// its PChannels without waiting for its heartbeat to lapse.
//
// Every start is a new session. Each heartbeat (every Heartbeat, and at
// once when the set changes) lists what the node serves, with terms, under
// a version of that set; an open's reply carries the session and version.
// That is what the coordinator and `streamwal status` take as served, and
// what an operator reads with `nats kv get wal_<c>_nodes node.<id>`.
//
// Unless Config.Recovery.Off, every WAL runs with recovery storage (see
// package wal): checkpoints and metadata in the checkpoints bucket,
// flushed segments and the archive of what truncation removes in the
// segments object store, and a node-wide memory account for the seal
// policies. An open refused because a stream lost acknowledged history
// (streamwal.ErrHistoryLost) fails until an operator accepts the loss.
package node

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/internal/admit"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/logging"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
	"github.com/streamwal/streamwal/services/node/wal"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// Defaults.
const (
	DefaultHeartbeat   = 250 * time.Millisecond
	DefaultCloseBudget = 3 * time.Second
	// maxRequests bounds the append requests served at once.
	maxRequests = 1024
)

// Config configures a node.
type Config struct {
	// Conn is the NATS connection, Codec the cluster's codec, ID the
	// node's identity. Required.
	Conn  *nats.Conn
	Codec *messages.Codec
	ID    streamwal.NodeID
	// Backend configures the WAL streams (replicas, group commit, ...).
	Backend jetstream.Options
	// Heartbeat is the period of the node's heartbeat (default 250 ms;
	// the coordinator's NodeTTL should be about four of them).
	Heartbeat time.Duration
	// SyncInterval is the WALs' TimeTick sync period (default 200 ms).
	SyncInterval time.Duration
	// CloseBudget bounds a graceful close (default 3 s).
	CloseBudget time.Duration
	// Logger receives the node's logs (default: none).
	Logger zerolog.Logger
	// Recovery configures recovery storage, shard management and
	// truncation (DESIGN.md §10); on unless Recovery.Off.
	Recovery RecoveryOptions
	// WrapBackend, if set, wraps the backend the node builds (on Conn,
	// with the Backend options): every WAL of the node writes and reads
	// through what it returns. Tests inject backend faults with it (see
	// jetstream/faulty); nil uses the backend as built.
	WrapBackend func(*jetstream.JetStream) WALBackend
	// Admission bounds the bytes of appends the node serves at once,
	// per PChannel and in all, and how long an append waits for room
	// before it is refused with streamwal.ErrResourceExhausted (see
	// AdmissionOptions).
	Admission AdmissionOptions
	// Hooks receive the node's events (appends, each message appended,
	// opens, closes, fencing, heartbeats, recovery storage) and those of
	// its WAL writers (see package telemetry); none by default. Tracing
	// is such a hook: telemetry/oteltrace's adapter makes the append of
	// a message that carries a trace context wal.append and
	// wal.appendimpl spans.
	Hooks telemetry.Hooks
	// ReplicateOptions, when set, are the options (credentials) of the
	// replicators' connection to the source cluster it is called with,
	// on a secondary (replicate.Config.SourceOptions).
	ReplicateOptions func(source streamwal.Cluster) []nats.Option
}

// WALBackend is what a node needs of its backend: the WALs' backend,
// recovery storage's tiers and the backend's options.
// *jetstream.JetStream implements it, as does jetstream/faulty's wrapper
// of one.
type WALBackend interface {
	jetstream.Backend
	wal.Tiers
	Options() jetstream.Options
}

// DefaultRetain is how much of the log, by age, a node keeps in its
// streams unless told otherwise.
const DefaultRetain = 24 * time.Hour

// RetainNothing, as RecoveryOptions.Retain, truncates a stream as soon as
// what is below is flushed and checkpointed.
const RetainNothing = time.Duration(-1)

// RecoveryOptions configure a node's recovery storage.
type RecoveryOptions struct {
	// Off turns recovery storage off: every open replays its stream from
	// the first message, and nothing is truncated.
	Off bool
	// Shard configures the seal policies (Memory is the node's own: set
	// MemoryHigh and MemoryLow instead).
	Shard shard.Config
	// MemoryHigh and MemoryLow are the node-wide water marks of growing
	// segment bytes (0: no memory policy; MemoryLow defaults to 3/4 of
	// MemoryHigh).
	MemoryHigh, MemoryLow uint64
	// Cadence says when a persist round is due (default every 10 s, at
	// once past 100 dirty messages).
	Cadence recovery.Cadence
	// Retain is how much of the log, by age, stays in the stream (default
	// DefaultRetain; RetainNothing keeps nothing beyond what truncation
	// must keep); NoTruncation keeps everything. Truncation never passes
	// messages younger than the stream's duplicate window
	// (Backend.DuplicateWindow): a server rebuilds its memory of message
	// IDs only from what its stream holds.
	Retain       time.Duration
	NoTruncation bool
	// TruncateInterval is how often each WAL truncates (default 10 s).
	TruncateInterval time.Duration
	// Replicas of the checkpoints bucket (default 1).
	Replicas int
	// SubscriptionExpiry is how long a durable subscription's position
	// that names no expiry of its own holds the log without an
	// acknowledgement (default DefaultSubscriptionExpiry; negative:
	// forever). Truncation never passes a position that holds.
	SubscriptionExpiry time.Duration
}

// storage is the WAL storage configuration of the node's PChannels.
func (n *Node) storage(p streamwal.PChannel) *wal.Storage {
	if n.store == nil {
		return nil
	}
	o := n.cfg.Recovery
	retain := o.Retain
	switch {
	case o.NoTruncation:
		retain = -1
	case retain == RetainNothing:
		retain = 0
	case retain <= 0:
		retain = DefaultRetain
	}
	if retain >= 0 {
		// The server remembers the message IDs of the duplicate window
		// only from what the stream holds once it restarts: keep that
		// window, so that a retry of an append that landed is recognised
		// as a duplicate, not stored twice.
		retain = max(retain, n.be.Options().DuplicateWindow)
	}
	sc := o.Shard
	sc.Memory = n.memory
	return &wal.Storage{Store: n.store, Tiers: n.be, Shard: sc, Cadence: o.Cadence, Retain: retain, TruncateInterval: o.TruncateInterval,
		Holds: n.holds.For(p)}
}

// withDefaults validates c and fills in defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Conn == nil || c.Codec == nil || c.ID == "" {
		return c, streamwal.Errorf(streamwal.CodeInvalidArgument, "node needs a connection, a codec and an id")
	}
	if _, err := streamwal.ParseNodeID(string(c.ID)); err != nil {
		return c, err
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.CloseBudget <= 0 {
		c.CloseBudget = DefaultCloseBudget
	}
	c.Admission = c.Admission.withDefaults()
	return c, nil
}

// Node is one StreamingNode.
type Node struct {
	cfg     Config
	log     zerolog.Logger
	session string
	started time.Time // when this session began
	be      WALBackend
	nodes   njs.KeyValue
	oracle  *remoteOracle
	store   recovery.Store // nil with Recovery.Off
	memory  *shard.Memory  // nil without a memory policy
	local   localWALs      // the WALs served, for AppendLocal
	holds   *subscriptionHolds

	// followsMessages says whether a hook follows each message appended
	// (telemetry.MessageAppendHook).
	followsMessages bool

	mu       sync.Mutex
	channels map[streamwal.PChannel]*channel
	version  uint64 // of the served set: grows at every change of channels
	opLocks  map[streamwal.PChannel]*sync.Mutex
	subs     []*nats.Subscription
	closing  bool

	beat  chan struct{} // asks for a heartbeat now (the served set changed)
	ready readiness     // what the node was asked to serve, for Ready

	requests  chan struct{}                   // semaphore of append requests
	admission *admit.Gate[streamwal.PChannel] // bytes of appends served, see AdmissionOptions
	inflight  sync.WaitGroup
	stop      chan struct{}
	stopped   context.Context // ends when stop closes
	halt      context.CancelFunc
	loops     sync.WaitGroup
	once      sync.Once
}

// channel is one PChannel the node serves.
type channel struct {
	wal   *wal.WAL
	sub   *nats.Subscription
	since time.Time
}

// Start registers the node and starts serving the coordinator's requests.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if !cfg.Recovery.Off {
		cfg.Backend.Archive = true
	}
	if len(cfg.Hooks) > 0 {
		cfg.Backend.Hooks = append(slices.Clip(cfg.Backend.Hooks), cfg.Hooks)
	}
	js, err := jetstream.New(cfg.Conn, cfg.Codec, cfg.Backend)
	if err != nil {
		return nil, err
	}
	var be WALBackend = js
	if cfg.WrapBackend != nil {
		be = cfg.WrapBackend(js)
	}
	n := &Node{cfg: cfg, be: be, session: nuid.Next(), started: time.Now().UTC(),
		log:      logging.Component(cfg.Logger, "node").With().Str("node", string(cfg.ID)).Logger(),
		oracle:   &remoteOracle{nc: cfg.Conn, subject: cfg.Codec.Cluster().CoordSubject(streamwal.CoordTSO)},
		channels: map[streamwal.PChannel]*channel{}, opLocks: map[streamwal.PChannel]*sync.Mutex{},
		requests: make(chan struct{}, maxRequests), stop: make(chan struct{}), beat: make(chan struct{}, 1),
		admission: admit.New[streamwal.PChannel](cfg.Admission.Total, cfg.Admission.PerPChannel)}
	n.stopped, n.halt = context.WithCancel(context.Background())
	n.followsMessages = telemetry.Has[telemetry.MessageAppendHook](cfg.Hooks)
	if n.nodes, err = n.openNodesBucket(ctx); err != nil {
		return nil, err
	}
	if err := n.openRecovery(ctx); err != nil {
		return nil, err
	}
	n.holds = newSubscriptionHolds(cfg.Codec.Cluster(), cfg.Recovery.SubscriptionExpiry, n.log)
	if err := n.subscribe(); err != nil {
		n.unsubscribe()
		return nil, err
	}
	if err := n.heartbeat(ctx); err != nil {
		n.unsubscribe()
		return nil, err
	}
	n.noteBeat(nil)
	n.loops.Add(3)
	go n.heartbeats()
	go n.watchHolds()
	go n.watchCoordinator()
	return n, nil
}

// openNodesBucket waits for the coordinator to have provisioned the nodes
// bucket.
func (n *Node) openNodesBucket(ctx context.Context) (njs.KeyValue, error) {
	js, err := njs.New(n.cfg.Conn)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "jetstream: %v", err)
	}
	name := n.cfg.Codec.Cluster().BucketName(streamwal.BucketNodes)
	for {
		kv, err := js.KeyValue(ctx, name)
		if err == nil {
			return kv, nil
		}
		select {
		case <-ctx.Done():
			return nil, streamwal.Errorf(streamwal.CodeUnavailable, "bucket %s: %v (is a coordinator running?)", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// openRecovery opens the checkpoints bucket, unless recovery is off.
func (n *Node) openRecovery(ctx context.Context) error {
	o := n.cfg.Recovery
	if o.Off {
		return nil
	}
	js, err := njs.New(n.cfg.Conn)
	if err != nil {
		return streamwal.Errorf(streamwal.CodeUnavailable, "jetstream: %v", err)
	}
	kv, err := recovery.OpenBucket(ctx, js, n.cfg.Codec.Cluster(), recovery.WithReplicas(max(o.Replicas, 1)))
	if err != nil {
		return err
	}
	n.store = recovery.NewKV(kv)
	if o.MemoryHigh > 0 {
		n.memory = shard.NewMemory(o.MemoryHigh, o.MemoryLow)
	}
	return nil
}

// ID is the node's identity; Session changes at every start.
func (n *Node) ID() streamwal.NodeID { return n.cfg.ID }

// Session is this run's session.
func (n *Node) Session() string { return n.session }

// WAL returns the WAL of p if the node serves it, for in-process callers
// (the client's local bypass).
func (n *Node) WAL(p streamwal.PChannel) (*wal.WAL, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ch, ok := n.channels[p]
	if !ok {
		return nil, false
	}
	return ch.wal, true
}

// subscribe serves the node's request subjects.
func (n *Node) subscribe() error {
	c := n.cfg.Codec.Cluster()
	for op, h := range map[streamwal.NodeOp]wire.Handler{
		streamwal.NodeOpen:   wire.Handle(n.handleOpen),
		streamwal.NodeClose:  wire.Handle(n.handleClose),
		streamwal.NodeStatus: n.handleStatus,
	} {
		sub, err := n.cfg.Conn.Subscribe(c.NodeSubject(n.cfg.ID, op), func(m *nats.Msg) {
			n.loops.Add(1)
			go func() {
				defer n.loops.Done()
				body, err := h(context.Background(), m.Data)
				_ = wire.Respond(m, body, err)
			}()
		})
		if err != nil {
			return streamwal.Errorf(streamwal.CodeUnavailable, "subscribe %s: %v", op, err)
		}
		n.subs = append(n.subs, sub)
	}
	return nil
}

// unsubscribe stops serving the node's request subjects.
func (n *Node) unsubscribe() {
	n.mu.Lock()
	subs := n.subs
	n.subs = nil
	n.mu.Unlock()
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
}

// heartbeat writes the node's registration with what it serves.
func (n *Node) heartbeat(ctx context.Context) error {
	data, err := jsonEncode(n.record())
	if err != nil {
		return err
	}
	if _, err := n.nodes.Put(ctx, streamwal.NodeKey(n.cfg.ID), data); err != nil {
		return streamwal.Errorf(streamwal.CodeUnavailable, "heartbeat: %v", err)
	}
	return nil
}

// record is the node's registration as of now.
func (n *Node) record() wire.NodeRecord {
	n.mu.Lock()
	defer n.mu.Unlock()
	rec := wire.NodeRecord{Node: string(n.cfg.ID), Session: n.session, Since: n.started, Version: n.version}
	for p, ch := range n.channels {
		rec.Serving = append(rec.Serving, wire.Served{PChannel: p.String(), Term: ch.wal.Term(), Since: ch.since})
	}
	slices.SortFunc(rec.Serving, func(a, b wire.Served) int { return strings.Compare(a.PChannel, b.PChannel) })
	return rec
}

// changedLocked records a change of the served set and asks for a
// heartbeat, so that the coordinator hears of it at once; it returns the
// set's new version.
func (n *Node) changedLocked() uint64 {
	n.version++
	select {
	case n.beat <- struct{}{}:
	default:
	}
	return n.version
}

// heartbeats runs until the node stops: every Heartbeat, and at once when
// the served set changed.
func (n *Node) heartbeats() {
	defer n.loops.Done()
	t := time.NewTicker(n.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		case <-n.beat:
		}
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Heartbeat*4)
		err := n.heartbeat(ctx)
		if err != nil {
			n.log.Warn().Err(err).Msg("heartbeat")
		}
		cancel()
		n.noteBeat(err)
	}
}

// Close stops the node gracefully: no new appends, those in flight
// finished, WALs closed within the close budget, registration deleted.
func (n *Node) Close() error {
	n.shutdown(true)
	return nil
}

// Crash stops the node as a crash would, for tests and chaos: no goodbye,
// WALs dropped without waiting for appends in flight. The coordinator
// notices only when the heartbeats stop.
func (n *Node) Crash() {
	n.shutdown(false)
}

// shutdown stops everything; graceful says goodbye.
func (n *Node) shutdown(graceful bool) {
	n.once.Do(func() {
		n.mu.Lock()
		n.closing = true
		n.mu.Unlock()
		close(n.stop)
		n.halt()
		n.unsubscribe()
		chans := n.takeChannels()
		for _, ch := range chans {
			n.local.withdraw(ch.wal)
			_ = ch.sub.Unsubscribe()
			n.noteClose(ch.wal.PChannel(), ch.wal.Term(), telemetry.ReasonShutdown)
		}
		if graceful {
			n.waitRequests()
		}
		var closing sync.WaitGroup
		for _, ch := range chans {
			closing.Add(1)
			go func() {
				defer closing.Done()
				_ = ch.wal.Close()
			}()
		}
		closing.Wait()
		if graceful {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if err := n.nodes.Delete(ctx, streamwal.NodeKey(n.cfg.ID)); err != nil {
				n.log.Warn().Err(err).Msg("goodbye")
			}
			cancel()
		}
		n.loops.Wait()
		n.inflight.Wait()
		_ = n.be.Close()
	})
}

// takeChannels empties the channel map.
func (n *Node) takeChannels() map[streamwal.PChannel]*channel {
	n.mu.Lock()
	defer n.mu.Unlock()
	chans := n.channels
	n.channels = map[streamwal.PChannel]*channel{}
	return chans
}

// waitRequests waits for append requests in flight, within the budget.
func (n *Node) waitRequests() {
	done := make(chan struct{})
	go func() { n.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(n.cfg.CloseBudget):
		n.log.Warn().Msg("append requests still in flight after the close budget")
	}
}

// errShuttingDown refuses work during shutdown.
var errShuttingDown = errors.New("node is shutting down")
