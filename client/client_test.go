package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/wire"
)

// syncInterval is the nodes' TimeTick sync period in these tests.
const syncInterval = 50 * time.Millisecond

// mode is a way for a client to reach the nodes of its own process.
type mode struct {
	name string
	opts []client.Option
}

// modes are the local bypass (the default: a node of this process is
// called directly) and the NATS path.
var modes = []mode{
	{"LocalBypass", nil},
	{"NATS", []client.Option{client.WithoutLocalBypass()}},
}

// forModes runs f as one subtest per mode.
func forModes(t *testing.T, f func(t *testing.T, m mode)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { f(t, m) })
	}
}

// testCtx is a context bounded well beyond what any test needs.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newSystem starts a cluster (one coordinator, one node) on a fresh
// server and waits until it serves every PChannel.
func newSystem(t *testing.T) *system.System {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := system.Start(ctx, system.Options{ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Node: node.Config{SyncInterval: syncInterval}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	_, err = s.WaitServing(ctx, false)
	require.NoError(t, err)
	return s
}

// connect opens a connection of the test's own.
func connect(t *testing.T, s *system.System) *nats.Conn {
	t.Helper()
	nc, err := s.Server.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// newClient starts a client on a connection of its own, closed with the
// test.
func newClient(t *testing.T, s *system.System, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(connect(t, s), append([]client.Option{client.WithLocal(s.Local())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// collectionIDs numbers the collections the tests create.
var collectionIDs atomic.Int64

// createCollection creates a one-shard collection and returns it with
// its VChannel.
func createCollection(t *testing.T, ctx context.Context, c *client.Client, partitions ...int64) (client.Collection, streamwal.VChannel) {
	t.Helper()
	id := collectionIDs.Add(1)
	col := client.Collection{DBName: "db", Name: fmt.Sprintf("c%d", id), ID: id, Partitions: partitions}
	vs, err := c.CreateCollection(ctx, col)
	require.NoError(t, err)
	require.Len(t, vs, 1)
	return col, vs[0]
}

// insert builds an Insert whose payload is name.
func insert(t *testing.T, c *client.Client, v streamwal.VChannel, name string, opts ...messages.Option) *messages.MutableMessage {
	t.Helper()
	m, err := c.Codec().New(messages.TypeInsert, v, []byte(name), opts...)
	require.NoError(t, err)
	return m
}

// appendOne appends one message and returns its result.
func appendOne(ctx context.Context, c *client.Client, m *messages.MutableMessage) (client.AppendResult, error) {
	res, err := c.Append(ctx, m)
	if err != nil {
		return client.AppendResult{}, err
	}
	return res[0], nil
}

// sentinel appends a uniquely named Insert that a reader can stop at.
func sentinel(t *testing.T, ctx context.Context, c *client.Client, v streamwal.VChannel) string {
	t.Helper()
	name := "end-" + nuid.Next()
	_, err := appendOne(ctx, c, insert(t, c, v, name))
	require.NoError(t, err)
	return name
}

// readUntil reads from start until the Insert named last (or the first
// message of the type named last) and returns what it read, last
// included.
func readUntil(t *testing.T, ctx context.Context, c *client.Client, o client.ReadOptions, last string) []*messages.ImmutableMessage {
	t.Helper()
	s, err := c.Read(ctx, o)
	require.NoError(t, err)
	defer s.Close()
	var out []*messages.ImmutableMessage
	for {
		m, err := s.Next(ctx)
		require.NoError(t, err, "read %d messages without reaching %s", len(out), last)
		out = append(out, m)
		if m.Type() == messages.TypeInsert && string(m.Payload()) == last || m.Type().Name == last {
			return out
		}
	}
}

// describe renders what a reader sees: an Insert's payload, a Txn's bodies
// in brackets, any other type's name. The WAL's own segment bookkeeping
// (CreateSegment, Flush) is left out: where it lands depends on the seal
// policies, not on what the test did.
func describe(msgs []*messages.ImmutableMessage) []string {
	out := make([]string, 0, len(msgs))
	for _, m := range msgs {
		switch m.Type() {
		case messages.TypeCreateSegment, messages.TypeFlush:
		case messages.TypeInsert:
			out = append(out, string(m.Payload()))
		case messages.TypeTxn:
			var bodies []string
			for _, b := range m.TxnBody() {
				bodies = append(bodies, string(b.Payload()))
			}
			out = append(out, "txn["+strings.Join(bodies, " ")+"]")
		default:
			out = append(out, m.Type().Name)
		}
	}
	return out
}

// monitor counts the append requests of a PChannel: a plain subscriber
// on the append subject sees every request, whoever answers it.
type monitor struct {
	nc  *nats.Conn
	sub *nats.Subscription
}

// watchAppends subscribes a connection of its own to p's append subject.
func watchAppends(t *testing.T, s *system.System, c *client.Client, p streamwal.PChannel) *monitor {
	t.Helper()
	nc := connect(t, s)
	sub, err := nc.SubscribeSync(c.Cluster().AppendSubject(p))
	require.NoError(t, err)
	require.NoError(t, sub.SetPendingLimits(-1, -1))
	require.NoError(t, nc.Flush())
	return &monitor{nc: nc, sub: sub}
}

// requests returns the requests seen since the last call: after the
// flush, every request the server routed before it is in the
// subscription's buffer.
func (mo *monitor) requests(t *testing.T) []wire.AppendRequest {
	t.Helper()
	out, err := mo.drain()
	require.NoError(t, err)
	return out
}

// drain is requests without a testing.T, for require.Eventually.
func (mo *monitor) drain() ([]wire.AppendRequest, error) {
	if err := mo.nc.Flush(); err != nil {
		return nil, err
	}
	var out []wire.AppendRequest
	for {
		msg, err := mo.sub.NextMsg(0)
		if err != nil {
			return out, nil
		}
		var req wire.AppendRequest
		if err := wire.Decode(msg.Data, &req); err != nil {
			return out, err
		}
		out = append(out, req)
	}
}

// TestNewValidation: a client needs a connection and positive bounds;
// Connect to nowhere is unavailable.
func TestNewValidation(t *testing.T) {
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)

	_, err = client.New(nil)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	for name, opt := range map[string]client.Option{
		"zero timeout":        client.WithTimeout(0),
		"negative timeout":    client.WithTimeout(-time.Second),
		"zero batch":          client.WithMaxBatch(0),
		"negative batch":      client.WithMaxBatch(-1),
		"zero in flight":      client.WithMaxInFlight(0),
		"negative in flight":  client.WithMaxInFlight(-4),
		"zero retry interval": client.WithRetryMaxInterval(0),
		"negative linger":     client.WithLinger(-time.Millisecond),
		"bad cluster name":    client.WithCluster("not a name"),
	} {
		_, err := client.New(nc, opt)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, name)
	}

	c, err := client.New(nc, client.WithCluster("other"), client.WithTimeout(time.Second), client.WithMaxBatch(1),
		client.WithMaxInFlight(1), client.WithRetryMaxInterval(time.Millisecond), client.WithRegistry(messages.NewRegistry()),
		client.WithLogger(zerolog.Nop()), client.WithTracerProvider(noop.NewTracerProvider()))
	require.NoError(t, err)
	require.Equal(t, streamwal.Cluster("other"), c.Cluster())
	require.NotNil(t, c.Codec())
	require.NoError(t, c.Close())
	require.False(t, nc.IsClosed(), "the connection given to New stays the caller's")

	c, err = client.Connect(srv.ClientURL())
	require.NoError(t, err)
	require.Equal(t, streamwal.Cluster(client.DefaultCluster), c.Cluster())
	require.NoError(t, c.Close())

	_, err = client.Connect("nats://127.0.0.1:1")
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
}

// TestAppendValidation: nil messages and transaction messages are refused
// before anything is sent; an Append whose context already ended fails
// with the context's error.
func TestAppendValidation(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s, client.WithoutLocalBypass())
	_, v := createCollection(t, ctx, c)
	mon := watchAppends(t, s, c, v.PChannel())

	_, err := c.Append(ctx, nil)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, err = c.Append(ctx, insert(t, c, v, "fine"), nil)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "one nil message refuses the whole call")

	tc := messages.TxnContext{ID: 5, Keepalive: time.Second}
	begin, err := c.Codec().NewBody(messages.TypeBeginTxn, v, messages.BeginTxnBody{}, messages.WithTxn(tc))
	require.NoError(t, err)
	commit, err := c.Codec().NewBody(messages.TypeCommitTxn, v, messages.CommitTxnBody{}, messages.WithTxn(tc))
	require.NoError(t, err)
	body := insert(t, c, v, "body", messages.WithTxn(tc))
	for _, m := range []*messages.MutableMessage{begin, commit, body} {
		_, err := c.Append(ctx, m)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, m.Type().Name)
	}
	require.Empty(t, mon.requests(t), "refused messages are not sent")

	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = c.Append(done, insert(t, c, v, "late"))
	require.ErrorIs(t, err, context.Canceled)

	_, err = c.Broadcast(ctx, client.BroadcastRequest{})
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "a broadcast needs a type")
}

// TestClose: after Close every call fails with ErrClosed; Close is
// idempotent; appends racing Close either land or fail with ErrClosed.
func TestClose(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	admin := newClient(t, s)
	_, v := createCollection(t, ctx, admin)

	c, err := client.New(connect(t, s))
	require.NoError(t, err)
	txn, err := c.BeginTxn(ctx, v, 0)
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make([]error, 50)
	for i := range errs {
		m := insert(t, c, v, fmt.Sprintf("racing-%d", i))
		wg.Go(func() { _, errs[i] = c.Append(ctx, m) })
	}
	require.NoError(t, c.Close())
	wg.Wait()
	landed := 0
	for _, err := range errs {
		if err == nil {
			landed++
			continue
		}
		require.ErrorIs(t, err, streamwal.ErrClosed)
	}
	t.Logf("%d of %d appends racing Close landed", landed, len(errs))

	_, err = c.Append(ctx, insert(t, c, v, "after"))
	require.ErrorIs(t, err, streamwal.ErrClosed)
	_, err = c.BeginTxn(ctx, v, 0)
	require.ErrorIs(t, err, streamwal.ErrClosed)
	_, err = txn.Append(ctx, insert(t, c, v, "body"))
	require.ErrorIs(t, err, streamwal.ErrClosed)
	_, err = txn.Commit(ctx)
	require.ErrorIs(t, err, streamwal.ErrClosed)
	require.NoError(t, c.Close(), "Close is idempotent")
	require.NoError(t, c.Close())
}

// TestTxnMisuse: bodies must be of the transaction's VChannel and carry
// no message ID; a transaction ends once.
func TestTxnMisuse(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	_, v := createCollection(t, ctx, c)
	_, other := createCollection(t, ctx, c)

	txn, err := c.BeginTxn(ctx, v, 0)
	require.NoError(t, err)
	require.Equal(t, v, txn.VChannel())
	require.NotZero(t, txn.Context().ID)
	require.Equal(t, messages.DefaultKeepalive, txn.Context().Keepalive, "keepalive 0 is the WAL's default")

	_, err = txn.Append(ctx, insert(t, c, other, "elsewhere"))
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "a body of another vchannel")
	_, err = txn.Append(ctx, insert(t, c, v, "with-id", messages.WithMsgID("m-1")))
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "a body with a message id")
	_, err = txn.Append(ctx, nil)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "a nil body")
	_, err = txn.Append(ctx, insert(t, c, v, "ok"))
	require.NoError(t, err, "refused bodies leave the transaction usable")

	commit, err := txn.Commit(ctx)
	require.NoError(t, err)
	require.NotZero(t, commit.ID)
	_, err = txn.Commit(ctx)
	require.ErrorIs(t, err, streamwal.ErrTxnInvalidState, "commit twice")
	_, err = txn.Append(ctx, insert(t, c, v, "late"))
	require.ErrorIs(t, err, streamwal.ErrTxnInvalidState, "a body after commit")
	require.ErrorIs(t, txn.Rollback(ctx), streamwal.ErrTxnInvalidState, "rollback after commit")

	rb, err := c.BeginTxn(ctx, v, time.Second)
	require.NoError(t, err)
	require.Equal(t, time.Second, rb.Context().Keepalive)
	require.NoError(t, rb.Rollback(ctx))
	_, err = rb.Commit(ctx)
	require.ErrorIs(t, err, streamwal.ErrTxnInvalidState, "commit after rollback")
	require.ErrorIs(t, rb.Rollback(ctx), streamwal.ErrTxnInvalidState, "rollback twice")

	_, err = c.BeginTxn(ctx, v, time.Microsecond)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "a keepalive below the minimum")
}

