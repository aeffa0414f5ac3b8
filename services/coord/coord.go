// Package coord is the StreamingCoord (DESIGN.md §3): any number of
// coordinator processes, of which exactly one is active.
//
// # Leadership
//
// The active coordinator holds a lease: a key created in the leader bucket,
// whose entries expire after LeaseTTL, and renewed (compare-and-set) every
// LeaseTTL/3. The revision that created it is the coordinator's epoch. A
// standby tries to create the key at the same pace and takes over once the
// lease lapsed. On taking over, a coordinator rewrites every key it owns
// (the TSO bound, each PChannel's assignment, the view, the VChannel
// allocation) with compare-and-set under its epoch; every write after that
// is compare-and-set too, so a deposed coordinator's writes are refused.
// A coordinator whose renewal or write is refused steps down at once.
//
// # TSO
//
// TimeTicks follow the clock and are handed out in batches over request
// reply. The oracle persists an upper bound a few seconds ahead before it
// hands out anything above it, and a new active coordinator starts above
// the persisted bound: TimeTicks never go backwards across restarts and
// takeovers, even if a clock steps back. A WAL's request names its
// PChannel and term, and the oracle refuses it (CodeFenced) once the
// PChannel is assigned under a later term: the term is raised before the
// new owner is told, so every TimeTick a superseded owner still gets
// (a batch included) is below its successor's RecoveryBarrier.
//
// # Membership and assignment
//
// Nodes register and heartbeat in the nodes bucket; the coordinator watches
// it and declares a node dead when it has not heard from it for NodeTTL.
// Each PChannel moves through UNINITIALIZED → ASSIGNING → ASSIGNED →
// UNAVAILABLE → ASSIGNING: assigning persists the next term before the
// node is told; the node opens the WAL (barrier, replay) and confirms; only
// then is the PChannel ASSIGNED. A dead node's PChannels become
// UNAVAILABLE and are reassigned; the balance policy (package balance)
// runs on node join and leave, on a timer and on demand, and a move closes
// the WAL on the old node before the new node opens it (the barrier fences
// the old node even if it did not hear). Every change is published in the
// versioned view (KeyView), which clients and operators can watch.
//
// # What counts as served
//
// The coordinator's records say what it assigned; only the nodes can say
// what they serve. Every start of a node is a new session, and every
// heartbeat lists the PChannels the node serves with their terms, under a
// version that grows with each change of that set; an open's reply names
// the session and the version that first lists the PChannel. A PChannel
// is served (View: Serving, Since) only while its owner's current session
// confirms it under the current term: its open reply, then every live
// heartbeat. So:
//   - a node that registers in a session the coordinator has not seen is
//     a new incarnation: every PChannel recorded for its ID is reopened
//     under a new term (stable node IDs across restarts are the normal
//     case);
//   - a coordinator that takes over, a standby or one starting on the
//     persisted state of a whole cluster's restart, seeds each owner with
//     the session that confirmed its PChannels and counts none of them as
//     served until a live heartbeat confirms it; the values its watch of
//     the nodes bucket finds at start (perhaps a dead node's last word)
//     never confirm anything;
//   - a heartbeat at least as new as a PChannel's confirmation that does
//     not list it (the WAL was fenced or failed) reassigns it, and so does
//     an owner that does not confirm it within the open timeout;
//   - losing a node cancels the opens under way on it;
//   - an open that fails (the node refuses it, say with HISTORY_LOST, or
//     the request fails) records why on the assignment (Error), which
//     stays through the next attempts until an owner confirms the
//     PChannel.
//
// With Config.ReclaimLease, a coordinator that can prove its previous
// incarnation is gone takes over the lease that incarnation left at once.
package coord

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/logging"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord/balance"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// Defaults.
const (
	DefaultPChannels       = 16
	DefaultPrefix          = "pchan"
	DefaultLeaseTTL        = 3 * time.Second
	DefaultNodeTTL         = time.Second
	DefaultBalanceInterval = time.Minute
	DefaultOpenTimeout     = 2 * time.Minute
	// unservedWarning is how long a PChannel may go unserved before the
	// coordinator warns of it (and again every as long), or the open
	// timeout if that is shorter.
	unservedWarning = 10 * time.Second
)

