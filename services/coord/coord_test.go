package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

const (
	testCluster streamwal.Cluster = "ct"
	testLease                     = 600 * time.Millisecond
	testNodeTTL                   = 400 * time.Millisecond
	// poll is the period of the tests' polling.
	poll = 5 * time.Millisecond
)

// env is one embedded server and a client connection to it.
type env struct {
	t   *testing.T
	srv *embedded.Server
	nc  *nats.Conn
	js  njs.JetStream
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := embedded.StartTest(t)
	nc := connect(t, srv.Connect)
	js, err := njs.New(nc)
	require.NoError(t, err)
	return &env{t: t, srv: srv, nc: nc, js: js}
}

// start starts a coordinator on a connection of its own (4 PChannels,
// short lease and node TTL), closed when the test ends.
func (e *env) start(id string, mods ...func(*Config)) *Coordinator {
	t := e.t
	t.Helper()
	cfg := Config{Conn: connect(t, e.srv.Connect), Cluster: testCluster, ID: id, PChannels: 4,
		LeaseTTL: testLease, NodeTTL: testNodeTTL}
	for _, m := range mods {
		m(&cfg)
	}
	c, err := Start(testCtx(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func withLease(d time.Duration) func(*Config) { return func(c *Config) { c.LeaseTTL = d } }

func (e *env) kv(b streamwal.Bucket) njs.KeyValue {
	e.t.Helper()
	kv, err := e.js.KeyValue(testCtx(e.t), testCluster.BucketName(b))
	require.NoError(e.t, err)
	return kv
}

// load reads a JSON record from a bucket and returns its revision.
func (e *env) load(b streamwal.Bucket, key string, out any) uint64 {
	e.t.Helper()
	ent, err := e.kv(b).Get(testCtx(e.t), key)
	require.NoError(e.t, err, "get %s/%s", b, key)
	require.NoError(e.t, json.Unmarshal(ent.Value(), out))
	return ent.Revision()
}

// call makes a coordinator request.
func (e *env) call(op streamwal.CoordOp, req, reply any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return wire.Call(ctx, e.nc, testCluster.CoordSubject(op), req, reply)
}

// raw sends a request body as is and returns the error of the reply.
func (e *env) raw(op streamwal.CoordOp, body string) error {
	e.t.Helper()
	m, err := e.nc.Request(testCluster.CoordSubject(op), []byte(body), 2*time.Second)
	require.NoError(e.t, err)
	var env struct {
		Error *wire.Error `json:"error"`
	}
	require.NoError(e.t, json.Unmarshal(m.Data, &env))
	return env.Error.Err()
}

// tso asks for n TimeTicks and returns the first.
func (e *env) tso(n uint32) (messages.TimeTick, error) {
	var r wire.TSOReply
	err := e.call(streamwal.CoordTSO, wire.TSORequest{Count: n}, &r)
	return r.First, err
}

// tsoEventually retries retriable failures (no active coordinator yet).
func (e *env) tsoEventually(n uint32) messages.TimeTick {
	e.t.Helper()
	var first messages.TimeTick
	var fatal error
	require.Eventually(e.t, func() bool {
		f, err := e.tso(n)
		if err != nil && !streamwal.IsRetriable(err) {
			fatal = err
			return true
		}
		first = f
		return err == nil
	}, 10*time.Second, poll)
	require.NoError(e.t, fatal)
	return first
}

func (e *env) status() wire.View {
	e.t.Helper()
	var v wire.View
	require.NoError(e.t, e.call(streamwal.CoordStatus, struct{}{}, &v))
	return v
}

// activeOf returns the active coordinators among cs.
func activeOf(cs ...*Coordinator) []*Coordinator {
	var out []*Coordinator
	for _, c := range cs {
		if _, ok := c.Active(); ok {
			out = append(out, c)
		}
	}
	return out
}

// waitActive waits until exactly one of cs is active and serves its
// requests, and returns it.
func (e *env) waitActive(timeout time.Duration, cs ...*Coordinator) *Coordinator {
	e.t.Helper()
	var got *Coordinator
	require.Eventually(e.t, func() bool {
		a := activeOf(cs...)
		if len(a) == 1 {
			got = a[0]
		}
		return len(a) == 1
	}, timeout, poll)
	e.waitServed(got)
	return got
}

// waitServed waits until c answers the coordinator's requests. (Active
// reports true as soon as the tenure started; its subscriptions reach the
// server a moment later, and a request in between finds no responders.)
func (e *env) waitServed(c *Coordinator) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		ep, ok := c.Active()
		var v wire.View
		err := e.call(streamwal.CoordStatus, struct{}{}, &v)
		return ok && err == nil && v.Leader == c.ID() && v.Epoch == ep
	}, 5*time.Second, poll, "%s does not serve", c.ID())
}

func epochOf(t *testing.T, c *Coordinator) uint64 {
	t.Helper()
	ep, ok := c.Active()
	require.True(t, ok, "%s is not active", c.ID())
	return ep
}