// TestTxnExpired: a transaction idle past its keepalive cannot commit,
// and the typed error survives either path.
func TestTxnExpired(t *testing.T) {
	s := newSystem(t)
	forModes(t, func(t *testing.T, m mode) {
		ctx := testCtx(t)
		c := newClient(t, s, m.opts...)
		_, v := createCollection(t, ctx, c)

		const keepalive = 5 * time.Millisecond
		txn, err := c.BeginTxn(ctx, v, keepalive)
		require.NoError(t, err)
		// The deadline runs in TimeTick time from the BeginTxn; past it by
		// a few sync intervals, the WAL has ticked it away for sure.
		deadline := time.Now().Add(keepalive + 3*syncInterval)
		require.Eventually(t, func() bool { return time.Now().After(deadline) }, 10*time.Second, time.Millisecond)

		_, err = txn.Append(ctx, insert(t, c, v, "doomed"))
		require.ErrorIs(t, err, streamwal.ErrTxnExpired, "a body after the keepalive")
		_, err = txn.Commit(ctx)
		require.ErrorIs(t, err, streamwal.ErrTxnExpired)

		got := describe(readUntil(t, ctx, c, client.ReadOptions{VChannel: v, Start: client.Earliest()}, sentinel(t, ctx, c, v)))
		require.Equal(t, []string{"CreateCollection"}, got[:len(got)-1], "an expired transaction never reaches a reader")
	})
}