// Config configures a coordinator.
type Config struct {
	// Conn is the NATS connection; Cluster the cluster name. Required.
	Conn    *nats.Conn
	Cluster streamwal.Cluster
	// ID identifies this coordinator process (default: a random one).
	ID string
	// PChannels and Prefix shape the cluster when it is first created
	// (default 16 PChannels "pchan-0" …); afterwards the persisted
	// assignments rule.
	PChannels int
	Prefix    string
	// Replicas of the buckets (default 1; 3 on a NATS cluster).
	Replicas int
	// LeaseTTL is how long the lease outlives its holder (default 3 s).
	LeaseTTL time.Duration
	// NodeTTL is how long a node may go unheard before it is dead
	// (default 1 s; nodes heartbeat every NodeTTL/4).
	NodeTTL time.Duration
	// BalanceInterval is the period of the balance timer (default 1 min).
	BalanceInterval time.Duration
	// OpenTimeout bounds a node's opening of a WAL (default 2 min): an
	// open replays the PChannel's log from its first message (about 20 s
	// a million messages on 2 cores, measured by BenchmarkRestartToWritable
	// in cmd/streamwal), and an open cut short is started over under a new
	// term, so a timeout below the replay's time leaves the PChannel
	// unserved for good. An open on a node that is lost is cancelled at
	// once whatever the timeout, and a PChannel unserved for 10 s (or the
	// open timeout if shorter) is logged as a warning every as long until
	// it serves.
	OpenTimeout time.Duration
	// Registry holds the application's message types (default: the
	// built-ins only).
	Registry *messages.Registry
	// Policy is the balance policy (default balance.DefaultPolicy()).
	Policy *balance.Policy
	// Logger receives the coordinator's logs (default: none).
	Logger zerolog.Logger
	// ReclaimLease says that a lease held under this coordinator's ID
	// belongs to a previous incarnation of this process that is surely
	// gone (the caller proved it, for example by holding the lock of the
	// data directory the server stores in). The coordinator then takes
	// such a lease over at once instead of waiting for it to lapse. A
	// lease held under another ID is always waited out.
	ReclaimLease bool
	// Hooks receive the coordinator's events (assignment changes, TimeTick
	// allocations, broadcasts, broadcast callbacks; see package
	// telemetry); none by default. Tracing is such a hook:
	// telemetry/oteltrace's adapter makes each broadcast callback a
	// wal.bc_callback span under its broadcast's caller's context.
	Hooks telemetry.Hooks
}

// withDefaults validates c and fills in defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Conn == nil || c.Cluster == "" {
		return c, streamwal.Errorf(streamwal.CodeInvalidArgument, "coordinator needs a connection and a cluster")
	}
	if c.ID == "" {
		c.ID = "coord-" + nuid.Next()
	}
	if c.PChannels <= 0 {
		c.PChannels = DefaultPChannels
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.NodeTTL <= 0 {
		c.NodeTTL = DefaultNodeTTL
	}
	if c.BalanceInterval <= 0 {
		c.BalanceInterval = DefaultBalanceInterval
	}
	if c.OpenTimeout <= 0 {
		c.OpenTimeout = DefaultOpenTimeout
	}
	if c.Policy == nil {
		p := balance.DefaultPolicy()
		c.Policy = &p
	}
	if err := c.Policy.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// Coordinator is one coordinator process, active or standby.
type Coordinator struct {
	cfg     Config
	log     zerolog.Logger
	js      njs.JetStream
	buckets map[streamwal.Bucket]njs.KeyValue

	leaseUntil atomic.Int64 // unix nanos until which the lease surely holds
	answered   atomic.Int64 // unix nanos of the last lease round answered (Ready)

	mu       sync.Mutex
	active   *tenure // nil while standby
	crashed  bool    // stop without giving the lease back
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// Start provisions the cluster's buckets and starts campaigning for the
// lease.
func Start(ctx context.Context, cfg Config) (*Coordinator, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	js, err := njs.New(cfg.Conn)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "jetstream: %v", err)
	}
	c := &Coordinator{cfg: cfg, js: js, stop: make(chan struct{}), done: make(chan struct{}),
		log: logging.Component(cfg.Logger, "coord").With().Str("coord", cfg.ID).Logger()}
	if c.buckets, err = Provision(ctx, js, cfg.Cluster, cfg.Replicas, cfg.LeaseTTL); err != nil {
		return nil, err
	}
	go c.campaign()
	return c, nil
}

