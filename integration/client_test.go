package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// TestClientEndToEnd is the StreamingClient's acceptance test (issue 7):
// many goroutines append and run transactions through the client across
// four collections while readers follow every VChannel with the client's
// scanner; a node is crashed mid-load. Every acknowledged message is read
// exactly once, in strictly increasing TimeTick order per VChannel, every
// committed transaction as one Txn with its bodies in order, no body of a
// rolled-back or failed transaction ever; plain appends see no error (the
// client retries through the crash). Once through the local bypass (the
// nodes run in this process), once through NATS.
func TestClientEndToEnd(t *testing.T) {
	for _, m := range []struct {
		name string
		opts []client.Option
	}{
		{"LocalBypass", nil},
		{"NATS", []client.Option{client.WithoutLocalBypass()}},
	} {
		t.Run(m.name, func(t *testing.T) { clRunLoad(t, m.opts...) })
	}
}

// Load shape.
const (
	clAppenders   = 16
	clCollections = 4
	clBeforeCrash = 300 // plain appends acknowledged before the crash
	clAfterCrash  = 150 // and on the crashed node's VChannel after it
	// clStall is an append latency only a crash explains (the node TTL is
	// a second).
	clStall = 250 * time.Millisecond
)

// clPlain is an acknowledged plain insert.
type clPlain struct {
	v  streamwal.VChannel
	id messages.MessageID
	tt messages.TimeTick
}

// clTxnKey identifies a transaction.
type clTxnKey struct {
	v  streamwal.VChannel
	id messages.TxnID
}

// clTxn is a transaction the appenders ran.
type clTxn struct {
	key    clTxnKey
	bodies []string
	commit client.AppendResult
	err    error
}

// clLoad drives appenders through one client and books every outcome.
type clLoad struct {
	c        *client.Client
	vs       []streamwal.VChannel
	stop     chan struct{}
	wg       sync.WaitGroup
	crash    atomic.Int64 // UnixNano of the crash, 0 before
	victim   streamwal.VChannel
	onVictim map[streamwal.VChannel]bool // served by the crashed node

	mu         sync.Mutex
	plain      map[string]clPlain
	plainErrs  []error
	perV       map[streamwal.VChannel]int // plain appends acknowledged
	committed  map[clTxnKey]*clTxn
	rolledBack map[clTxnKey]*clTxn
	failed     map[clTxnKey]*clTxn // definitely not committed
	uncertain  map[clTxnKey]*clTxn // commit outcome unknown
	forbidden  map[string]bool     // bodies of rolled-back and failed transactions
	beginFails int
	txnCodes   map[streamwal.Code]int
	untyped    []error
	stalled    int // plain appends on the crashed node's VChannels held up by the crash
	maxLatency time.Duration
	// dupWindow, when set, is the streams' duplicate window: a retry that
	// reaches the stream later than that after an earlier attempt landed
	// is stored again (NATS deduplicates within the window only), and the
	// check accepts such a second copy; none closer in time. storedAt,
	// when set, is when the stream stored a message (the server's clock,
	// which its window runs on): without it, copies are timed by their
	// TimeTicks, drawn before they were sent.
	dupWindow time.Duration
	storedAt  func(m *messages.ImmutableMessage) (time.Time, error)
}

