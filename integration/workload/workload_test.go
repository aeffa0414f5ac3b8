package workload_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/integration/workload"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks).
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }

// testTimeout bounds each wait of these tests.
const testTimeout = 30 * time.Second

// fixture is an in-process system with two nodes, four PChannels, and a
// load over two collections of two shards each.
type fixture struct {
	sys  *system.System
	c    *client.Client
	load *workload.Load
}

// start starts the system and a load that has not started.
func start(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	s, err := system.Start(ctx, system.Options{Cluster: "wl", Nodes: 2, Coord: coord.Config{PChannels: 4},
		ServerOptions: embedded.Options{StoreDir: t.TempDir()}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	_, err = s.WaitServing(ctx, true)
	require.NoError(t, err)
	c, err := client.New(s.Conn(), client.WithCluster("wl"), client.WithoutLocalBypass())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	var vs []streamwal.VChannel
	for id := int64(1); id <= 2; id++ {
		got, err := c.CreateCollection(ctx, client.Collection{DBName: "wl", Name: fmt.Sprintf("c%d", id), ID: id, Shards: 2})
		require.NoError(t, err)
		vs = append(vs, got...)
	}
	l, err := workload.New(workload.Config{Client: c, Conn: s.Conn(), VChannels: vs, Seed: 1})
	require.NoError(t, err)
	return &fixture{sys: s, c: c, load: l}
}

// run runs the load until it had n appends acknowledged or transactions
// committed, and stops it.
func (f *fixture) run(t *testing.T, n int) {
	t.Helper()
	require.NoError(t, f.load.Start())
	require.Eventually(t, func() bool { return f.load.Ledger().Acknowledged() >= n }, testTimeout, 10*time.Millisecond,
		"the load makes progress")
	f.load.Stop()
}

// TestCheckPassesAGoodRun runs the load through a node crash, probes
// every PChannel after it, and finds nothing wrong: every acknowledged
// append and committed transaction read back once, rolled-back ones
// never.
func TestCheckPassesAGoodRun(t *testing.T) {
	f := start(t)
	require.NoError(t, f.load.Start())
	require.Eventually(t, func() bool { return f.load.Ledger().Acknowledged() >= 200 }, testTimeout, 10*time.Millisecond)
	crashed := time.Now()
	f.sys.StopNode("node-1", true)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	took, err := f.load.Probe(ctx, crashed)
	require.NoError(t, err)
	require.Len(t, took, len(f.load.PChannels()), "a time to writable for every PChannel")
	t.Logf("writable again after the crash of node-1: %v", took)
	f.load.Stop()

	r, err := f.load.Check(ctx)
	require.NoError(t, err)
	t.Log(r)
	require.NoError(t, r.Err())
	require.Positive(t, r.Plain.Acknowledged)
	require.Positive(t, r.Txns.Committed)
	require.Positive(t, r.Txns.RolledBack)
	require.GreaterOrEqual(t, r.Barriers, len(f.load.PChannels())+1, "a barrier per open, one more where node-1 served")
}

// TestVerifyCatchesViolations records in the ledger what the system did
// not do, and has the system do what the ledger does not say, one
// violation of each kind, and finds each of them and nothing else.
func TestVerifyCatchesViolations(t *testing.T) {
	f := start(t)
	f.run(t, 50)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	v := f.load.VChannels()[0]
	led := f.load.Ledger()

	appendOne := func(payload string) client.AppendResult {
		m, err := f.c.Codec().New(messages.TypeInsert, v, []byte(payload))
		require.NoError(t, err)
		res, err := f.c.Append(ctx, m)
		require.NoError(t, err)
		return res[0]
	}
	// A duplicate: the same payload stored twice, acknowledged once.
	dup := appendOne("dup")
	led.RecordAppend(v, "dup", dup, nil)
	appendOne("dup")
	// An insert nobody appended.
	appendOne("stranger")
	// An acknowledgement of a message that is not there.
	led.RecordAppend(v, "lost", client.AppendResult{ID: 1 << 40, TimeTick: 1}, nil)
	// A refused append that is there.
	appendOne("refused")
	led.RecordAppend(v, "refused", client.AppendResult{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "refused"))
	// A committed transaction recorded as rolled back, and one recorded
	// with a body it does not have.
	rolled := commitTxn(ctx, t, f.c, v, "rb-0")
	led.RecordTxn(v, rolled.Txn.ID, []string{"rb-0"}, workload.RolledBack, client.AppendResult{}, nil)
	partial := commitTxn(ctx, t, f.c, v, "pt-0", "pt-1")
	led.RecordTxn(v, partial.Txn.ID, []string{"pt-0", "pt-1", "pt-2"}, workload.Committed, partial, nil)

	// The PChannel of v gets a new owner, under a new term.
	p := v.PChannel()
	oldTerm := lastOf(ctx, t, f, p).Term()
	moveOwner(ctx, t, f, p)
	require.NoError(t, f.load.Seal(ctx))
	// Nothing writes any more; two messages forged into the stream after
	// the end marks: one of the old term after the new barrier, then one
	// whose TimeTick is not above its predecessor's.
	for _, n := range f.sys.Nodes() {
		f.sys.StopNode(n.ID(), false)
	}
	last := lastOf(ctx, t, f, p)
	require.Greater(t, last.Term(), oldTerm)
	forge(ctx, t, f, v, oldTerm, last.TimeTick()+1)
	forge(ctx, t, f, v, last.Term(), last.TimeTick())

	r, err := f.load.Verify(ctx)
	require.NoError(t, err)
	t.Log(r)
	want := []string{
		`acknowledged insert "dup" (at %d) read 2 times`,
		`insert "dup" read at MessageID`, // the second copy, elsewhere
		`insert "stranger"`,
		`acknowledged insert "lost" (at 1099511627776) read 0 times`,
		`insert "refused" read at`,
		fmt.Sprintf("transaction %d, rolled back", rolled.Txn.ID),
		fmt.Sprintf(`transaction %d read with bodies ["pt-0" "pt-1"], appended ["pt-0" "pt-1" "pt-2"]`, partial.Txn.ID),
		fmt.Sprintf("of term %d landed after the RecoveryBarrier of term %d", oldTerm, last.Term()),
		fmt.Sprintf("TimeTick %d of Insert", last.TimeTick()),
	}
	want[0] = fmt.Sprintf(want[0], dup.ID)
	for _, w := range want {
		require.True(t, containsOne(r.Violations, w), "no violation says %q in:\n%s", w, strings.Join(r.Violations, "\n"))
	}
	require.Len(t, r.Violations, len(want), "one violation of each, nothing else:\n%s", strings.Join(r.Violations, "\n"))
	require.Error(t, r.Err())
}

// TestNewRefusesBadConfigs checks that New says what is wrong with a
// config.
func TestNewRefusesBadConfigs(t *testing.T) {
	srv := embedded.StartTest(t)
	nc, err := srv.Connect()
	require.NoError(t, err)
	defer nc.Close()
	c, err := client.New(nc)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	v, err := streamwal.ParseVChannel("pchan-0_1v0")
	require.NoError(t, err)
	for name, cfg := range map[string]workload.Config{
		"no client":        {Conn: nc, VChannels: []streamwal.VChannel{v}},
		"no VChannel":      {Client: c, Conn: nc},
		"zero VChannel":    {Client: c, Conn: nc, VChannels: []streamwal.VChannel{{}}},
		"twice":            {Client: c, Conn: nc, VChannels: []streamwal.VChannel{v, v}},
		"share":            {Client: c, Conn: nc, VChannels: []streamwal.VChannel{v}, TxnPercent: 101},
		"negative":         {Client: c, Conn: nc, VChannels: []streamwal.VChannel{v}, Appenders: -1},
		"slash in tag":     {Client: c, Conn: nc, VChannels: []streamwal.VChannel{v}, Tag: "a/b"},
		"negative timeout": {Client: c, Conn: nc, VChannels: []streamwal.VChannel{v}, CallTimeout: -time.Second},
	} {
		_, err := workload.New(cfg)
		require.ErrorIs(t, err, workload.ErrInvalidConfig, name)
	}
	l, err := workload.New(workload.Config{Client: c, Conn: nc, VChannels: []streamwal.VChannel{v}})
	require.NoError(t, err)
	_, err = l.Verify(context.Background())
	require.ErrorContains(t, err, "verify before seal")
	require.NoError(t, l.Start())
	require.ErrorContains(t, l.Start(), "started already")
	require.ErrorContains(t, l.Seal(context.Background()), "stop it first")
	l.Stop()
}

// containsOne reports whether one of list contains s.
func containsOne(list []string, s string) bool {
	for _, l := range list {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// commitTxn commits a transaction of the given bodies on v, outside the
// ledger, and returns its commit.
func commitTxn(ctx context.Context, t *testing.T, c *client.Client, v streamwal.VChannel, bodies ...string) client.AppendResult {
	t.Helper()
	txn, err := c.BeginTxn(ctx, v, 0)
	require.NoError(t, err)
	for _, b := range bodies {
		m, err := c.Codec().New(messages.TypeInsert, v, []byte(b))
		require.NoError(t, err)
		_, err = txn.Append(ctx, m)
		require.NoError(t, err)
	}
	res, err := txn.Commit(ctx)
	require.NoError(t, err)
	res.Txn = &messages.TxnContext{ID: txn.Context().ID}
	return res
}

// lastOf is the last message of p's stream.
func lastOf(ctx context.Context, t *testing.T, f *fixture, p streamwal.PChannel) *messages.ImmutableMessage {
	t.Helper()
	be, err := jetstream.New(f.sys.Conn(), f.c.Codec(), jetstream.Options{})
	require.NoError(t, err)
	defer func() { _ = be.Close() }()
	st, err := be.State(ctx, p)
	require.NoError(t, err)
	m, err := be.Get(ctx, p, st.Last)
	require.NoError(t, err)
	return m
}

// moveOwner crashes the node that owns p and waits until the other one
// serves it, under a new term.
func moveOwner(ctx context.Context, t *testing.T, f *fixture, p streamwal.PChannel) {
	t.Helper()
	view, err := f.sys.View(ctx)
	require.NoError(t, err)
	var owner string
	for _, a := range view.Channels {
		if a.PChannel == p.String() {
			owner = a.Node
		}
	}
	require.NotEmpty(t, owner)
	f.sys.StopNode(streamwal.NodeID(owner), true)
	_, err = f.sys.WaitServing(ctx, false)
	require.NoError(t, err)
}

// forge publishes an insert to v straight into its stream, as a writer
// of term would, with TimeTick tt.
func forge(ctx context.Context, t *testing.T, f *fixture, v streamwal.VChannel, term uint64, tt messages.TimeTick) {
	t.Helper()
	m, err := f.c.Codec().New(messages.TypeInsert, v, []byte(fmt.Sprintf("forged-%d-%d", term, tt)))
	require.NoError(t, err)
	m.SetTerm(term)
	m.SetTimeTick(tt)
	msg, err := f.c.Codec().Encode(m)
	require.NoError(t, err)
	js, err := njs.New(f.sys.Conn())
	require.NoError(t, err)
	_, err = js.PublishMsg(ctx, msg)
	require.NoError(t, err)
}