// Provision creates the cluster's KV buckets if they do not exist (every
// coordinator does at start; nodes only open them).
func Provision(ctx context.Context, js njs.JetStream, c streamwal.Cluster, replicas int, leaseTTL time.Duration) (map[streamwal.Bucket]njs.KeyValue, error) {
	out := map[streamwal.Bucket]njs.KeyValue{}
	for _, b := range streamwal.Buckets {
		cfg := njs.KeyValueConfig{Bucket: c.BucketName(b), History: 1, Replicas: replicas, Storage: njs.FileStorage}
		switch b {
		case streamwal.BucketLeader:
			cfg.TTL = leaseTTL
		case streamwal.BucketNodes:
			cfg.TTL = time.Hour // registrations of nodes long gone age out
		}
		kv, err := provisionBucket(ctx, js, cfg)
		if streamwal.CodeOf(err) == streamwal.CodeInvalidArgument {
			return nil, err // a refused scale-down: no retry helps
		}
		if err != nil {
			return nil, streamwal.Errorf(streamwal.CodeUnavailable, "provision bucket %s: %v", cfg.Bucket, err)
		}
		out[b] = kv
	}
	return out, nil
}

// provisionBucket creates or updates a bucket, asking again, until ctx
// ends, when a request goes unanswered (see jetstream.InAttempts: two
// coordinators starting at once on a new cluster), unless the server
// dropped it for want of permission.
func provisionBucket(ctx context.Context, js njs.JetStream, cfg njs.KeyValueConfig) (njs.KeyValue, error) {
	var kv njs.KeyValue
	err := jetstream.InAttempts(ctx, func(ctx context.Context) (err error) {
		kv, err = provisionOnce(ctx, js, cfg)
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		// Unanswered because the server dropped it: credentials of
		// another cluster, say. Asking again cannot help.
		stream := streamwal.KVStreamName(cfg.Bucket)
		if denied := wire.Denied(js.Conn(), func(s string) bool { return strings.HasSuffix(s, "."+stream) }); denied != nil {
			return fmt.Errorf("bucket %s: %w", cfg.Bucket, denied)
		}
		return err
	})
	return kv, err
}

// provisionOnce makes one attempt of provisionBucket: every request of it
// bounded by ctx.
func provisionOnce(ctx context.Context, js njs.JetStream, cfg njs.KeyValueConfig) (njs.KeyValue, error) {
	if err := refuseScaleDown(ctx, js, streamwal.KVStreamName(cfg.Bucket), cfg.Replicas); err != nil {
		return nil, err
	}
	return js.CreateOrUpdateKeyValue(ctx, cfg)
}

// refuseScaleDown refuses to provision stream with fewer replicas than it
// has: a component started with the default of 1 on a cluster whose
// streams keep 3 would otherwise scale them down to one copy.
func refuseScaleDown(ctx context.Context, js njs.JetStream, stream string, replicas int) error {
	s, err := js.Stream(ctx, stream)
	if errors.Is(err, njs.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return nil // CreateOrUpdate reports what is wrong with the servers (or times out in turn)
	}
	if have := s.CachedInfo().Config.Replicas; have > replicas {
		return streamwal.Errorf(streamwal.CodeInvalidArgument,
			"%s has %d replicas and this coordinator runs with %d: refusing to scale it down (give --replicas %d)", stream, have, replicas, have)
	}
	return nil
}

// ID is this coordinator's identity.
func (c *Coordinator) ID() string { return c.cfg.ID }

// Active reports whether this coordinator holds the lease, and its epoch.
func (c *Coordinator) Active() (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.active == nil {
		return 0, false
	}
	return c.active.epoch, true
}

// Close stops the coordinator; an active one gives up its lease so that a
// standby takes over without waiting for it to lapse.
func (c *Coordinator) Close() error {
	c.stopOnce.Do(func() { close(c.stop) })
	<-c.done
	return nil
}

// Crash stops the coordinator as a crash would, for tests and chaos: it
// does not give its lease back, so a standby takes over only once the
// lease lapses.
func (c *Coordinator) Crash() {
	c.mu.Lock()
	c.crashed = true
	c.mu.Unlock()
	_ = c.Close()
}

