package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
	"github.com/streamwal/streamwal/services/wire"
)

// Load shape of TestTruncationLosesNothingAcknowledged.
const (
	trAppenders  = 8
	trShards     = 3
	trCollection = 77
	trRoundAcks  = 300 // plain inserts acknowledged per round, at least
	// trDupWindow is the streams' duplicate window: short, since
	// truncation never passes it. A client's retry that reaches a stream
	// later than that after an earlier attempt landed is stored again, as
	// NATS deduplicates within the window only; the check tells those
	// apart from any other duplicate.
	trDupWindow = time.Second
)

// trCluster names the cluster of TestTruncationLosesNothingAcknowledged.
// The client's local bypass finds the WALs of this process by cluster and
// PChannel alone, so tests that run in parallel with clients need
// clusters of their own names.
const trCluster = "trunc"

// trOptions are those of a cluster whose nodes truncate their streams as
// soon as what lies below is flushed and checkpointed, seal segments of a
// few KiB, persist and truncate every 100 ms, and restart under the same
// IDs on srv's storage. The duplicate window, which truncation never
// passes, is short.
func trOptions(srv *embedded.Server) system.Options {
	return system.Options{Cluster: trCluster, Server: srv, Nodes: 2,
		Coord: coord.Config{PChannels: 4, ReclaimLease: true},
		Node: node.Config{Backend: jetstream.Options{DuplicateWindow: trDupWindow}, Recovery: node.RecoveryOptions{
			Retain:           node.RetainNothing,
			TruncateInterval: 100 * time.Millisecond,
			Cadence:          recovery.Cadence{Interval: 100 * time.Millisecond},
			Shard:            shard.Config{Capacity: 3 << 10, Jitter: -1},
		}}}
}

// currentLocal is the local bypass of a client that outlives the systems
// of its test: it appends through the nodes of the system started last
// (a restarted system replaces the one before it).
type currentLocal struct{ s atomic.Pointer[system.System] }

// AppendLocal appends through the current system's nodes (client.Local).
func (l *currentLocal) AppendLocal(ctx context.Context, c streamwal.Cluster, p streamwal.PChannel, msgs []*messages.MutableMessage) ([]*messages.ImmutableMessage, []error, bool) {
	s := l.s.Load()
	if s == nil {
		return nil, nil, false
	}
	return s.Local().AppendLocal(ctx, c, p, msgs)
}

// reconnectingClient is a client of cluster on a connection to srv of
// its own that reconnects through server restarts; both are closed with
// the test.
func reconnectingClient(t *testing.T, srv *embedded.Server, cluster streamwal.Cluster, opts ...client.Option) *client.Client {
	t.Helper()
	nc, err := srv.Connect(nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	c, err := client.New(nc, append([]client.Option{client.WithCluster(cluster)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// tiersOf is a backend that sees the archive, on a connection to srv of
// its own that reconnects through server restarts; closed with the test.
func tiersOf(t *testing.T, srv *embedded.Server, codec *messages.Codec) *jetstream.JetStream {
	t.Helper()
	nc, err := srv.Connect(nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	be, err := jetstream.New(nc, codec, jetstream.Options{Archive: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = be.Close() })
	return be
}

// trLoad is a clLoad (plain appends of one to four messages, committed
// and rolled-back transactions) with ManualFlushes besides.
type trLoad struct {
	*clLoad
	running   bool // a round runs: l.stop is open
	fmu       sync.Mutex
	flushes   map[trAt]bool // acknowledged ManualFlushes
	flushErrs []error
}

// trAt is a message of a VChannel.
type trAt struct {
	v  streamwal.VChannel
	id messages.MessageID
}

// startRound runs n appenders until stopRound; round seeds them.
func (l *trLoad) startRound(n, round int) {
	l.stop, l.running = make(chan struct{}), true
	for g := range n {
		l.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(round), uint64(g)))
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				v := l.vs[rng.IntN(len(l.vs))]
				name := fmt.Sprintf("r%d-g%d-%d", round, g, i)
				switch k := rng.IntN(40); {
				case k == 0:
					l.flush(v)
				case k < 28:
					l.appendPlain(v, "p"+name, 1+rng.IntN(4))
				default:
					l.runTxn(rng, v, "t"+name)
				}
			}
		})
	}
}

// halt tells the appenders of the round to stop, if one runs.
func (l *trLoad) halt() {
	if l.running {
		close(l.stop)
		l.running = false
	}
}

// stopRound stops the appenders of the round and waits for them.
func (l *trLoad) stopRound() {
	l.halt()
	l.wg.Wait()
}

// flush appends a ManualFlush of the collection to v and books it; the
// client must absorb every retriable error.
func (l *trLoad) flush(v streamwal.VChannel) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	m, err := l.c.Codec().NewBody(messages.TypeManualFlush, v, messages.ManualFlushBody{CollectionID: trCollection})
	if err == nil {
		var res []client.AppendResult
		if res, err = l.c.Append(ctx, m); err == nil {
			l.fmu.Lock()
			l.flushes[trAt{v, res[0].ID}] = true
			l.fmu.Unlock()
			return
		}
	}
	l.fmu.Lock()
	defer l.fmu.Unlock()
	l.flushErrs = append(l.flushErrs, fmt.Errorf("ManualFlush on %s: %w", v, err))
}