// TestTxnCommitAndRollback: a committed transaction reads as one Txn with
// its bodies in order; a rolled-back one is never read.
func TestTxnCommitAndRollback(t *testing.T) {
	s := newSystem(t)
	forModes(t, func(t *testing.T, m mode) {
		ctx := testCtx(t)
		c := newClient(t, s, m.opts...)
		_, v := createCollection(t, ctx, c)

		_, err := appendOne(ctx, c, insert(t, c, v, "before"))
		require.NoError(t, err)
		txn, err := c.BeginTxn(ctx, v, 0)
		require.NoError(t, err)
		res, err := txn.Append(ctx, insert(t, c, v, "a"), insert(t, c, v, "b"))
		require.NoError(t, err)
		require.Len(t, res, 2)
		require.Less(t, res[0].TimeTick, res[1].TimeTick)
		for _, r := range res {
			require.NotNil(t, r.Txn)
			require.Equal(t, txn.Context().ID, r.Txn.ID)
		}
		_, err = txn.Append(ctx, insert(t, c, v, "c"))
		require.NoError(t, err)

		rb, err := c.BeginTxn(ctx, v, 0)
		require.NoError(t, err)
		_, err = rb.Append(ctx, insert(t, c, v, "rolled-1"), insert(t, c, v, "rolled-2"))
		require.NoError(t, err)
		_, err = appendOne(ctx, c, insert(t, c, v, "between"))
		require.NoError(t, err)
		require.NoError(t, rb.Rollback(ctx))

		commit, err := txn.Commit(ctx)
		require.NoError(t, err)
		require.Greater(t, commit.TimeTick, res[1].TimeTick)

		msgs := readUntil(t, ctx, c, client.ReadOptions{VChannel: v, Start: client.Earliest()}, sentinel(t, ctx, c, v))
		got := describe(msgs)
		require.Equal(t, []string{"CreateCollection", "before", "between", "txn[a b c]"}, got[:len(got)-1])
		var tx *messages.ImmutableMessage
		for _, m := range msgs {
			if m.Type() == messages.TypeTxn {
				tx = m
			}
		}
		require.NotNil(t, tx)
		require.Equal(t, commit.ID, tx.ID(), "a Txn reads at its commit")
		require.Equal(t, commit.TimeTick, tx.TimeTick())
		require.Equal(t, txn.Context().ID, tx.Txn().ID)
	})
}