// activeTenure returns c's active tenure (the internals the deposition tests
// drive).
func activeTenure(c *Coordinator) *tenure {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.active
}

func other(c, a, b *Coordinator) *Coordinator {
	if c == a {
		return b
	}
	return a
}

func pchannelNames(t *testing.T) []string {
	ps, err := streamwal.PChannels(DefaultPrefix, 4)
	require.NoError(t, err)
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

func TestConfigValidation(t *testing.T) {
	_, err := Start(context.Background(), Config{Cluster: testCluster})
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	e := newEnv(t)
	_, err = Start(context.Background(), Config{Conn: e.nc})
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

func TestExactlyOneActive(t *testing.T) {
	e := newEnv(t)
	a, b := e.start("a"), e.start("b")
	act := e.waitActive(5*time.Second, a, b)
	ep := epochOf(t, act)

	// It stays the only one, under the same epoch, through several renewals.
	require.Never(t, func() bool {
		as := activeOf(a, b)
		if len(as) != 1 || as[0] != act {
			return true
		}
		now, _ := act.Active()
		return now != ep
	}, 2*testLease, 20*time.Millisecond)

	// The lease names it; its revision moved on from the epoch (renewals).
	ent, err := e.kv(streamwal.BucketLeader).Get(testCtx(t), streamwal.KeyLeader)
	require.NoError(t, err)
	require.Equal(t, act.ID(), string(ent.Value()))
	require.Greater(t, ent.Revision(), ep)

	// The view and the status name it.
	var v wire.View
	e.load(streamwal.BucketAssignments, streamwal.KeyView, &v)
	require.Equal(t, ep, v.Epoch)
	require.Equal(t, act.ID(), v.Leader)
	st := e.status()
	require.Equal(t, ep, st.Epoch)
	require.Equal(t, act.ID(), st.Leader)
}

func TestCloseHandsOverWithoutWaitingForTheLease(t *testing.T) {
	// A long lease, so that waiting for it to lapse is clearly slower
	// than the hand-over.
	const lease = 3 * time.Second
	e := newEnv(t)
	a, b := e.start("a", withLease(lease)), e.start("b", withLease(lease))
	act := e.waitActive(5*time.Second, a, b)
	next := other(act, a, b)
	ep := epochOf(t, act)

	start := time.Now()
	require.NoError(t, act.Close())
	_, ok := act.Active()
	require.False(t, ok)
	// The lease was given back (or is already the successor's).
	ent, err := e.kv(streamwal.BucketLeader).Get(testCtx(t), streamwal.KeyLeader)
	if err == nil {
		require.Equal(t, next.ID(), string(ent.Value()))
	} else {
		require.ErrorIs(t, err, njs.ErrKeyNotFound)
	}

	require.Eventually(t, func() bool { _, ok := next.Active(); return ok }, lease, poll)
	took := time.Since(start)
	t.Logf("hand-over took %v (lease %v)", took, lease)
	// The standby tries every lease/3; the lapse would take at least
	// lease - lease/3.
	require.Less(t, took, lease*2/3-100*time.Millisecond)
	require.Greater(t, epochOf(t, next), ep)
	require.NoError(t, act.Close(), "Close is idempotent")
}

func TestCrashTakeOverAfterLapseWithTimeTicksIncreasing(t *testing.T) {
	e := newEnv(t)
	a, b := e.start("a"), e.start("b")
	act := e.waitActive(5*time.Second, a, b)
	next := other(act, a, b)
	ep := epochOf(t, act)

	var last messages.TimeTick
	for i := range 20 {
		n := uint32(1 + i*50)
		first, err := e.tso(n)
		require.NoError(t, err)
		require.Greater(t, first, last)
		last = first + messages.TimeTick(n) - 1
	}

	start := time.Now()
	act.Crash()
	_, ok := act.Active()
	require.False(t, ok)
	// The crashed coordinator did not give its lease back.
	ent, err := e.kv(streamwal.BucketLeader).Get(testCtx(t), streamwal.KeyLeader)
	if err == nil {
		require.Equal(t, act.ID(), string(ent.Value()), "the lease changed hands before it lapsed")
	}

	require.Eventually(t, func() bool { _, ok := next.Active(); return ok }, 5*testLease, poll)
	t.Logf("take-over after a crash took %v (lease %v)", time.Since(start), testLease)
	ep2 := epochOf(t, next)
	require.Greater(t, ep2, ep)

	first := e.tsoEventually(1)
	require.Greater(t, first, last, "TimeTicks went backwards across the take-over")
	last = first
	for range 20 {
		f, err := e.tso(10)
		require.NoError(t, err)
		require.Greater(t, f, last)
		last = f + 9
	}

	// The successor persisted its own bound, above everything handed out.
	var rec tsoRecord
	e.load(streamwal.BucketTSO, streamwal.KeyTSOBound, &rec)
	require.Equal(t, ep2, rec.Epoch)
	require.GreaterOrEqual(t, rec.Bound, last)

	// And it rewrote every key under its epoch.
	var v wire.View
	e.load(streamwal.BucketAssignments, streamwal.KeyView, &v)
	require.Equal(t, ep2, v.Epoch)
	require.Equal(t, next.ID(), v.Leader)
	for _, name := range pchannelNames(t) {
		p, err := streamwal.ParsePChannel(name)
		require.NoError(t, err)
		var asg wire.Assignment
		e.load(streamwal.BucketAssignments, streamwal.AssignmentKey(p), &asg)
		require.Equal(t, ep2, asg.Epoch, name)
	}
	var col wire.Collections
	e.load(streamwal.BucketVChannels, streamwal.KeyCollections, &col)
	require.Equal(t, ep2, col.Epoch)
}

func TestTSOConcurrentRangesAreDisjoint(t *testing.T) {
	e := newEnv(t)
	e.waitActive(5*time.Second, e.start("a"))
	type rng struct{ first, last messages.TimeTick }
	var mu sync.Mutex
	var got []rng
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			var prev messages.TimeTick
			for i := range 40 {
				n := uint32(1 + (g*40+i)*37%1000)
				first, err := e.tso(n)
				if err != nil {
					errs <- err
					return
				}
				if first <= prev {
					errs <- fmt.Errorf("goroutine %d: %d after %d", g, first, prev)
					return
				}
				prev = first + messages.TimeTick(n) - 1
				mu.Lock()
				got = append(got, rng{first, prev})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, got, 8*40)
	sort.Slice(got, func(i, j int) bool { return got[i].first < got[j].first })
	for i := 1; i < len(got); i++ {
		require.Greater(t, got[i].first, got[i-1].last, "ranges %d and %d overlap", i-1, i)
	}
}

func TestTSOBadRequests(t *testing.T) {
	e := newEnv(t)
	e.waitActive(5*time.Second, e.start("a"))
	for _, n := range []uint32{0, wire.MaxTSOCount + 1} {
		_, err := e.tso(n)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "count %d", n)
	}
	require.ErrorIs(t, e.raw(streamwal.CoordTSO, "{"), streamwal.ErrInvalidArgument)
	require.ErrorIs(t, e.raw(streamwal.CoordTSO, `{"count":"many"}`), streamwal.ErrInvalidArgument)
	_, err := e.tso(wire.MaxTSOCount)
	require.NoError(t, err)
}

func TestTSOStartsAbovePersistedBound(t *testing.T) {
	// A predecessor persisted a bound an hour ahead of this clock (its
	// clock was ahead, or this one stepped back): nothing at or below it
	// is handed out again.
	e := newEnv(t)
	buckets, err := Provision(testCtx(t), e.js, testCluster, 1, testLease)
	require.NoError(t, err)
	far := messages.TimeTickAt(time.Now().Add(time.Hour))
	data, err := json.Marshal(tsoRecord{Bound: far, Epoch: 1})
	require.NoError(t, err)
	_, err = buckets[streamwal.BucketTSO].Put(testCtx(t), streamwal.KeyTSOBound, data)
	require.NoError(t, err)

	c := e.start("a")
	e.waitActive(5*time.Second, c)
	first, err := e.tso(5)
	require.NoError(t, err)
	require.Greater(t, first, far)
	var rec tsoRecord
	e.load(streamwal.BucketTSO, streamwal.KeyTSOBound, &rec)
	require.Greater(t, rec.Bound, far)
	require.GreaterOrEqual(t, rec.Bound, first+4)
	require.Equal(t, epochOf(t, c), rec.Epoch)
}

// TestDeposedCoordinatorsWritesAreRefused takes the lease away from an
// active coordinator A behind its back (the lease key is deleted), lets B
// take over while A still believes it is active (A's campaign is held on
// its mutex, as a stalled process would be), and has A write through its
// tenure: every write is refused, and A steps down.
func TestDeposedCoordinatorsWritesAreRefused(t *testing.T) {
	e := newEnv(t)
	a := e.start("a")
	e.waitActive(5*time.Second, a)
	epA := epochOf(t, a)
	ta := activeTenure(a)
	b := e.start("b")

	a.mu.Lock() // A's campaign cannot step down while this is held
	locked := true
	defer func() {
		if locked {
			a.mu.Unlock()
		}
	}()
	require.NoError(t, e.kv(streamwal.BucketLeader).Delete(testCtx(t), streamwal.KeyLeader))
	require.Eventually(t, func() bool { _, ok := b.Active(); return ok }, 5*testLease, poll)
	epB := epochOf(t, b)
	require.Greater(t, epB, epA)
	require.Same(t, ta, a.active, "A believes it is active")

	ctx := testCtx(t)
	// An allocation, through A's control loop.
	_, err := ta.ctl.handleAllocate(ctx, wire.AllocateRequest{CollectionID: 7, Shards: 1})
	requireDeposed(t, err)
	require.True(t, ta.isDeposed())
	// A TimeTick request that needs a new bound.
	ta.tsoMu.Lock()
	ta.tso.bound = ta.tso.last // as if the clock had reached the bound
	ta.tsoMu.Unlock()
	_, err = ta.handleTSO(ctx, wire.TSORequest{Count: 1})
	requireDeposed(t, err)
	// The view and an assignment, through A's stores.
	requireDeposed(t, ta.ctl.assign.put(ctx, streamwal.KeyView, wire.View{Epoch: epA, Leader: a.ID()}))
	p, err := streamwal.ParsePChannel(pchannelNames(t)[0])
	require.NoError(t, err)
	requireDeposed(t, ta.ctl.assign.put(ctx, streamwal.AssignmentKey(p), wire.Assignment{PChannel: p.String(), Epoch: epA}))

	a.mu.Unlock()
	locked = false
	require.Eventually(t, func() bool { _, ok := a.Active(); return !ok }, 3*testLease, poll, "A did not step down")
	require.Never(t, func() bool { _, ok := a.Active(); return ok }, testLease, 20*time.Millisecond, "A came back while B holds the lease")
	require.Equal(t, epB, epochOf(t, b))

	// Everything persisted is B's.
	var v wire.View
	e.load(streamwal.BucketAssignments, streamwal.KeyView, &v)
	require.Equal(t, epB, v.Epoch)
	require.Equal(t, b.ID(), v.Leader)
	var asg wire.Assignment
	e.load(streamwal.BucketAssignments, streamwal.AssignmentKey(p), &asg)
	require.Equal(t, epB, asg.Epoch)
	var rec tsoRecord
	e.load(streamwal.BucketTSO, streamwal.KeyTSOBound, &rec)
	require.Equal(t, epB, rec.Epoch)
	var col wire.Collections
	e.load(streamwal.BucketVChannels, streamwal.KeyCollections, &col)
	require.Equal(t, epB, col.Epoch)
	require.NotContains(t, col.Collections, "7")

	// B serves.
	e.waitServed(b)
	var r wire.AllocateReply
	require.NoError(t, e.call(streamwal.CoordAllocate, wire.AllocateRequest{CollectionID: 7, Shards: 1}, &r))
	require.Len(t, r.VChannels, 1)
	require.Equal(t, b.ID(), e.status().Leader)
}

// TestRefusedWriteAloneStepsDown: a write refused because somebody else
// wrote the key makes the active coordinator step down even though its
// lease renewals still succeed; it takes over again once its lease lapses,
// under a new epoch.
func TestRefusedWriteAloneStepsDown(t *testing.T) {
	e := newEnv(t)
	a := e.start("a")
	e.waitActive(5*time.Second, a)
	ep := epochOf(t, a)

	data, err := json.Marshal(wire.Collections{Epoch: ep + 1000, Collections: map[string][]string{}})
	require.NoError(t, err)
	_, err = e.kv(streamwal.BucketVChannels).Put(testCtx(t), streamwal.KeyCollections, data)
	require.NoError(t, err)

	var r wire.AllocateReply
	err = e.call(streamwal.CoordAllocate, wire.AllocateRequest{CollectionID: 1, Shards: 1}, &r)
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.Contains(t, err.Error(), errDeposed.Error())

	require.Eventually(t, func() bool { _, ok := a.Active(); return !ok }, 3*testLease, poll, "did not step down")
	require.Eventually(t, func() bool { _, ok := a.Active(); return ok }, 10*testLease, poll, "did not take over again")
	require.Greater(t, epochOf(t, a), ep)
	e.waitServed(a)
	require.NoError(t, e.call(streamwal.CoordAllocate, wire.AllocateRequest{CollectionID: 1, Shards: 1}, &r))
	require.Len(t, r.VChannels, 1)
}

// TestDeposedCoordinatorHandsOutNoTimeTicks: a coordinator whose campaign
// stalls for longer than the lease (a GC pause, a stopped VM, a starved
// goroutine) is replaced by a standby; until its campaign runs again it
// still holds its tenure and answers TimeTick requests from its oracle, below
// the successor's bound. Both answer every request and the first reply
// wins, so a client can get a TimeTick smaller than one the successor
// already handed out.
func TestDeposedCoordinatorHandsOutNoTimeTicks(t *testing.T) {
	e := newEnv(t)
	a := e.start("a")
	e.waitActive(5*time.Second, a)
	var boundA tsoRecord // nothing A hands out is above it
	e.load(streamwal.BucketTSO, streamwal.KeyTSOBound, &boundA)
	b := e.start("b")

	a.mu.Lock() // A's campaign blocks at its next renewal: the lease lapses
	defer a.mu.Unlock()
	require.Eventually(t, func() bool { _, ok := b.Active(); return ok }, 10*testLease, poll)
	require.NoError(t, b.cfg.Conn.Flush()) // B's subscriptions reached the server

	// One request, every reply.
	inbox := e.nc.NewRespInbox()
	sub, err := e.nc.SubscribeSync(inbox)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, e.nc.PublishRequest(testCluster.CoordSubject(streamwal.CoordTSO), inbox, []byte(`{"count":1}`)))
	var replies []string
	for {
		m, err := sub.NextMsg(500 * time.Millisecond)
		if err != nil {
			break
		}
		replies = append(replies, string(m.Data))
	}
	require.NotEmpty(t, replies)
	// Refusals are fine (a client retries them); a TimeTick at or below
	// A's bound is not: B may already have handed out larger ones.
	for _, r := range replies {
		var env struct {
			Body *wire.TSOReply `json:"body"`
		}
		require.NoError(t, json.Unmarshal([]byte(r), &env))
		if env.Body != nil {
			require.Greater(t, env.Body.First, boundA.Bound, "a TimeTick from the deposed coordinator; replies: %v", replies)
		}
	}
}