// maxAcked is the largest MessageID acknowledged on each PChannel so far:
// plain inserts, commits and flushes.
func (l *trLoad) maxAcked() map[streamwal.PChannel]messages.MessageID {
	out := map[streamwal.PChannel]messages.MessageID{}
	note := func(v streamwal.VChannel, id messages.MessageID) {
		out[v.PChannel()] = max(out[v.PChannel()], id)
	}
	l.mu.Lock()
	for _, p := range l.plain {
		note(p.v, p.id)
	}
	for k, tx := range l.committed {
		note(k.v, tx.commit.ID)
	}
	l.mu.Unlock()
	l.fmu.Lock()
	for at := range l.flushes {
		note(at.v, at.id)
	}
	l.fmu.Unlock()
	return out
}

// pchannels are the PChannels of the load's VChannels.
func (l *trLoad) pchannels() []streamwal.PChannel {
	var out []streamwal.PChannel
	seen := map[streamwal.PChannel]bool{}
	for _, v := range l.vs {
		if p := v.PChannel(); !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// firsts is the first message each stream of ps keeps, for those whose
// state could be read, and the last error of those whose could not.
func firsts(ctx context.Context, be *jetstream.JetStream, ps []streamwal.PChannel) (map[streamwal.PChannel]messages.MessageID, error) {
	out := map[streamwal.PChannel]messages.MessageID{}
	var last error
	for _, p := range ps {
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := be.State(callCtx, p)
		cancel()
		if err != nil {
			last = fmt.Errorf("state of %s: %w", p, err)
			continue
		}
		out[p] = st.First
	}
	return out, last
}

// allFirsts is firsts once every state could be read.
func allFirsts(t *testing.T, be *jetstream.JetStream, ps []streamwal.PChannel) map[streamwal.PChannel]messages.MessageID {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		got, err := firsts(testContext(t), be, ps)
		if err == nil {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the states of %v could not be read within 30s (read: %v; %v)", ps, got, err)
		}
		<-time.After(20 * time.Millisecond) // the polling period
	}
}

// waitTruncated waits until the stream of every PChannel of ps keeps
// nothing at or below below[p].
func waitTruncated(t *testing.T, be *jetstream.JetStream, ps []streamwal.PChannel, below map[streamwal.PChannel]messages.MessageID, what string) map[streamwal.PChannel]messages.MessageID {
	t.Helper()
	ctx := testContext(t)
	for deadline := time.Now().Add(30 * time.Second); ; {
		got, err := firsts(ctx, be, ps)
		done := err == nil
		for _, p := range ps {
			done = done && got[p] > below[p]
		}
		if done {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: streams not truncated past %v within 30s (first kept: %v; %v)", what, below, got, err)
		}
		<-time.After(20 * time.Millisecond) // the polling period
	}
}

// round waits until the load acknowledged trRoundAcks more plain inserts
// and every stream it writes was truncated again.
func (l *trLoad) round(t *testing.T, s *system.System, be *jetstream.JetStream, what string) {
	t.Helper()
	before := allFirsts(t, be, l.pchannels())
	target := l.plainCount() + trRoundAcks
	for deadline := time.Now().Add(45 * time.Second); l.plainCount() < target; {
		if time.Now().After(deadline) {
			l.mu.Lock()
			perV := fmt.Sprint(l.perV)
			l.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			v, err := s.View(ctx)
			cancel()
			t.Fatalf("%s: the load made no progress in 45s: %d of %d plain inserts acknowledged (per VChannel %s); view %+v (%v)",
				what, l.plainCount(), target, perV, v, err)
		}
		<-time.After(5 * time.Millisecond) // the polling period
	}
	waitTruncated(t, be, l.pchannels(), before, what)
}

// nodeServing is the node the view says serves p.
func nodeServing(t *testing.T, s *system.System, p streamwal.PChannel) streamwal.NodeID {
	t.Helper()
	for _, a := range currentView(t, s).Channels {
		if a.PChannel == p.String() && a.Node != "" {
			return streamwal.NodeID(a.Node)
		}
	}
	t.Fatalf("no node serves %s", p)
	return ""
}

// TestTruncationLosesNothingAcknowledged: nodes that truncate their
// streams as soon as possible (RetainNothing, every 100 ms, segments of a
// few KiB sealing and flushing all the time, ManualFlushes besides) under
// a load of plain appends of one to four messages and of transactions
// committed and rolled back, from several goroutines on the VChannels of
// one collection; in between, a node crashes and restarts under its ID,
// the whole cluster crashes and restarts with its server on the same
// storage, and the whole cluster stops gracefully and restarts with its
// server. Then, once the streams were truncated past everything the load
// wrote, a reader from the start of every VChannel (the archive below
// the truncation point, then the stream) reads exactly what was
// acknowledged, each once, at its MessageID and TimeTick, no body of a
// rolled-back transaction, in TimeTick order, transactions whole.
func TestTruncationLosesNothingAcknowledged(t *testing.T) {
	// Not parallel: its rounds of load, crashes and restarts wait for
	// truncation, and on a loaded machine the other clusters of the
	// package would slow it past its deadlines.
	// fsync before ack, as streamwal serve runs by default (the WAL then
	// group-commits; the pipelined writer of a server without fsync can
	// stall after a change of owner, see the jetstream package notes).
	srv := embedded.StartTest(t, func(o *embedded.Options) { o.SyncAlways = true })
	o := trOptions(srv)
	s := startOn(t, o)
	local := &currentLocal{}
	local.s.Store(s)
	l := &trLoad{clLoad: &clLoad{plain: map[string]clPlain{}, perV: map[streamwal.VChannel]int{},
		committed: map[clTxnKey]*clTxn{}, rolledBack: map[clTxnKey]*clTxn{}, failed: map[clTxnKey]*clTxn{},
		uncertain: map[clTxnKey]*clTxn{}, forbidden: map[string]bool{}, txnCodes: map[streamwal.Code]int{}},
		flushes: map[trAt]bool{}}
	l.dupWindow = trDupWindow
	// On a failure, the appenders are told to stop, the client closes
	// (failing what they still wait for), then they are waited for.
	t.Cleanup(l.wg.Wait)
	c := reconnectingClient(t, srv, trCluster, client.WithLocal(local))
	t.Cleanup(l.halt)
	be := tiersOf(t, srv, c.Codec())
	ctx := testContext(t)

	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "db", Name: "truncated", ID: trCollection, Shards: trShards})
	require.NoError(t, err)
	require.Len(t, vs, trShards)
	l.c, l.vs = c, vs
	t.Logf("VChannels %v on PChannels %v", vs, l.pchannels())
	clock := startStoreClock(t, srv, c.Codec().Cluster(), l.pchannels())
	l.storedAt = clock.storedAt

	// Round 0, then a node crashes under load and restarts under its ID.
	l.startRound(trAppenders, 0)
	l.round(t, s, be, "round 0")
	victim := nodeServing(t, s, vs[0].PChannel())
	s.StopNode(victim, true)
	n, err := s.StartNode(testContext(t), victim)
	require.NoError(t, err)
	viewWhen(t, s, "the restarted node serves again", func(v wire.View) bool {
		for _, a := range v.Channels {
			if !a.Serving || a.Node == string(victim) && a.Session != n.Session() {
				return false
			}
		}
		return true
	})
	l.round(t, s, be, "round 1, after a node crash")

	// The whole cluster crashes under load; it restarts with its server
	// on the same storage.
	s.Crash()
	require.NoError(t, srv.Restart())
	s = startOn(t, o)
	local.s.Store(s)
	l.round(t, s, be, "round 2, after a crash of everything")

	// The whole cluster stops gracefully, without load, and restarts with
	// its server.
	l.stopRound()
	stopNodes(s)
	s.Close()
	require.NoError(t, srv.Restart())
	s = startOn(t, o)
	local.s.Store(s)
	l.startRound(trAppenders, 3)
	l.round(t, s, be, "round 3, after a graceful restart of everything")
	l.stopRound()

	// Everything sealed, a last insert per VChannel for its reader to stop
	// at, and the streams truncated past everything the load wrote.
	for _, v := range vs {
		l.flush(v)
	}
	written := l.maxAcked()
	ctx = testContext(t) // the rounds may have used up the first one's time
	for _, v := range vs {
		res, err := c.Append(ctx, clInsert(t, c, v, clSentinel(v)))
		require.NoError(t, err)
		l.plain[clSentinel(v)] = clPlain{v: v, id: res[0].ID, tt: res[0].TimeTick}
	}
	clock.caughtUp(t, be)
	kept := waitTruncated(t, be, l.pchannels(), written, "after the load")
	t.Logf("the load wrote up to %v; the streams keep from %v", written, kept)

	// A new client reads every VChannel from the start.
	rc := reconnectingClient(t, srv, trCluster)
	got := map[streamwal.VChannel][]*messages.ImmutableMessage{}
	readFlushes := map[trAt]int{}
	for _, v := range vs {
		msgs := trReadAll(t, rc, v)
		for _, m := range msgs {
			if m.Type() == messages.TypeManualFlush {
				at := trAt{v, m.ID()}
				require.True(t, l.flushes[at], "ManualFlush %d read on %s was not acknowledged there", m.ID(), v)
				readFlushes[at]++
				continue
			}
			got[v] = append(got[v], m)
		}
		require.Less(t, msgs[0].ID(), kept[v.PChannel()], "%s was read from the archive", v)
	}
	require.Empty(t, l.flushErrs, "ManualFlushes see no error: the client retries through the restarts")
	for at := range l.flushes {
		require.Equal(t, 1, readFlushes[at], "acknowledged ManualFlush %d on %s read %d times", at.id, at.v, readFlushes[at])
	}
	trReport(t, l, got)
	l.check(t, got)

	flushed := 0
	for _, v := range vs {
		segs, err := rc.Segments(ctx, v)
		require.NoError(t, err)
		for _, sg := range segs {
			if sg.State == shard.Flushed.String() {
				flushed++
			}
		}
	}
	t.Logf("%d plain inserts, %d ManualFlushes acknowledged; txns: %d committed, %d rolled back, %d failed, %d of unknown outcome (codes %v); %d segments flushed",
		len(l.plain), len(l.flushes), len(l.committed), len(l.rolledBack), len(l.failed)+l.beginFails, len(l.uncertain), l.txnCodes, flushed)
	require.Greater(t, flushed, 3*trShards, "segments sealed and flushed all along")
}