// TestAppendCoalesces: concurrent appends to one PChannel go out in far
// fewer requests than messages, each message with a MessageID of its own;
// through the local bypass none goes out at all.
func TestAppendCoalesces(t *testing.T) {
	s := newSystem(t)
	forModes(t, func(t *testing.T, m mode) {
		ctx := testCtx(t)
		c := newClient(t, s, m.opts...)
		_, v := createCollection(t, ctx, c)
		mon := watchAppends(t, s, c, v.PChannel())

		const n = 200
		results := make([]client.AppendResult, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			msg := insert(t, c, v, fmt.Sprintf("co-%d", i))
			wg.Go(func() {
				<-start
				results[i], errs[i] = appendOne(ctx, c, msg)
			})
		}
		close(start)
		wg.Wait()
		ids := map[messages.MessageID]int{}
		for i := range n {
			require.NoError(t, errs[i])
			require.NotZero(t, results[i].ID)
			if prev, dup := ids[results[i].ID]; dup {
				t.Fatalf("appends %d and %d share MessageID %d", prev, i, results[i].ID)
			}
			ids[results[i].ID] = i
		}

		reqs := mon.requests(t)
		sent := 0
		for _, r := range reqs {
			sent += len(r.Messages)
		}
		t.Logf("%d appends in %d requests", n, len(reqs))
		if m.name == "LocalBypass" {
			require.Empty(t, reqs, "the local bypass sends no request")
			return
		}
		require.Equal(t, n, sent, "every message sent once")
		require.LessOrEqual(t, len(reqs), n/4, "concurrent appends are coalesced")
	})
}

// TestAppendMaxBatch: no request carries more than WithMaxBatch messages.
func TestAppendMaxBatch(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s, client.WithoutLocalBypass(), client.WithMaxBatch(4), client.WithMaxInFlight(1))
	_, v := createCollection(t, ctx, c)
	mon := watchAppends(t, s, c, v.PChannel())

	const n = 64
	msgs := make([]*messages.MutableMessage, n)
	for i := range msgs {
		msgs[i] = insert(t, c, v, fmt.Sprintf("mb-%d", i))
	}
	res, err := c.Append(ctx, msgs...)
	require.NoError(t, err)
	require.Len(t, res, n)
	for i := 1; i < n; i++ {
		require.Greater(t, res[i].ID, res[i-1].ID, "one call's messages land in order")
	}
	reqs := mon.requests(t)
	require.GreaterOrEqual(t, len(reqs), n/4)
	for _, r := range reqs {
		require.LessOrEqual(t, len(r.Messages), 4)
	}
}

// TestAppendCallInOrderAcrossRequests: a call larger than a request goes
// out in chunks, one request at a time, while other calls' appends go out
// in the other requests in flight; it lands in call order through either
// path.
func TestAppendCallInOrderAcrossRequests(t *testing.T) {
	s := newSystem(t)
	forModes(t, func(t *testing.T, m mode) {
		ctx := testCtx(t)
		c := newClient(t, s, append([]client.Option{client.WithMaxBatch(4), client.WithMaxInFlight(4)}, m.opts...)...)
		_, v := createCollection(t, ctx, c)
		mon := watchAppends(t, s, c, v.PChannel())

		const n, others = 64, 32
		msgs := make([]*messages.MutableMessage, n)
		for i := range msgs {
			msgs[i] = insert(t, c, v, fmt.Sprintf("call-%d", i))
		}
		call := c.AppendAsync(ctx, msgs...)
		singles := make([]*client.AppendFuture, others)
		for i := range singles {
			singles[i] = c.AppendAsync(ctx, insert(t, c, v, fmt.Sprintf("single-%d", i)))
		}
		res, err := call.Wait()
		require.NoError(t, err)
		for i := 1; i < n; i++ {
			require.Greater(t, res[i].ID, res[i-1].ID, "message %d landed before message %d of its call", i, i-1)
		}
		for _, f := range singles {
			_, err := f.Wait()
			require.NoError(t, err)
		}
		for _, r := range mon.requests(t) {
			require.LessOrEqual(t, len(r.Messages), 4)
		}
	})
}