func TestAllocate(t *testing.T) {
	e := newEnv(t)
	c := e.start("a")
	e.waitActive(5*time.Second, c)
	ep := epochOf(t, c)

	alloc := func(id int64, shards int) ([]string, error) {
		var r wire.AllocateReply
		err := e.call(streamwal.CoordAllocate, wire.AllocateRequest{CollectionID: id, Shards: shards}, &r)
		return r.VChannels, err
	}
	must := func(id int64, shards int) []string {
		t.Helper()
		vs, err := alloc(id, shards)
		require.NoError(t, err)
		require.Len(t, vs, shards)
		return vs
	}
	// pchans checks the VChannels of collection id and returns their
	// PChannels.
	pchans := func(id int64, vs []string) []string {
		t.Helper()
		var out []string
		for i, name := range vs {
			v, err := streamwal.ParseVChannel(name)
			require.NoError(t, err)
			require.Equal(t, id, v.CollectionID())
			require.Equal(t, i, v.Shard())
			out = append(out, v.PChannel().String())
		}
		require.Len(t, out, len(slices.Compact(slices.Sorted(slices.Values(out)))), "shards share a PChannel: %v", vs)
		return out
	}
	counts := func() map[string]int {
		out := map[string]int{}
		for _, a := range e.status().Channels {
			out[a.PChannel] = a.VChannels
		}
		return out
	}

	v1 := must(1, 1)
	p1 := pchans(1, v1)
	for _, shards := range []int{1, 3} {
		again, err := alloc(1, shards)
		require.NoError(t, err)
		require.Equal(t, v1, again, "a repeated allocation returns the same VChannels")
	}

	// Release, then a fresh placement: collection 2 takes the emptied
	// PChannel (all are empty, the first wins), so collection 5 goes
	// elsewhere. Collection 1 stays dropped: its ID is never allocated
	// again, and a lookup says it was dropped.
	require.NoError(t, e.call(streamwal.CoordRelease, wire.ReleaseRequest{CollectionID: 1}, nil))
	require.NoError(t, e.call(streamwal.CoordRelease, wire.ReleaseRequest{CollectionID: 1}, nil), "releasing twice")
	require.NoError(t, e.call(streamwal.CoordRelease, wire.ReleaseRequest{CollectionID: 42}, nil), "releasing an unknown collection")
	_, err := alloc(1, 1)
	require.ErrorIs(t, err, streamwal.ErrLifecycle, "a dropped collection's ID is allocated again")
	for id, dropped := range map[int64]bool{1: true, 42: false} {
		var r wire.AllocateReply
		require.NoError(t, e.call(streamwal.CoordAllocate, wire.AllocateRequest{CollectionID: id, Lookup: true}, &r))
		require.Equal(t, wire.AllocateReply{Dropped: dropped}, r, "lookup of collection %d", id)
	}
	require.Equal(t, p1, pchans(2, must(2, 1)))
	v5 := must(5, 1)
	require.NotEqual(t, p1, pchans(5, v5), "collection 5 was not placed on the least loaded PChannel")

	// The least loaded: collection 3's two shards avoid the two loaded
	// PChannels.
	loaded := []string{p1[0], pchans(5, v5)[0]}
	p3 := pchans(3, must(3, 2))
	for _, p := range p3 {
		require.NotContains(t, loaded, p)
	}
	// All equally loaded: four shards on four PChannels.
	v4 := must(4, 4)
	require.ElementsMatch(t, pchannelNames(t), pchans(4, v4))
	for p, n := range counts() {
		require.Equal(t, 2, n, "VChannels on %s", p)
	}

	// Bad requests.
	for _, req := range []wire.AllocateRequest{
		{CollectionID: 0, Shards: 1}, {CollectionID: -1, Shards: 1},
		{CollectionID: 6, Shards: 0}, {CollectionID: 6, Shards: -1}, {CollectionID: 6, Shards: 5},
	} {
		_, err := alloc(req.CollectionID, req.Shards)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "%+v", req)
	}
	require.ErrorIs(t, e.raw(streamwal.CoordAllocate, "[]"), streamwal.ErrInvalidArgument)
	require.ErrorIs(t, e.raw(streamwal.CoordRelease, "{"), streamwal.ErrInvalidArgument)

	// Persisted under the epoch.
	var col wire.Collections
	e.load(streamwal.BucketVChannels, streamwal.KeyCollections, &col)
	require.Equal(t, ep, col.Epoch)
	require.Equal(t, map[string][]string{"5": v5, "2": col.Collections["2"], "3": col.Collections["3"], "4": v4}, col.Collections)
	require.Equal(t, map[string]string{"1": ""}, col.Dropped)
	require.Len(t, col.Collections["3"], 2)
	require.Len(t, col.Collections["2"], 1)
}