// campaign holds or seeks the lease until the coordinator stops.
func (c *Coordinator) campaign() {
	defer close(c.done)
	tick := time.NewTicker(c.cfg.LeaseTTL / 3)
	defer tick.Stop()
	var rev uint64
	for {
		rev = c.leaseRound(rev)
		select {
		case <-c.stop:
			c.stepDown()
			c.mu.Lock()
			crashed := c.crashed
			c.mu.Unlock()
			if rev != 0 && !crashed {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = c.buckets[streamwal.BucketLeader].Delete(ctx, streamwal.KeyLeader, njs.LastRevision(rev))
				cancel()
			}
			return
		case <-tick.C:
		}
	}
}

// leaseRound renews the lease (rev > 0) or tries to take it, and returns
// the lease's revision (zero when not held).
func (c *Coordinator) leaseRound(rev uint64) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LeaseTTL/3)
	defer cancel()
	kv := c.buckets[streamwal.BucketLeader]
	start := time.Now()
	if rev != 0 {
		if c.isDeposed() {
			c.log.Warn().Msg("a write was refused; stepping down")
			c.stepDown()
			_ = kv.Delete(ctx, streamwal.KeyLeader, njs.LastRevision(rev))
			return 0
		}
		next, err := kv.Update(ctx, streamwal.KeyLeader, []byte(c.cfg.ID), rev)
		c.noteAnswered(err)
		if err == nil {
			c.extendLease(start)
			return next
		}
		c.log.Warn().Err(err).Msg("lease lost; stepping down")
		c.stepDown()
		return 0
	}
	created, err := kv.Create(ctx, streamwal.KeyLeader, []byte(c.cfg.ID))
	c.noteAnswered(err)
	if err != nil && c.cfg.ReclaimLease {
		created, err = c.reclaim(ctx, kv)
	}
	if err != nil {
		return 0
	}
	c.extendLease(start)
	if err := c.takeOver(created); err != nil {
		c.log.Error().Err(err).Msg("take over failed; giving the lease back")
		_ = kv.Delete(ctx, streamwal.KeyLeader, njs.LastRevision(created))
		return 0
	}
	return created
}

// reclaim takes over a lease held under this coordinator's own ID, which
// Config.ReclaimLease says is a dead incarnation's, instead of waiting for
// it to lapse. The update is compare-and-set on the revision read, so a
// lease that changed hands meanwhile is left alone.
func (c *Coordinator) reclaim(ctx context.Context, kv njs.KeyValue) (uint64, error) {
	e, err := kv.Get(ctx, streamwal.KeyLeader)
	if err != nil {
		return 0, err
	}
	if string(e.Value()) != c.cfg.ID {
		return 0, streamwal.Errorf(streamwal.CodeResourceBusy, "lease held by %q", e.Value())
	}
	rev, err := kv.Update(ctx, streamwal.KeyLeader, []byte(c.cfg.ID), e.Revision())
	if err != nil {
		return 0, err
	}
	c.log.Info().Uint64("revision", e.Revision()).Msg("reclaimed the lease of a previous incarnation")
	return rev, nil
}

// extendLease records how long the lease renewed (or created) at start
// surely still holds: two thirds of its TTL, so that a coordinator whose
// campaign stalls stops answering before a successor can take over.
func (c *Coordinator) extendLease(start time.Time) {
	c.leaseUntil.Store(start.Add(c.cfg.LeaseTTL * 2 / 3).UnixNano())
}

// leaseHeld reports whether the lease surely still holds.
func (c *Coordinator) leaseHeld() bool { return time.Now().UnixNano() < c.leaseUntil.Load() }

// isDeposed reports whether the active tenure noticed a refused write.
func (c *Coordinator) isDeposed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.active == nil || c.active.isDeposed()
}

// takeOver becomes the active coordinator under epoch.
func (c *Coordinator) takeOver(epoch uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t, err := startTenure(ctx, c, epoch)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.active = t
	c.mu.Unlock()
	c.log.Info().Uint64("epoch", epoch).Msg("active")
	return nil
}

// stepDown stops the active tenure, if any.
func (c *Coordinator) stepDown() {
	c.mu.Lock()
	t := c.active
	c.active = nil
	c.mu.Unlock()
	if t != nil {
		t.close()
		c.log.Info().Uint64("epoch", t.epoch).Msg("standby")
	}
}
