package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
)

// Tests of the order promise of client.Append (issue 13, item 5): the
// messages of one call to one VChannel land in the order given, whatever
// the call's size and whatever the retries.

// aoModes are the two paths from a client to a node of its own process.
var aoModes = []struct {
	name string
	opts []client.Option
}{
	{"LocalBypass", nil},
	{"NATS", []client.Option{client.WithoutLocalBypass()}},
}

// aoCollections numbers the collections of these tests.
var aoCollections atomic.Int64

// aoClient starts a client of s's cluster on a connection of its own.
func aoClient(t *testing.T, s *system.System, opts ...client.Option) *client.Client {
	t.Helper()
	nc, err := s.Server.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return aoClientOn(t, s, nc, opts...)
}

// aoClientOn starts a client of s's cluster on nc, closed with the test.
func aoClientOn(t *testing.T, s *system.System, nc *nats.Conn, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(nc, append([]client.Option{client.WithCluster(s.Codec.Cluster()), client.WithLocal(s.Local())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// aoCollection creates a one-shard collection and returns its VChannel.
func aoCollection(t *testing.T, ctx context.Context, c *client.Client) streamwal.VChannel {
	t.Helper()
	id := 1000 + aoCollections.Add(1)
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "order", Name: fmt.Sprint("c", id), ID: id})
	require.NoError(t, err)
	require.Len(t, vs, 1)
	return vs[0]
}

// aoInsert builds an Insert whose payload is payload.
func aoInsert(t *testing.T, c *client.Client, v streamwal.VChannel, payload string) *messages.MutableMessage {
	t.Helper()
	m, err := c.Codec().New(messages.TypeInsert, v, []byte(payload))
	require.NoError(t, err)
	return m
}

// aoStored is an Insert as read back: its payload's name and MessageID.
type aoStored struct {
	name string
	id   messages.MessageID
}

// aoReadBack appends a sentinel to v and reads v's Inserts from the start
// up to it (excluded), naming each by the first nameLen bytes of its
// payload (all of it when 0).
func aoReadBack(t *testing.T, ctx context.Context, c *client.Client, v streamwal.VChannel, nameLen int) []aoStored {
	t.Helper()
	end := "end-" + v.String()
	_, err := c.Append(ctx, aoInsert(t, c, v, end))
	require.NoError(t, err)
	s, err := c.Read(ctx, client.ReadOptions{VChannel: v, Start: client.Earliest(), Types: []*messages.Type{messages.TypeInsert}})
	require.NoError(t, err)
	defer s.Close()
	var out []aoStored
	for m, err := range s.All(ctx) {
		require.NoError(t, err, "read %s after %d inserts", v, len(out))
		name := string(m.Payload())
		if name == end {
			return out
		}
		if nameLen > 0 && len(name) > nameLen {
			name = name[:nameLen]
		}
		out = append(out, aoStored{name: name, id: m.ID()})
	}
	t.Fatalf("read %s ended after %d inserts without its sentinel", v, len(out))
	return nil
}

// aoRequireSequence fails unless got holds exactly want, in order, and
// says how many places are wrong rather than printing both.
func aoRequireSequence(t *testing.T, want []string, got []aoStored) {
	t.Helper()
	require.Len(t, got, len(want), "every message of the call stored once")
	bad, first := 0, -1
	for i := range want {
		if got[i].name != want[i] {
			bad++
			if first < 0 {
				first = i
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d messages stored out of call order; at position %d %s is stored where %s was given",
			bad, len(want), first, got[first].name, want[first])
	}
}

// aoRequireIncreasing fails unless the results' MessageIDs increase.
func aoRequireIncreasing(t *testing.T, res []client.AppendResult) {
	t.Helper()
	for i := 1; i < len(res); i++ {
		require.Greater(t, res[i].ID, res[i-1].ID, "result %d landed before result %d", i, i-1)
	}
}

// TestAppendLargeCallLandsInOrder: one Append of twenty requests' worth
// of small messages to one VChannel stores them in call order, each once,
// through the local bypass and through NATS. The client's requests carry
// aoLargeBatch messages instead of the default 1000, so that the call
// still spans twenty requests, more than the client keeps in flight at
// once, with a tenth of the messages to append and read back (20,000
// took most of the test's 20 s).
func TestAppendLargeCallLandsInOrder(t *testing.T) {
	s := startSystem(t, 1, 1)
	waitServing(t, s, false)
	for _, m := range aoModes {
		t.Run(m.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := aoClient(t, s, append(slices.Clip(m.opts), client.WithMaxBatch(aoLargeBatch))...)
			v := aoCollection(t, ctx, c)
			const n = 20 * aoLargeBatch
			require.Greater(t, n/aoLargeBatch, client.DefaultMaxInFlight, "the call takes more requests than fly at once")
			names := make([]string, n)
			msgs := make([]*messages.MutableMessage, n)
			for i := range msgs {
				names[i] = fmt.Sprintf("%s-%05d", m.name, i)
				msgs[i] = aoInsert(t, c, v, names[i])
			}
			began := time.Now()
			res, err := c.Append(ctx, msgs...)
			require.NoError(t, err)
			t.Logf("%d messages appended in %v", n, time.Since(began).Round(time.Millisecond))
			aoRequireIncreasing(t, res)
			aoRequireSequence(t, names, aoReadBack(t, ctx, c, v, 0))
		})
	}
}

// aoLargeBatch is the request size of TestAppendLargeCallLandsInOrder's
// client.
const aoLargeBatch = 100

// TestAppendLargeMessagesLandInOrder: one Append of twelve messages of
// about 1 MB each, more than one request carries under the server's
// maximum payload, stores them in call order.
func TestAppendLargeMessagesLandInOrder(t *testing.T) {
	s := startSystem(t, 1, 1)
	waitServing(t, s, false)
	const n, size = 12, 1_000_000
	for _, m := range aoModes {
		t.Run(m.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := aoClient(t, s, m.opts...)
			require.Less(t, s.Conn().MaxPayload(), int64(n*size), "the call needs more than one request")
			v := aoCollection(t, ctx, c)
			names := make([]string, n)
			msgs := make([]*messages.MutableMessage, n)
			for i := range msgs {
				names[i] = fmt.Sprintf("big-%02d", i)
				msgs[i] = aoInsert(t, c, v, names[i]+strings.Repeat("x", size-len(names[i])))
			}
			res, err := c.Append(ctx, msgs...)
			require.NoError(t, err)
			aoRequireIncreasing(t, res)
			aoRequireSequence(t, names, aoReadBack(t, ctx, c, v, len(names[0])))
		})
	}
}

// Shape of TestAppendCallOrderThroughPauses.
const (
	aoWriters   = 32
	aoVChannels = 4
	aoPauses    = 3
	aoPause     = 2 * time.Second
	aoProgress  = 50 // calls acknowledged before the first pause and after each
	aoMinCall   = 5
	aoMaxCall   = 50
	// aoTimeout is the client's request timeout: shorter than a pause, so
	// that every pause makes requests time out and be retried.
	aoTimeout = time.Second
	// aoMaxBatch is the client's request size: calls of up to aoMaxCall
	// messages often straddle two requests, so that they go out in chunks.
	aoMaxBatch = 100
)

// TestAppendCallOrderThroughPauses: 32 goroutines append calls of 5 to
// 50 messages to four VChannels (on four PChannels) through NATS while the
// client's link to the server stops three times for 2 s: a proxy holds
// what either side sends, then lets it through, so that to the client the
// server stops answering. Requests time out and are retried (the retry
// log hook must have counted some); their first attempts, and the retries
// sent during the pause, reach the node together on resume, so that
// retries race their originals there ("in flight" refusals) or repeat
// what landed (deduplicated by message ID). Every acknowledged message is
// stored exactly once, where it was acknowledged; no message is stored
// twice; within every call the stored order is the call order. A call may
// fail only by running out of its deadline (the stored part of such a
// call is checked for order too).
//
// Only the client goes through the proxy: the node and the coordinator
// stay connected, so a pause is the client's view of a stalled server and
// not a node failover, which TestClientEndToEnd covers. The server runs
// as `streamwal serve` runs it, with SyncAlways, so that the node
// group-commits: without group commit, every already stored message ID
// in a retried request costs the backend one recovery of its writer, and
// the retries of one pause take minutes to clear.
func TestAppendCallOrderThroughPauses(t *testing.T) {
	s := aoStartSynced(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := aoClient(t, s)
	vs := make([]streamwal.VChannel, aoVChannels)
	for i := range vs {
		vs[i] = aoCollection(t, ctx, admin)
	}

	proxy := newAOProxy(t, s.Server.Addr())
	var retries atomic.Int64
	countRetries := zerolog.HookFunc(func(_ *zerolog.Event, _ zerolog.Level, msg string) {
		if msg == "append retried" {
			retries.Add(1)
		}
	})
	nc, err := nats.Connect(proxy.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	c := aoClientOn(t, s, nc, client.WithoutLocalBypass(), client.WithTimeout(aoTimeout),
		client.WithMaxBatch(aoMaxBatch), client.WithRetryMaxInterval(200*time.Millisecond),
		client.WithLogger(zerolog.New(io.Discard).Level(zerolog.DebugLevel).Hook(countRetries)))

	l := &aoLoad{c: c, vs: vs, stop: make(chan struct{})}
	l.start(aoWriters)
	l.waitCalls(t, aoProgress)
	for range aoPauses {
		before := retries.Load()
		proxy.Pause()
		<-time.After(aoPause) // the fault's length, not a wait for anything
		proxy.Resume()
		resumed := time.Now()
		l.waitCalls(t, aoProgress)
		t.Logf("pause after %d calls: %d requests retried, %v to %d more calls", l.count(), retries.Load()-before,
			time.Since(resumed).Round(time.Millisecond), aoProgress)
	}
	l.finish(t)
	require.Positive(t, retries.Load(), "the pauses made the client retry")

	stored := map[streamwal.VChannel][]aoStored{}
	for _, v := range vs {
		stored[v] = aoReadBack(t, ctx, admin, v, 0)
	}
	msgs := l.check(t, stored)
	t.Logf("%d calls (%d messages) acknowledged and stored in order through %d pauses, %d given up at their deadline (stored in order too); %d requests retried",
		l.acked, msgs, aoPauses, l.gaveUp, retries.Load())
}

// aoStartSynced starts a one-coordinator, one-node cluster on a server
// that fsyncs every write, so that the node group-commits.
func aoStartSynced(t *testing.T) *system.System {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := system.Start(ctx, system.Options{Cluster: "it",
		ServerOptions: embedded.Options{StoreDir: t.TempDir(), SyncAlways: true}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	waitServing(t, s, false)
	return s
}

// aoCallTimeout bounds one call of TestAppendCallOrderThroughPauses.
const aoCallTimeout = 30 * time.Second

// aoCall is a call: its messages' names in call order and, once
// acknowledged, their MessageIDs.
type aoCall struct {
	names []string
	ids   []messages.MessageID // nil unless acknowledged
}

// aoLoad runs appenders of multi-message calls and books every outcome.
type aoLoad struct {
	c       *client.Client
	vs      []streamwal.VChannel
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	calls   []aoCall
	acked   int
	gaveUp  int // calls whose deadline ended first
	unknown []error
}

// start runs n appenders until finish.
func (l *aoLoad) start(n int) {
	for g := range n {
		l.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 13))
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				l.call(g, i, l.vs[rng.IntN(len(l.vs))], aoMinCall+rng.IntN(aoMaxCall-aoMinCall+1))
			}
		})
	}
}