// TestAppendRequestsFitMaxPayload: however many large appends are queued,
// no request exceeds the connection's maximum payload, every append lands,
// and a message that cannot fit in any request is an invalid argument at
// once, sent nowhere.
func TestAppendRequestsFitMaxPayload(t *testing.T) {
	ctx := testCtx(t)
	// The server's maximum payload is the codec's largest payload, so
	// that such a message and its headers fit in no request.
	s, err := system.Start(ctx, system.Options{ServerOptions: embedded.Options{StoreDir: t.TempDir(), MaxPayload: messages.DefaultMaxPayload},
		Node: node.Config{SyncInterval: syncInterval}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	_, err = s.WaitServing(ctx, false)
	require.NoError(t, err)
	var retries atomic.Int64
	countRetries := zerolog.HookFunc(func(_ *zerolog.Event, _ zerolog.Level, msg string) {
		if msg == "append retried" {
			retries.Add(1)
		}
	})
	c := newClient(t, s, client.WithoutLocalBypass(), client.WithMaxInFlight(1),
		client.WithLogger(zerolog.New(io.Discard).Level(zerolog.DebugLevel).Hook(countRetries)))
	_, v := createCollection(t, ctx, c)
	mon := watchAppends(t, s, c, v.PChannel())
	maxPayload := int(connect(t, s).MaxPayload())

	const n = 24
	big := strings.Repeat("x", maxPayload/8) // eight fill a request
	futures := make([]*client.AppendFuture, n)
	for i := range futures {
		futures[i] = c.AppendAsync(ctx, insert(t, c, v, fmt.Sprint(i, big)))
	}
	for i, f := range futures {
		_, err := f.Wait()
		require.NoError(t, err, "append %d", i)
	}
	sent := 0
	for _, r := range mon.requests(t) {
		size := 0
		for _, m := range r.Messages {
			size += len(m.Data)
		}
		require.Less(t, size, maxPayload, "a request of %d messages carries %d bytes", len(r.Messages), size)
		sent += len(r.Messages)
	}
	require.Equal(t, n, sent)
	require.Zero(t, retries.Load(), "no request is refused for its size")

	_, err = c.Append(ctx, insert(t, c, v, strings.Repeat("x", maxPayload)))
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Empty(t, mon.requests(t), "an oversize message is not sent")
}

// TestAppendRetrySafe: a message appended again with its message ID
// (the same message, or a new one carrying the ID) lands once.
func TestAppendRetrySafe(t *testing.T) {
	s := newSystem(t)
	forModes(t, func(t *testing.T, m mode) {
		ctx := testCtx(t)
		c := newClient(t, s, m.opts...)
		_, v := createCollection(t, ctx, c)

		msg := insert(t, c, v, "once", messages.WithMsgID("fixed-"+m.name))
		first, err := appendOne(ctx, c, msg)
		require.NoError(t, err)
		again, err := appendOne(ctx, c, msg)
		require.NoError(t, err)
		require.Equal(t, first.ID, again.ID)
		require.Equal(t, first.TimeTick, again.TimeTick)
		other, err := appendOne(ctx, c, insert(t, c, v, "once", messages.WithMsgID("fixed-"+m.name)))
		require.NoError(t, err)
		require.Equal(t, first.ID, other.ID, "the ID, not the message object, identifies it")

		// Without an explicit ID the client makes one up on the first
		// attempt and keeps it.
		auto := insert(t, c, v, "auto")
		r1, err := appendOne(ctx, c, auto)
		require.NoError(t, err)
		require.NotEmpty(t, auto.MsgID())
		r2, err := appendOne(ctx, c, auto)
		require.NoError(t, err)
		require.Equal(t, r1.ID, r2.ID)

		got := describe(readUntil(t, ctx, c, client.ReadOptions{VChannel: v, Start: client.Earliest()}, sentinel(t, ctx, c, v)))
		require.Equal(t, []string{"CreateCollection", "once", "auto"}, got[:len(got)-1])
	})
}

// TestAppendLifecycleError: an append to a collection never created is a
// final lifecycle error, returned at once, through either path.
func TestAppendLifecycleError(t *testing.T) {
	s := newSystem(t)
	forModes(t, func(t *testing.T, m mode) {
		ctx := testCtx(t)
		c := newClient(t, s, m.opts...)
		p, err := streamwal.NewPChannel("pchan", 0)
		require.NoError(t, err)
		v, err := p.VChannel(1_000_000, 0)
		require.NoError(t, err)

		began := time.Now()
		_, err = appendOne(ctx, c, insert(t, c, v, "nowhere"))
		require.ErrorIs(t, err, streamwal.ErrLifecycle)
		require.NoError(t, ctx.Err())
		require.Less(t, time.Since(began), 5*time.Second, "a final error is not retried")

		_, err = c.BeginTxn(ctx, v, 0)
		require.ErrorIs(t, err, streamwal.ErrLifecycle)
	})
}

// TestAppendRetriesThroughOwnerChange: while no node serves a PChannel
// the append is retried; once a node serves it again the append lands,
// once. A context that ends first ends the append with its error.
//
// The monitor on the append subject counts as a responder, so requests
// time out (WithTimeout) instead of finding no responders: both are
// retried.
func TestAppendRetriesThroughOwnerChange(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		s := newSystem(t)
		ctx := testCtx(t)
		c := newClient(t, s, append([]client.Option{client.WithTimeout(250 * time.Millisecond)}, m.opts...)...)
		_, v := createCollection(t, ctx, c)
		_, err := appendOne(ctx, c, insert(t, c, v, "before"))
		require.NoError(t, err)

		for _, n := range s.Nodes() {
			s.StopNode(n.ID(), false)
		}
		mon := watchAppends(t, s, c, v.PChannel())

		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err = appendOne(short, c, insert(t, c, v, "gave-up"))
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		t.Logf("append given up: %v", err)

		type outcome struct {
			res client.AppendResult
			err error
		}
		done := make(chan outcome, 1)
		// An ID of its own, read below while Append holds the message.
		through := insert(t, c, v, "through", messages.WithMsgID("through-id"))
		go func() {
			res, err := appendOne(ctx, c, through)
			done <- outcome{res, err}
		}()
		var tries atomic.Int64
		require.Eventually(t, func() bool {
			reqs, err := mon.drain()
			for _, r := range reqs {
				for _, m := range r.Messages {
					if m.Header.Get(messages.HdrMsgID) == "through-id" {
						tries.Add(1)
					}
				}
			}
			return err == nil && tries.Load() >= 3
		}, 10*time.Second, 5*time.Millisecond, "the append is retried while nobody serves the pchannel")

		_, err = s.AddNode(ctx)
		require.NoError(t, err)
		out := <-done
		require.NoError(t, out.err)
		require.NotZero(t, out.res.ID)
		t.Logf("append landed after %d+ attempts", tries.Load())

		got := describe(readUntil(t, ctx, c, client.ReadOptions{VChannel: v, Start: client.Earliest()}, sentinel(t, ctx, c, v)))
		require.Equal(t, 1, strings.Count(strings.Join(got, ","), "through"), "landed once: %v", got)
		require.Equal(t, 1, strings.Count(strings.Join(got, ","), "before"), "landed once: %v", got)
	})
}