// trReport logs every acknowledged insert read more than once or
// elsewhere than acknowledged, and every one not read, before check stops
// at the first.
func trReport(t *testing.T, l *trLoad, got map[streamwal.VChannel][]*messages.ImmutableMessage) {
	t.Helper()
	read := map[string][]string{}
	for v, msgs := range got {
		for _, m := range msgs {
			where := fmt.Sprintf("%s@%d", v, m.ID())
			switch m.Type() {
			case messages.TypeInsert:
				read[string(m.Payload())] = append(read[string(m.Payload())], where)
			case messages.TypeTxn:
				for _, b := range m.TxnBody() {
					read[string(b.Payload())] = append(read[string(b.Payload())], where+"(txn)")
				}
			}
		}
	}
	bad := 0
	for name, p := range l.plain {
		want := fmt.Sprintf("%s@%d", p.v, p.id)
		if where := read[name]; len(where) != 1 || where[0] != want {
			if bad++; bad <= 20 {
				t.Logf("acknowledged insert %s at %s, read at %v", name, want, where)
			}
		}
	}
	if bad > 0 {
		t.Logf("%d acknowledged inserts not read exactly once where acknowledged", bad)
	}
}

// trReadAll reads v from the start with c up to its sentinel: inserts,
// transactions, its CreateCollection and ManualFlushes.
func trReadAll(t *testing.T, c *client.Client, v streamwal.VChannel) []*messages.ImmutableMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	s, err := c.Read(ctx, client.ReadOptions{VChannel: v, Start: client.Earliest(), Types: []*messages.Type{
		messages.TypeInsert, messages.TypeTxn, messages.TypeCreateCollection, messages.TypeManualFlush}})
	require.NoError(t, err)
	defer s.Close()
	var out []*messages.ImmutableMessage
	for m, err := range s.All(ctx) {
		require.NoError(t, err, "read %s after %d messages", v, len(out))
		out = append(out, m)
		if m.Type() == messages.TypeInsert && string(m.Payload()) == clSentinel(v) {
			return out
		}
	}
	t.Fatalf("read %s ended after %d messages without its sentinel", v, len(out))
	return nil
}