// A name belongs to one live collection: another ID under it is refused
// and changes nothing, the same ID under it is a retry, and a dropped
// collection's name may be taken again.
func TestAllocateRefusesANameTakenByAnotherCollection(t *testing.T) {
	e := newEnv(t)
	e.waitActive(5*time.Second, e.start("a"))
	alloc := func(id int64, db, name string) ([]string, error) {
		var r wire.AllocateReply
		err := e.call(streamwal.CoordAllocate, wire.AllocateRequest{CollectionID: id, Shards: 1, DBName: db, Name: name}, &r)
		return r.VChannels, err
	}
	v1, err := alloc(1, "shop", "orders")
	require.NoError(t, err)
	var before wire.Collections
	e.load(streamwal.BucketVChannels, streamwal.KeyCollections, &before)

	_, err = alloc(2, "shop", "orders")
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.ErrorContains(t, err, "the name shop.orders is taken by collection 1")
	var after wire.Collections
	e.load(streamwal.BucketVChannels, streamwal.KeyCollections, &after)
	require.Equal(t, before, after, "the refused allocation changed the allocation")

	again, err := alloc(1, "shop", "orders")
	require.NoError(t, err, "a retry of the same collection")
	require.Equal(t, v1, again)
	_, err = alloc(3, "other", "orders")
	require.NoError(t, err, "another database's collection of the same name")
	_, err = alloc(4, "", "")
	require.NoError(t, err, "a collection without a name")

	require.NoError(t, e.call(streamwal.CoordRelease, wire.ReleaseRequest{CollectionID: 1}, nil))
	_, err = alloc(5, "shop", "orders")
	require.NoError(t, err, "the name of a dropped collection is free again")
}