// TestAppendHonoursContextWhileRequestHangs: the caller's context bounds
// the whole call, so an Append returns when it ends even while its
// request waits for an owner that does not answer.
func TestAppendHonoursContextWhileRequestHangs(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s, client.WithoutLocalBypass())
	_, v := createCollection(t, ctx, c)
	for _, n := range s.Nodes() {
		s.StopNode(n.ID(), false)
	}
	watchAppends(t, s, c, v.PChannel()) // takes requests, answers none

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := appendOne(short, c, insert(t, c, v, "hung"))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(began), client.DefaultTimeout/2, "Append outlived its context by a request timeout")
}

// TestCollectionHelpers: inserts are refused before CreateCollection and
// after DropCollection, and into a partition after DropPartition.
func TestCollectionHelpers(t *testing.T) {
	s := newSystem(t)
	forModes(t, func(t *testing.T, m mode) {
		ctx := testCtx(t)
		c := newClient(t, s, m.opts...)
		id := collectionIDs.Add(1)
		col := client.Collection{DBName: "db", Name: fmt.Sprintf("helpers-%d", id), ID: id, Shards: 2, Partitions: []int64{1},
			Schema: json.RawMessage(`{"fields":[]}`)}
		vs, err := c.VChannels(ctx, col)
		require.NoError(t, err)
		require.Len(t, vs, 2)
		try := func(v streamwal.VChannel, name string, partition int64) error {
			var opts []messages.Option
			if partition > 0 {
				opts = append(opts, messages.WithDML(partition, 1))
			}
			_, err := appendOne(ctx, c, insert(t, c, v, name, opts...))
			return err
		}
		for _, v := range vs {
			require.ErrorIs(t, try(v, "before-create", 0), streamwal.ErrLifecycle)
		}

		created, err := c.CreateCollection(ctx, col)
		require.NoError(t, err)
		require.Equal(t, vs, created, "CreateCollection uses the VChannels allocated")
		again, err := c.CreateCollection(ctx, col)
		require.NoError(t, err, "a retried CreateCollection is idempotent")
		require.Equal(t, vs, again)
		for _, v := range vs {
			require.NoError(t, try(v, "after-create", 0))
			require.NoError(t, try(v, "in-partition-1", 1))
			require.ErrorIs(t, try(v, "in-partition-2", 2), streamwal.ErrLifecycle, "partition 2 does not exist yet")
		}

		require.NoError(t, c.CreatePartition(ctx, col, 2))
		require.NoError(t, c.CreatePartition(ctx, col, 2), "a retried CreatePartition is idempotent")
		for _, v := range vs {
			require.NoError(t, try(v, "in-partition-2", 2))
		}
		require.NoError(t, c.DropPartition(ctx, col, 2))
		for _, v := range vs {
			require.ErrorIs(t, try(v, "dropped-partition", 2), streamwal.ErrLifecycle)
			require.NoError(t, try(v, "other-partition", 1))
		}

		require.NoError(t, c.DropCollection(ctx, col))
		for _, v := range vs {
			require.ErrorIs(t, try(v, "after-drop", 0), streamwal.ErrLifecycle)
		}

		got := describe(readUntil(t, ctx, c, client.ReadOptions{VChannel: vs[0], Start: client.Earliest(),
			Types: []*messages.Type{messages.TypeInsert, messages.TypeCreateCollection, messages.TypeCreatePartition,
				messages.TypeDropPartition, messages.TypeDropCollection}}, messages.TypeDropCollection.Name))
		require.Equal(t, []string{"CreateCollection", "after-create", "in-partition-1", "CreatePartition", "in-partition-2",
			"DropPartition", "other-partition", "DropCollection"}, got)
	})
}