// call appends n messages to v in one call and books the outcome.
func (l *aoLoad) call(g, i int, v streamwal.VChannel, n int) {
	call := aoCall{names: make([]string, n)}
	msgs := make([]*messages.MutableMessage, n)
	for k := range msgs {
		call.names[k] = fmt.Sprintf("g%d-c%d-m%d", g, i, k)
		m, err := l.c.Codec().New(messages.TypeInsert, v, []byte(call.names[k]))
		if err != nil {
			l.book(call, err)
			return
		}
		msgs[k] = m
	}
	ctx, cancel := context.WithTimeout(context.Background(), aoCallTimeout)
	defer cancel()
	res, err := l.c.Append(ctx, msgs...)
	if err != nil {
		l.book(call, fmt.Errorf("call %d of appender %d: %w", i, g, err))
		return
	}
	call.ids = make([]messages.MessageID, n)
	for k, r := range res {
		call.ids[k] = r.ID
	}
	l.book(call, nil)
}

// book records a call and its outcome: acknowledged, given up at its
// deadline (its messages may or may not have landed), or an error that
// fails the test.
func (l *aoLoad) book(call aoCall, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, call)
	switch {
	case err == nil:
		l.acked++
	case errors.Is(err, streamwal.ErrUnknownOutcome) && errors.Is(err, context.DeadlineExceeded):
		l.gaveUp++
	default:
		l.unknown = append(l.unknown, err)
	}
}