func TestAllocateConcurrent(t *testing.T) {
	// Concurrent allocations of one shard each spread evenly.
	e := newEnv(t)
	e.waitActive(5*time.Second, e.start("a"))
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for id := range int64(12) {
		wg.Go(func() {
			errs <- e.call(streamwal.CoordAllocate, wire.AllocateRequest{CollectionID: id + 1, Shards: 1}, nil)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, a := range e.status().Channels {
		require.Equal(t, 3, a.VChannels, a.PChannel)
	}
}

func TestStatusWithoutNodes(t *testing.T) {
	e := newEnv(t)
	c := e.start("a")
	e.waitActive(5*time.Second, c)
	ep := epochOf(t, c)

	ps, err := streamwal.PChannels(DefaultPrefix, 4)
	require.NoError(t, err)
	v := e.status()
	require.Equal(t, ep, v.Epoch)
	require.Equal(t, c.ID(), v.Leader)
	require.Equal(t, ps[0].CChannel().String(), v.CChannel)
	require.Empty(t, v.Nodes)
	require.NotZero(t, v.Version)
	require.Len(t, v.Channels, 4)
	for i, a := range v.Channels {
		require.Equal(t, ps[i].String(), a.PChannel)
		require.Contains(t, []wire.State{wire.Uninitialized, wire.Unavailable}, a.State)
		require.Empty(t, a.Node)
		require.Equal(t, ep, a.Epoch)
	}

	// The watchable view says the same.
	var kvView wire.View
	e.load(streamwal.BucketAssignments, streamwal.KeyView, &kvView)
	require.Equal(t, v, kvView)

	// A balance round without nodes changes nothing.
	var bal wire.View
	require.NoError(t, e.call(streamwal.CoordBalance, struct{}{}, &bal))
	require.Equal(t, v.Channels, bal.Channels)
}

func TestPersistedLayoutRules(t *testing.T) {
	// A later coordinator configured otherwise keeps the cluster's
	// PChannels, CChannel and allocation.
	e := newEnv(t)
	a := e.start("a")
	e.waitActive(5*time.Second, a)
	var r wire.AllocateReply
	require.NoError(t, e.call(streamwal.CoordAllocate, wire.AllocateRequest{CollectionID: 9, Shards: 3}, &r))
	before := e.status()
	require.NoError(t, a.Close())

	b := e.start("b", func(c *Config) { c.PChannels = 8; c.Prefix = "other" })
	e.waitActive(5*time.Second, b)
	after := e.status()
	require.Greater(t, after.Version, before.Version)
	require.Greater(t, after.Epoch, before.Epoch)
	require.Equal(t, before.CChannel, after.CChannel)
	require.Len(t, after.Channels, 4)
	for i := range after.Channels {
		require.Equal(t, before.Channels[i].PChannel, after.Channels[i].PChannel)
		require.Equal(t, before.Channels[i].VChannels, after.Channels[i].VChannels)
	}
	var again wire.AllocateReply
	require.NoError(t, e.call(streamwal.CoordAllocate, wire.AllocateRequest{CollectionID: 9, Shards: 3}, &again))
	require.Equal(t, r.VChannels, again.VChannels)
}

// fakeNode registers and heartbeats in the nodes bucket and answers open
// and close requests, checking that every open arrives after the
// coordinator persisted the ASSIGNING state with the term it carries.
type fakeNode struct {
	e        *env
	id       streamwal.NodeID
	session  string
	mu       sync.Mutex
	serving  map[string]uint64 // what it tells it serves: PChannel -> term
	version  uint64
	opens    []wire.OpenRequest
	problems []string
	refuse   map[string]error // opens it refuses: PChannel -> why
	subs     []*nats.Subscription
	stop     chan struct{}
	done     chan struct{}
}

func (e *env) node(id streamwal.NodeID) *fakeNode { return e.nodeSession(id, "s-"+string(id)) }

func (e *env) nodeSession(id streamwal.NodeID, session string) *fakeNode {
	t := e.t
	n := &fakeNode{e: e, id: id, session: session, serving: map[string]uint64{}, stop: make(chan struct{}), done: make(chan struct{})}
	assignments := e.kv(streamwal.BucketAssignments)
	open, err := e.nc.Subscribe(testCluster.NodeSubject(id, streamwal.NodeOpen), func(m *nats.Msg) {
		var req wire.OpenRequest
		if err := wire.Decode(m.Data, &req); err != nil {
			_ = wire.Respond(m, nil, err)
			return
		}
		p := req.PChannel
		var err error
		if !p.IsZero() {
			var a wire.Assignment
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			ent, gerr := assignments.Get(ctx, streamwal.AssignmentKey(p))
			cancel()
			if gerr == nil {
				gerr = json.Unmarshal(ent.Value(), &a)
			}
			n.mu.Lock()
			if gerr != nil || a.State != wire.Assigning || a.Term != req.Term || a.Node != string(id) {
				n.problems = append(n.problems, fmt.Sprintf("open %+v with persisted %+v (%v)", req, a, gerr))
			}
			n.opens = append(n.opens, req)
			n.mu.Unlock()
		}
		if err == nil {
			err = n.refusal(p.String())
		}
		if err != nil {
			_ = wire.Respond(m, nil, err)
			return
		}
		_ = wire.Respond(m, n.serve(p.String(), req.Term), nil)
	})
	require.NoError(t, err)
	cl, err := e.nc.Subscribe(testCluster.NodeSubject(id, streamwal.NodeClose), func(m *nats.Msg) {
		var req wire.CloseRequest
		if err := wire.Decode(m.Data, &req); err == nil {
			n.unserve(req.PChannel.String())
		}
		_ = wire.Respond(m, nil, nil)
	})
	require.NoError(t, err)
	nodes := e.kv(streamwal.BucketNodes)
	go func() {
		defer close(n.done)
		tick := time.NewTicker(testNodeTTL / 4)
		defer tick.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = nodes.Put(ctx, streamwal.NodeKey(id), n.record())
			cancel()
			select {
			case <-n.stop:
				return
			case <-tick.C:
			}
		}
	}()
	n.subs = []*nats.Subscription{open, cl}
	t.Cleanup(n.kill)
	return n
}

// serve starts telling that it serves p under term, and is the open's
// reply.
func (n *fakeNode) serve(p string, term uint64) wire.OpenReply {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.serving[p] = term
	n.version++
	return wire.OpenReply{Session: n.session, Version: n.version}
}

// unserve stops telling that it serves p.
func (n *fakeNode) unserve(p string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.serving, p)
	n.version++
}

// record is its heartbeat.
func (n *fakeNode) record() []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	rec := wire.NodeRecord{Node: string(n.id), Session: n.session, Since: time.Now().UTC(), Version: n.version}
	for p, term := range n.serving {
		rec.Serving = append(rec.Serving, wire.Served{PChannel: p, Term: term})
	}
	data, err := json.Marshal(rec)
	if err != nil {
		panic(err)
	}
	return data
}