// clRunLoad runs the whole scenario with a client built with opts.
func clRunLoad(t *testing.T, opts ...client.Option) {
	s := startSystem(t, 1, 2)
	waitServing(t, s, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	newClient := func() (*client.Client, *nats.Conn) {
		nc, err := s.Server.Connect()
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		c, err := client.New(nc, append([]client.Option{client.WithCluster(s.Codec.Cluster()), client.WithLocal(s.Local())}, opts...)...)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Close()) })
		return c, nc
	}
	// The appenders' client has a connection of its own, so that its
	// message counts are append requests only.
	c, nc := newClient()
	rc, _ := newClient()

	l := &clLoad{c: c, stop: make(chan struct{}), plain: map[string]clPlain{}, perV: map[streamwal.VChannel]int{},
		committed: map[clTxnKey]*clTxn{}, rolledBack: map[clTxnKey]*clTxn{}, failed: map[clTxnKey]*clTxn{},
		uncertain: map[clTxnKey]*clTxn{}, forbidden: map[string]bool{}, txnCodes: map[streamwal.Code]int{}}
	for id := int64(1); id <= clCollections; id++ {
		vs, err := c.CreateCollection(ctx, client.Collection{DBName: "db", Name: fmt.Sprintf("c%d", id), ID: id})
		require.NoError(t, err)
		l.vs = append(l.vs, vs...)
	}

	// The victim is the node serving the first collection's PChannel.
	l.victim = l.vs[0]
	view, err := s.View(ctx)
	require.NoError(t, err)
	var victim streamwal.NodeID
	for _, a := range view.Channels {
		if a.PChannel == l.victim.PChannel().String() {
			victim = streamwal.NodeID(a.Node)
		}
	}
	require.NotEmpty(t, victim)
	l.onVictim = map[streamwal.VChannel]bool{}
	for _, v := range l.vs {
		for _, a := range view.Channels {
			if a.PChannel == v.PChannel().String() && streamwal.NodeID(a.Node) == victim {
				l.onVictim[v] = true
			}
		}
	}
	t.Logf("collections on %v; crashing %s, which serves %d of them", l.vs, victim, len(l.onVictim))

	readers := clStartReaders(ctx, rc, l.vs)
	before := nc.Stats()
	began := time.Now()
	l.start(clAppenders)

	require.Eventually(t, func() bool { return l.plainCount() >= clBeforeCrash }, 30*time.Second, 5*time.Millisecond,
		"no progress before the crash")
	victimBefore := l.victimCount()
	l.crash.Store(time.Now().UnixNano())
	s.StopNode(victim, true)
	crashed := time.Now()
	require.Eventually(t, func() bool { return l.victimCount() >= victimBefore+clAfterCrash }, 30*time.Second, 5*time.Millisecond,
		"no progress on the crashed node's VChannel after the crash")
	recovered := time.Since(crashed)
	l.finish()
	loadTime := time.Since(began)
	after := nc.Stats()

	// A last insert per VChannel: its reader stops there.
	for _, v := range l.vs {
		res, err := c.Append(ctx, clInsert(t, c, v, clSentinel(v)))
		require.NoError(t, err)
		l.plain[clSentinel(v)] = clPlain{v: v, id: res[0].ID, tt: res[0].TimeTick}
	}
	got := readers.wait(t)

	l.check(t, got)

	appended := len(l.plain) - len(l.vs)
	t.Logf("load %v: %d plain inserts acknowledged (%d on the crashed node's VChannels held up by the crash, max latency %v), "+
		"txns: %d committed, %d rolled back, %d failed for sure (%d at BeginTxn), %d of unknown outcome; txn error codes %v",
		loadTime.Round(time.Millisecond), appended, l.stalled, l.maxLatency.Round(time.Millisecond),
		len(l.committed), len(l.rolledBack), len(l.failed)+l.beginFails, l.beginFails, len(l.uncertain), l.txnCodes)
	t.Logf("crash to %d more inserts on the victim's VChannel: %v; append requests over NATS: %d sent, %d replies",
		clAfterCrash, recovered.Round(time.Millisecond), after.OutMsgs-before.OutMsgs, after.InMsgs-before.InMsgs)
	require.Empty(t, l.untyped, "transaction errors are typed")
	require.Positive(t, l.stalled, "the crash held appends up")
	if len(opts) == 0 {
		// Through the local bypass, requests go over NATS only while no
		// WAL of this process serves the PChannel: the crash's retries.
		require.Positive(t, after.OutMsgs-before.OutMsgs, "the local bypass fell back to NATS through the crash")
	}
}

// clSentinel is the payload of the last insert of v.
func clSentinel(v streamwal.VChannel) string { return "end-" + v.String() }

// clInsert builds an Insert whose payload is name.
func clInsert(t *testing.T, c *client.Client, v streamwal.VChannel, name string) *messages.MutableMessage {
	m, err := c.Codec().New(messages.TypeInsert, v, []byte(name))
	require.NoError(t, err)
	return m
}

// start runs n appenders until finish.
func (l *clLoad) start(n int) {
	for g := range n {
		l.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				v := l.vs[rng.IntN(len(l.vs))]
				if rng.IntN(10) < 7 {
					l.appendPlain(v, fmt.Sprintf("p%d-%d", g, i), 1+rng.IntN(3))
				} else {
					l.runTxn(rng, v, fmt.Sprintf("t%d-%d", g, i))
				}
			}
		})
	}
}