// count is how many calls were acknowledged.
func (l *aoLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acked
}

// waitCalls waits until n more calls were acknowledged.
func (l *aoLoad) waitCalls(t *testing.T, n int) {
	t.Helper()
	target := l.count() + n
	deadline := time.Now().Add(2 * aoCallTimeout)
	for l.count() < target {
		if time.Now().After(deadline) {
			t.Fatalf("the appenders made no progress: %d of %d calls acknowledged", l.count(), target)
		}
		<-time.After(5 * time.Millisecond)
	}
}

// finish stops the appenders; a call may only have failed by running out
// of time.
func (l *aoLoad) finish(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	require.Empty(t, l.unknown, "calls failed otherwise than by their deadline")
}

// check compares what was stored with the calls and returns how many
// messages the acknowledged ones held: every acknowledged message is
// stored once, where it was acknowledged; no message is stored twice; the
// stored messages of every call, acknowledged or not, are in call order.
func (l *aoLoad) check(t *testing.T, stored map[streamwal.VChannel][]aoStored) int {
	t.Helper()
	at := map[string]messages.MessageID{}
	for v, msgs := range stored {
		for _, m := range msgs {
			_, dup := at[m.name]
			require.False(t, dup, "%s stored twice on %s", m.name, v)
			at[m.name] = m.id
		}
	}
	total, misordered := 0, 0
	var example string
	for _, call := range l.calls {
		var prev string
		for k, name := range call.names {
			id, ok := at[name]
			if call.ids != nil {
				require.True(t, ok, "acknowledged %s is not stored", name)
				require.Equal(t, call.ids[k], id, "%s is stored elsewhere than acknowledged", name)
			}
			if !ok {
				continue
			}
			if prev != "" && id < at[prev] {
				misordered++
				if example == "" {
					example = fmt.Sprintf("%s at %d before %s at %d", name, id, prev, at[prev])
				}
			}
			prev = name
		}
		if call.ids != nil {
			total += len(call.names)
		}
	}
	require.Zero(t, misordered, "messages stored out of their call's order, e.g. %s", example)
	return total
}