// kill stops the heartbeats and the answers (the process is gone).
func (n *fakeNode) kill() {
	n.silence()
	for _, s := range n.subs {
		_ = s.Unsubscribe()
	}
}

// leave is a graceful exit: the registration is deleted.
func (n *fakeNode) leave() {
	n.kill()
	require.NoError(n.e.t, n.e.kv(streamwal.BucketNodes).Delete(testCtx(n.e.t), streamwal.NodeKey(n.id)))
}

// silence stops the heartbeats (the node dies without a goodbye).
func (n *fakeNode) silence() {
	select {
	case <-n.stop:
	default:
		close(n.stop)
	}
	<-n.done
}

// waitChannels waits until every PChannel is in state s on node at term.
func (e *env) waitChannels(s wire.State, node string, term uint64) wire.View {
	e.t.Helper()
	var v wire.View
	require.Eventually(e.t, func() bool {
		v = wire.View{}
		if err := e.call(streamwal.CoordStatus, struct{}{}, &v); err != nil {
			return false
		}
		for _, a := range v.Channels {
			if a.State != s || a.Node != node || a.Term != term {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "channels never all %s on %q at term %d", s, node, term)
	return v
}

func TestAssignmentLifecycleWithAFakeNode(t *testing.T) {
	e := newEnv(t)
	c := e.start("a")
	e.waitActive(5*time.Second, c)

	n1 := e.node("n1")
	v := e.waitChannels(wire.Assigned, "n1", 1)
	require.Equal(t, []string{"n1"}, v.Nodes)
	n1.mu.Lock()
	require.Empty(t, n1.problems)
	require.Len(t, n1.opens, 4)
	n1.mu.Unlock()
	// Persisted as served.
	for _, a := range v.Channels {
		p, err := streamwal.ParsePChannel(a.PChannel)
		require.NoError(t, err)
		var got wire.Assignment
		e.load(streamwal.BucketAssignments, streamwal.AssignmentKey(p), &got)
		require.Equal(t, a, got)
	}

	// The node dies: its PChannels become UNAVAILABLE.
	n1.silence()
	v = e.waitChannels(wire.Unavailable, "", 1)
	require.Empty(t, v.Nodes)

	// Another node joins: they are assigned to it under the next term.
	n2 := e.node("n2")
	e.waitChannels(wire.Assigned, "n2", 2)
	n2.mu.Lock()
	require.Empty(t, n2.problems)
	require.Len(t, n2.opens, 4)
	n2.mu.Unlock()

	// It restarts (a new session): its PChannels are reassigned to the
	// new incarnation under the next term.
	n2.kill()
	n2b := e.nodeSession("n2", "s-n2-again")
	e.waitChannels(wire.Assigned, "n2", 3)
	n2b.mu.Lock()
	require.Empty(t, n2b.problems)
	require.Len(t, n2b.opens, 4)
	n2b.mu.Unlock()

	// It leaves gracefully (its registration deleted).
	n2b.leave()
	v = e.waitChannels(wire.Unavailable, "", 3)
	require.Empty(t, v.Nodes)
}

// entry is a nodes-bucket entry for decodeNodeEvent.
type entry struct {
	key   string
	value []byte
	op    njs.KeyValueOp
}

func (e entry) Bucket() string            { return "nodes" }
func (e entry) Key() string               { return e.key }
func (e entry) Value() []byte             { return e.value }
func (e entry) Revision() uint64          { return 1 }
func (e entry) Created() time.Time        { return time.Time{} }
func (e entry) Delta() uint64             { return 0 }
func (e entry) Operation() njs.KeyValueOp { return e.op }

func TestDecodeNodeEvent(t *testing.T) {
	rec, err := json.Marshal(wire.NodeRecord{Node: "n1", Session: "s1"})
	require.NoError(t, err)
	ev, ok := decodeNodeEvent(entry{key: streamwal.NodeKey("n1"), value: rec, op: njs.KeyValuePut})
	require.True(t, ok)
	require.Equal(t, streamwal.NodeID("n1"), ev.id)
	require.Equal(t, "s1", ev.record.Session)

	for _, op := range []njs.KeyValueOp{njs.KeyValueDelete, njs.KeyValuePurge} {
		ev, ok = decodeNodeEvent(entry{key: streamwal.NodeKey("n1"), op: op})
		require.True(t, ok, "%v", op)
		require.Equal(t, nodeEvent{id: "n1"}, ev)
	}

	for _, bad := range []entry{
		{key: streamwal.NodeKey("n1"), value: []byte("{"), op: njs.KeyValuePut},
		{key: streamwal.NodeKey("n1"), value: []byte(`{"node":"bad id!"}`), op: njs.KeyValuePut},
		{key: "node.", op: njs.KeyValueDelete},
		{key: "node.bad id!", op: njs.KeyValueDelete},
	} {
		_, ok := decodeNodeEvent(bad)
		require.False(t, ok, "%+v", bad)
	}
}