// storeClock records when each PChannel's stream stored each message: the
// server's clock, on which its duplicate window runs (a message's
// TimeTick is drawn before it is sent). An ordered consumer per stream
// reads it from its first message on, through the server's restarts,
// before truncation archives what the load wrote (archived messages keep
// no store time).
type storeClock struct {
	mu   sync.Mutex
	at   map[streamwal.PChannel]map[messages.MessageID]time.Time
	last map[streamwal.PChannel]messages.MessageID
	cons []njs.ConsumeContext
}

// startStoreClock starts recording the streams of ps; it stops with t.
func startStoreClock(t *testing.T, srv *embedded.Server, cl streamwal.Cluster, ps []streamwal.PChannel) *storeClock {
	t.Helper()
	nc, err := srv.Connect(nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := njs.New(nc)
	require.NoError(t, err)
	sc := &storeClock{at: map[streamwal.PChannel]map[messages.MessageID]time.Time{}, last: map[streamwal.PChannel]messages.MessageID{}}
	for _, p := range ps {
		sc.at[p] = map[messages.MessageID]time.Time{}
	}
	for _, p := range ps {
		cons, err := js.OrderedConsumer(testContext(t), cl.StreamName(p), njs.OrderedConsumerConfig{HeadersOnly: true})
		require.NoError(t, err)
		cc, err := cons.Consume(func(m njs.Msg) {
			if md, err := m.Metadata(); err == nil {
				sc.record(p, messages.MessageID(md.Sequence.Stream), md.Timestamp)
			}
		})
		require.NoError(t, err)
		sc.cons = append(sc.cons, cc)
	}
	t.Cleanup(sc.stop)
	return sc
}

// record notes that p's stream stored id at at.
func (sc *storeClock) record(p streamwal.PChannel, id messages.MessageID, at time.Time) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.at[p][id] = at
	sc.last[p] = max(sc.last[p], id)
}