// aoProxy forwards TCP connections to a NATS server. While paused it
// keeps reading from both sides but holds what it read (in order, per
// direction), and forwards it on Resume: to the client, a server that
// stopped answering for a while.
type aoProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	closed bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

// aoPipe is one direction of a proxied connection.
type aoPipe struct {
	to      net.Conn
	pending []byte // read, not forwarded yet
	eof     bool   // the source ended: close to once pending is out
}

// newAOProxy listens on a free local port and forwards to target until
// the test ends.
func newAOProxy(t *testing.T, target string) *aoProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &aoProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's NATS URL.
func (p *aoProxy) URL() string { return "nats://" + p.ln.Addr().String() }

// Pause holds the bytes of both directions from now on.
func (p *aoProxy) Pause() { p.setPaused(true) }

// Resume forwards what was held and lets bytes flow again.
func (p *aoProxy) Resume() { p.setPaused(false) }

// setPaused switches the pause.
func (p *aoProxy) setPaused(paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = paused
	p.cond.Broadcast()
}

// accept proxies every connection until the proxy closes.
func (p *aoProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.wg.Add(4)
		p.mu.Unlock()
		up, down := &aoPipe{to: s}, &aoPipe{to: c}
		go p.read(c, up)
		go p.forward(up)
		go p.read(s, down)
		go p.forward(down)
	}
}

// read takes what from sends into the pipe's pending bytes.
func (p *aoProxy) read(from net.Conn, l *aoPipe) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		p.mu.Lock()
		l.pending = append(l.pending, buf[:n]...)
		if err != nil {
			l.eof = true
		}
		p.cond.Broadcast()
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// forward writes the pipe's pending bytes on while not paused.
func (p *aoProxy) forward(l *aoPipe) {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		for !p.closed && (p.paused || len(l.pending) == 0 && !l.eof) {
			p.cond.Wait()
		}
		if p.closed {
			p.mu.Unlock()
			return
		}
		data, eof := l.pending, l.eof
		l.pending = nil
		p.mu.Unlock()
		if len(data) > 0 {
			if _, err := l.to.Write(data); err != nil {
				_ = l.to.Close()
				return
			}
		}
		if eof {
			_ = l.to.Close()
			return
		}
	}
}

// close stops the proxy and waits for its goroutines.
func (p *aoProxy) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.cond.Broadcast()
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
}