// finish stops the appenders.
func (l *clLoad) finish() {
	close(l.stop)
	l.wg.Wait()
}

// plainCount is how many plain inserts were acknowledged.
func (l *clLoad) plainCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.plain)
}

// victimCount is how many plain inserts the victim's VChannel acknowledged.
func (l *clLoad) victimCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.perV[l.victim]
}

// appendPlain appends n inserts in one call; the client must absorb
// every retriable error.
func (l *clLoad) appendPlain(v streamwal.VChannel, name string, n int) {
	msgs := make([]*messages.MutableMessage, n)
	names := make([]string, n)
	for i := range msgs {
		names[i] = fmt.Sprintf("%s-%d", name, i)
		m, err := l.c.Codec().New(messages.TypeInsert, v, []byte(names[i]))
		if err != nil {
			l.plainFailed(err)
			return
		}
		msgs[i] = m
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	began := time.Now()
	res, err := l.c.Append(ctx, msgs...)
	ended := time.Now()
	if err != nil {
		l.plainFailed(fmt.Errorf("%s: %w", name, err))
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, r := range res {
		l.plain[names[i]] = clPlain{v: v, id: r.ID, tt: r.TimeTick}
	}
	l.perV[v] += n
	l.maxLatency = max(l.maxLatency, ended.Sub(began))
	// In flight at the crash, or begun after it and held up: retried.
	if crash := l.crash.Load(); l.onVictim[v] && crash != 0 && ended.UnixNano() > crash &&
		(began.UnixNano() < crash || ended.Sub(began) > clStall) {
		l.stalled++
	}
}

// plainFailed books an error of a plain append.
func (l *clLoad) plainFailed(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.plainErrs = append(l.plainErrs, err)
}

// runTxn begins a transaction on v, appends 0 to 4 bodies (in one call or
// one by one), and commits it or, one time in four, rolls it back.
func (l *clLoad) runTxn(rng *rand.Rand, v streamwal.VChannel, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	txn, err := l.c.BeginTxn(ctx, v, 0)
	if err != nil {
		l.txnFailed(nil, err, false)
		return
	}
	tx := &clTxn{key: clTxnKey{v: v, id: txn.Context().ID}}
	n := rng.IntN(5)
	msgs := make([]*messages.MutableMessage, n)
	for i := range msgs {
		tx.bodies = append(tx.bodies, fmt.Sprintf("%s-b%d", name, i))
		if msgs[i], err = l.c.Codec().New(messages.TypeInsert, v, []byte(tx.bodies[i])); err != nil {
			l.txnFailed(tx, err, false)
			return
		}
	}
	if rng.IntN(2) == 0 {
		if n > 0 {
			_, err = txn.Append(ctx, msgs...)
		}
	} else {
		for _, m := range msgs {
			if _, err = txn.Append(ctx, m); err != nil {
				break
			}
		}
	}
	if err != nil {
		l.txnFailed(tx, err, false)
		return
	}
	if rng.IntN(4) == 0 {
		err := txn.Rollback(ctx)
		l.mu.Lock()
		defer l.mu.Unlock()
		if err != nil {
			l.txnCodes[streamwal.CodeOf(err)]++
		}
		tx.err = err
		l.rolledBack[tx.key] = tx
		for _, b := range tx.bodies {
			l.forbidden[b] = true
		}
		return
	}
	res, err := txn.Commit(ctx)
	if err != nil {
		l.txnFailed(tx, err, true)
		return
	}
	tx.commit = res
	l.mu.Lock()
	defer l.mu.Unlock()
	l.committed[tx.key] = tx
}

// txnFailed books a transaction that failed. A failed BeginTxn or body
// means the transaction was never committed; a failed commit is of
// unknown outcome unless its error says it was refused.
func (l *clLoad) txnFailed(tx *clTxn, err error, atCommit bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	code := streamwal.CodeOf(err)
	l.txnCodes[code]++
	var typed *streamwal.Error
	if !errors.As(err, &typed) {
		l.untyped = append(l.untyped, err)
	}
	if tx == nil {
		l.beginFails++
		return
	}
	tx.err = err
	if atCommit && !clRefused(code) {
		l.uncertain[tx.key] = tx
		return
	}
	l.failed[tx.key] = tx
	for _, b := range tx.bodies {
		l.forbidden[b] = true
	}
}

// clRefused reports whether a commit failing with code surely did not
// land.
func clRefused(code streamwal.Code) bool {
	switch code {
	case streamwal.CodeTxnNotFound, streamwal.CodeTxnExpired, streamwal.CodeTxnInvalidState,
		streamwal.CodeInvalidArgument, streamwal.CodeLifecycle, streamwal.CodeNotOwned:
		return true
	}
	return false
}

// clReaders follow VChannels until their sentinels.
type clReaders struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	got  map[streamwal.VChannel][]*messages.ImmutableMessage
	errs []error
}

// clStartReaders starts one scanner per VChannel, from the earliest
// message.
func clStartReaders(ctx context.Context, c *client.Client, vs []streamwal.VChannel) *clReaders {
	r := &clReaders{got: map[streamwal.VChannel][]*messages.ImmutableMessage{}}
	for _, v := range vs {
		r.wg.Go(func() {
			out, err := clFollow(ctx, c, v)
			r.mu.Lock()
			defer r.mu.Unlock()
			r.got[v] = out
			if err != nil {
				r.errs = append(r.errs, fmt.Errorf("read %s after %d messages: %w", v, len(out), err))
			}
		})
	}
	return r
}

// clFollow reads v until its sentinel.
func clFollow(ctx context.Context, c *client.Client, v streamwal.VChannel) ([]*messages.ImmutableMessage, error) {
	s, err := c.Read(ctx, client.ReadOptions{VChannel: v, Start: client.Earliest()})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var out []*messages.ImmutableMessage
	for m, err := range s.All(ctx) {
		if err != nil {
			return out, err
		}
		out = append(out, m)
		if m.Type() == messages.TypeInsert && string(m.Payload()) == clSentinel(v) {
			return out, nil
		}
	}
	return out, nil
}

// wait waits for every reader and returns what each read.
func (r *clReaders) wait(t *testing.T) map[streamwal.VChannel][]*messages.ImmutableMessage {
	r.wg.Wait()
	require.Empty(t, r.errs)
	return r.got
}

// requireRelandedLate checks the copies of an insert read more than
// once: allowed only with a duplicate window, and only when each copy
// landed at least the window after the one before it. A copy's TimeTick
// is drawn before it is sent, and an attempt may wait in the writer's
// queue (or land after its caller gave up and retried) for a while under
// load, so that two copies stored a window apart can carry TimeTicks
// closer than that: with storedAt, the stream's own times decide.
func (l *clLoad) requireRelandedLate(t *testing.T, name string, copies []*messages.ImmutableMessage) {
	t.Helper()
	require.NotZero(t, l.dupWindow, "acknowledged insert %s read %d times", name, len(copies))
	for i := 1; i < len(copies); i++ {
		gap := copies[i].TimeTick().Physical().Sub(copies[i-1].TimeTick().Physical())
		if gap < l.dupWindow && l.storedAt != nil {
			prev, perr := l.storedAt(copies[i-1])
			next, nerr := l.storedAt(copies[i])
			if err := errors.Join(perr, nerr); err != nil {
				t.Logf("insert %s: %v", name, err)
			} else {
				t.Logf("insert %s: copies %d and %d carry TimeTicks %s apart and were stored %s apart", name,
					copies[i-1].ID(), copies[i].ID(), gap, next.Sub(prev))
				gap = next.Sub(prev)
			}
		}
		require.GreaterOrEqual(t, gap, l.dupWindow, "insert %s stored at %d and again at %d, %s later: within the duplicate window",
			name, copies[i-1].ID(), copies[i].ID(), gap)
	}
}

// check compares what was read with what was acknowledged.
func (l *clLoad) check(t *testing.T, got map[streamwal.VChannel][]*messages.ImmutableMessage) {
	require.Empty(t, l.plainErrs, "plain appends see no error: the client retries through the crash")
	seenPlain := map[string]int{}
	copies := map[string][]*messages.ImmutableMessage{}
	seenTxn := map[clTxnKey]int{}
	uncertainLanded := 0
	for _, v := range l.vs {
		msgs := got[v]
		require.NotEmpty(t, msgs, "%s read nothing", v)
		require.Equal(t, messages.TypeCreateCollection, msgs[0].Type(), "%s starts with its CreateCollection", v)
		for i, m := range msgs {
			require.Equal(t, v, m.VChannel(), "a scanner of %s delivered a message of %s", v, m.VChannel())
			if i > 0 {
				require.Greater(t, m.TimeTick(), msgs[i-1].TimeTick(), "%s: TimeTicks strictly increase (message %d, %s)", v, i, m.Type())
			}
			switch m.Type() {
			case messages.TypeCreateCollection:
				require.Zero(t, i, "%s: one CreateCollection, first", v)
			case messages.TypeInsert:
				name := string(m.Payload())
				require.False(t, l.forbidden[name], "%s: body %s of a rolled-back or failed transaction read as an insert", v, name)
				p, ok := l.plain[name]
				require.True(t, ok, "%s: insert %s was never acknowledged", v, name)
				require.Equal(t, p.v, v, "%s landed on another VChannel", name)
				copies[name] = append(copies[name], m)
				seenPlain[name]++
			case messages.TypeTxn:
				key := clTxnKey{v: v, id: m.Txn().ID}
				seenTxn[key]++
				var bodies []string
				for _, b := range m.TxnBody() {
					bodies = append(bodies, string(b.Payload()))
					require.False(t, l.forbidden[bodies[len(bodies)-1]], "%s: body %s of a rolled-back or failed transaction read", v, bodies[len(bodies)-1])
				}
				if tx, ok := l.committed[key]; ok {
					require.Equal(t, tx.bodies, bodies, "%s: txn %d bodies in order", v, key.id)
					require.Equal(t, tx.commit.ID, m.ID(), "%s: txn %d reads at its commit", v, key.id)
					require.Equal(t, tx.commit.TimeTick, m.TimeTick(), "%s: txn %d at its commit's TimeTick", v, key.id)
					continue
				}
				tx, ok := l.uncertain[key]
				require.True(t, ok, "%s: txn %d (bodies %v) was never committed", v, key.id, bodies)
				require.Equal(t, tx.bodies, bodies, "%s: txn %d of unknown outcome read with other bodies", v, key.id)
				uncertainLanded++
			case messages.TypeCreateSegment, messages.TypeFlush:
				// The WAL's own segment bookkeeping.
			default:
				t.Fatalf("%s: unexpected %s at %d", v, m.Type(), m.ID())
			}
		}
	}
	relanded := 0
	for name, p := range l.plain {
		require.NotZero(t, seenPlain[name], "acknowledged insert %s not read", name)
		if seenPlain[name] > 1 {
			l.requireRelandedLate(t, name, copies[name])
			relanded++
		}
		acked := slices.IndexFunc(copies[name], func(m *messages.ImmutableMessage) bool { return m.ID() == p.id })
		require.NotEqual(t, -1, acked, "%s read elsewhere than acknowledged (at %d)", name, p.id)
		require.Equal(t, p.tt, copies[name][acked].TimeTick(), "%s read at another TimeTick than acknowledged", name)
	}
	if relanded > 0 {
		t.Logf("%d acknowledged inserts were stored again by a retry later than the %s duplicate window", relanded, l.dupWindow)
	}
	for key := range l.committed {
		require.Equal(t, 1, seenTxn[key], "committed txn %d on %s read %d times", key.id, key.v, seenTxn[key])
	}
	for key := range l.uncertain {
		require.LessOrEqual(t, seenTxn[key], 1, "txn %d on %s read %d times", key.id, key.v, seenTxn[key])
	}
	for key := range l.failed {
		require.Zero(t, seenTxn[key], "failed txn %d on %s read", key.id, key.v)
	}
	for key := range l.rolledBack {
		require.Zero(t, seenTxn[key], "rolled-back txn %d on %s read", key.id, key.v)
	}
	if len(l.uncertain) > 0 {
		var errs []string
		for key, tx := range l.uncertain {
			errs = append(errs, fmt.Sprintf("%v (read: %v)", tx.err, seenTxn[key] == 1))
		}
		sort.Strings(errs)
		t.Logf("%d commits of unknown outcome, %d of which landed: %s", len(l.uncertain), uncertainLanded, strings.Join(errs, "; "))
	}
}