// TestBroadcast: a broadcast lands on its VChannels and the CChannel;
// retried with its idempotency key it returns the original's result.
func TestBroadcast(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	col, v := createCollection(t, ctx, c)
	ref := messages.CollectionRef{DBName: col.DBName, CollectionName: col.Name, CollectionID: col.ID}
	req := client.BroadcastRequest{Type: messages.TypeCreatePartition, VChannels: []streamwal.VChannel{v},
		Scope: messages.KeyScope{DBName: col.DBName, CollectionName: col.Name},
		Body:  messages.PartitionBody{CollectionRef: ref, PartitionID: 3}, IdempotencyKey: "partition-3"}
	res, err := c.Broadcast(ctx, req)
	require.NoError(t, err)
	require.NotZero(t, res.ID)
	require.Contains(t, res.Appended, v.String())
	require.Len(t, res.Appended, 2, "the VChannel and the CChannel")
	again, err := c.Broadcast(ctx, req)
	require.NoError(t, err)
	require.Equal(t, res, again, "a retry with the idempotency key")

	payload, err := messages.MarshalBody(messages.TypeCreatePartition, messages.PartitionBody{CollectionRef: ref, PartitionID: 4})
	require.NoError(t, err)
	res4, err := c.Broadcast(ctx, client.BroadcastRequest{Type: messages.TypeCreatePartition, VChannels: []streamwal.VChannel{v},
		Scope: req.Scope, Payload: payload})
	require.NoError(t, err)
	require.NotEqual(t, res.ID, res4.ID)
	for _, p := range []int64{3, 4} {
		_, err = appendOne(ctx, c, insert(t, c, v, fmt.Sprint("in-", p), messages.WithDML(p, 1)))
		require.NoError(t, err)
	}
	err = c.AckBroadcast(ctx, res.ID, v.String())
	t.Logf("ack of a broadcast that waits for no ack: %v", err)
}

// TestReadAtTimeTick: a scanner from the TimeTick of a message starts at
// exactly that message; from one tick later, right after it.
func TestReadAtTimeTick(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	_, v := createCollection(t, ctx, c)

	var names []string
	var res []client.AppendResult
	for i := range 10 {
		name := fmt.Sprintf("tt-%d", i)
		r, err := appendOne(ctx, c, insert(t, c, v, name))
		require.NoError(t, err)
		names, res = append(names, name), append(res, r)
	}
	last := names[len(names)-1]
	for _, k := range []int{0, 4, 9} {
		got := describe(readUntil(t, ctx, c, client.ReadOptions{VChannel: v, Start: client.AtTimeTick(res[k].TimeTick)}, last))
		require.Equal(t, names[k:], got, "from the TimeTick of %s", names[k])
		if k < 9 {
			got = describe(readUntil(t, ctx, c, client.ReadOptions{VChannel: v, Start: client.AtTimeTick(res[k].TimeTick + 1)}, last))
			require.Equal(t, names[k+1:], got, "from just after the TimeTick of %s", names[k])
		}
	}
	got := describe(readUntil(t, ctx, c, client.ReadOptions{VChannel: v, Start: client.From(res[4].ID)}, last))
	require.Equal(t, names[4:], got, "from a MessageID")
	got = describe(readUntil(t, ctx, c, client.ReadOptions{VChannel: v, Start: client.After(res[4].ID)}, last))
	require.Equal(t, names[5:], got, "after a MessageID")
	got = describe(readUntil(t, ctx, c, client.ReadOptions{VChannel: v, Start: client.Earliest(), MinTimeTick: res[7].TimeTick}, last))
	require.Equal(t, names[7:], got, "with a minimum TimeTick")

	p := v.PChannel()
	all := describe(readUntil(t, ctx, c, client.ReadOptions{PChannel: p, Start: client.AtTimeTick(res[8].TimeTick)}, last))
	require.Equal(t, names[8:], all, "a whole PChannel")
}