// stop stops the consumers.
func (sc *storeClock) stop() {
	for _, cc := range sc.cons {
		cc.Stop()
	}
}

// storedAt is when m's stream stored it (an error if it was not seen).
func (sc *storeClock) storedAt(m *messages.ImmutableMessage) (time.Time, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	at, ok := sc.at[m.PChannel()][m.ID()]
	if !ok {
		return time.Time{}, fmt.Errorf("no store time recorded for %s@%d", m.PChannel(), m.ID())
	}
	return at, nil
}

// caughtUp waits, for at most a minute, until the clock has seen every
// message the streams hold now. A clock that does not get there leaves
// the copies it missed to be timed by their TimeTicks.
func (sc *storeClock) caughtUp(t *testing.T, be *jetstream.JetStream) {
	t.Helper()
	ctx := testContext(t)
	deadline := time.Now().Add(time.Minute)
	for p := range sc.at {
		st, err := be.State(ctx, p)
		require.NoError(t, err)
		for !sc.reached(p, st.Last) {
			if time.Now().After(deadline) {
				t.Logf("the store clock of %s did not reach %d", p, st.Last)
				break
			}
			time.Sleep(20 * time.Millisecond) // polling the clock's progress
		}
		sc.mu.Lock()
		t.Logf("the store clock of %s holds %d store times, through %d", p, len(sc.at[p]), sc.last[p])
		sc.mu.Unlock()
	}
}

// reached reports whether the clock of p has seen id.
func (sc *storeClock) reached(p streamwal.PChannel, id messages.MessageID) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.last[p] >= id
}