// TestWatermarkAdvancesWhenIdle: with nothing appended, live ticks move a
// scanner's watermark on, from any start.
func TestWatermarkAdvancesWhenIdle(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	_, v := createCollection(t, ctx, c)
	last, err := appendOne(ctx, c, insert(t, c, v, "last"))
	require.NoError(t, err)

	for _, start := range []client.Start{client.Earliest(), client.Latest()} {
		sc, err := c.Read(ctx, client.ReadOptions{VChannel: v, Start: start})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() {
			for _, err := range sc.All(rctx) {
				if err != nil {
					return
				}
			}
		})
		require.Eventually(t, func() bool { return sc.Watermark() >= last.TimeTick }, 10*time.Second, 5*time.Millisecond,
			"the watermark reaches the last append")
		w := sc.Watermark()
		require.Eventually(t, func() bool { return sc.Watermark() > w }, 10*time.Second, 5*time.Millisecond,
			"the watermark moves on while nothing is appended")
		cancel()
		wg.Wait()
		require.NoError(t, sc.Close())
	}
}

// TestTxnTimeoutIsUnknownOutcome: a transaction message whose request
// timed out may have landed; the client must not call that "nobody
// answered" (retriable ErrUnavailable), since a transaction message is
// never retried and the caller has to treat its outcome as unknown.
func TestTxnTimeoutIsUnknownOutcome(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	// The timeout bounds BeginTxn too, on a node that answers: 100 ms
	// failed it on a busy machine.
	c := newClient(t, s, client.WithoutLocalBypass(), client.WithTimeout(2*time.Second))
	_, v := createCollection(t, ctx, c)
	txn, err := c.BeginTxn(ctx, v, 0)
	require.NoError(t, err)
	for _, n := range s.Nodes() {
		s.StopNode(n.ID(), false)
	}
	watchAppends(t, s, c, v.PChannel()) // takes requests, answers none

	_, err = txn.Commit(ctx)
	require.ErrorIs(t, err, streamwal.ErrUnknownOutcome)
	require.False(t, streamwal.IsRetriable(err))
}

// TestRefusedDDLLeavesCollectionUsable: a partition DDL the WAL refuses
// (bad input: a partition that exists, or one that never did) fails
// with an error and changes nothing (DESIGN.md §6), so later DDL of the
// collection still runs.
func TestRefusedDDLLeavesCollectionUsable(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	col, v := createCollection(t, ctx, c, 1)

	bounded := func(f func(ctx context.Context) error) error {
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return f(short)
	}
	require.NoError(t, bounded(func(ctx context.Context) error { return c.CreatePartition(ctx, col, 1) }), "partition 1 exists: creating is idempotent")
	err := bounded(func(ctx context.Context) error { return c.DropPartition(ctx, col, 9) })
	require.Error(t, err, "partition 9 never existed")
	require.NotErrorIs(t, err, context.DeadlineExceeded, "refused, not left waiting")
	require.NoError(t, bounded(func(ctx context.Context) error { return c.CreatePartition(ctx, col, 2) }), "the collection still takes DDL")
	_, err = appendOne(ctx, c, insert(t, c, v, "in-2", messages.WithDML(2, 1)))
	require.NoError(t, err)
}

// TestRecreateAfterDropIsNotSilent: partition IDs and VChannels are never
// reused, so creating a dropped partition (or collection) again cannot
// work; the helper must say so rather than succeed while the WAL keeps
// refusing its DML.
func TestRecreateAfterDropIsNotSilent(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	col, v := createCollection(t, ctx, c)

	require.NoError(t, c.CreatePartition(ctx, col, 2))
	require.NoError(t, c.DropPartition(ctx, col, 2))
	if err := c.CreatePartition(ctx, col, 2); err == nil {
		_, err := appendOne(ctx, c, insert(t, c, v, "in-2", messages.WithDML(2, 1)))
		require.NoError(t, err, "CreatePartition succeeded, so its partition takes DML")
	}

	require.NoError(t, c.DropCollection(ctx, col))
	if vs, err := c.CreateCollection(ctx, col); err == nil {
		_, err := appendOne(ctx, c, insert(t, c, vs[0], "again"))
		require.NoError(t, err, "CreateCollection succeeded, so its collection takes DML")
	}
}

// TestDropCollectionIsIdempotent: like CreateCollection, a DropCollection
// retried by its caller (say after a lost reply) succeeds again.
func TestDropCollectionIsIdempotent(t *testing.T) {
	s := newSystem(t)
	ctx := testCtx(t)
	c := newClient(t, s)
	col, _ := createCollection(t, ctx, c)
	require.NoError(t, c.DropCollection(ctx, col))
	require.NoError(t, c.DropCollection(ctx, col), "a retried DropCollection")
}
