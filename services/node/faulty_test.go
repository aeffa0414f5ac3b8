package node_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/jetstream/faulty"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// faultyNode is a system of one coordinator and one node of one PChannel
// whose WALs write and read through a faulty backend; it passes every
// operation until a test sets an injector.
type faultyNode struct {
	t   *testing.T
	sys *system.System
	fb  *faulty.Backend
	rec *recorder
}

// startFaultyNode starts the system with inj as the backend's injector.
// Each of opts changes the node's configuration.
func startFaultyNode(t *testing.T, ctx context.Context, inj faulty.Injector, opts ...func(*node.Config)) *faultyNode {
	t.Helper()
	var fb atomic.Pointer[faulty.Backend]
	rec := &recorder{}
	cfg := node.Config{Hooks: telemetry.Hooks{rec}, WrapBackend: func(js *jetstream.JetStream) node.WALBackend {
		b := faulty.New(js, inj)
		fb.Store(b)
		return b
	}}
	for _, o := range opts {
		o(&cfg)
	}
	sys, err := system.Start(ctx, system.Options{Cluster: "faulty", ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Coord: coord.Config{PChannels: 1}, Node: cfg})
	require.NoError(t, err)
	t.Cleanup(sys.Close)
	require.NotNil(t, fb.Load(), "the node wrapped its backend")
	return &faultyNode{t: t, sys: sys, fb: fb.Load(), rec: rec}
}

// node is the system's node.
func (f *faultyNode) node() *node.Node { return f.sys.Nodes()[0] }

// opened waits for the first open the node reports and returns it.
func (f *faultyNode) opened() telemetry.OpenEvent {
	f.t.Helper()
	var ev telemetry.OpenEvent
	require.Eventually(f.t, func() bool {
		f.rec.mu.Lock()
		defer f.rec.mu.Unlock()
		if len(f.rec.opens) == 0 {
			return false
		}
		ev = f.rec.opens[0]
		return true
	}, 30*time.Second, 5*time.Millisecond, "the node tried to open its PChannel")
	return ev
}

// serving waits until the node serves its PChannel and returns its WAL's
// PChannel.
func (f *faultyNode) serving(ctx context.Context) streamwal.PChannel {
	f.t.Helper()
	_, err := f.sys.WaitServing(ctx, false)
	require.NoError(f.t, err)
	p := f.opened().PChannel
	require.Eventually(f.t, func() bool { _, ok := f.node().WAL(p); return ok }, 30*time.Second, 5*time.Millisecond)
	return p
}

// closed waits for the node to report a close of p for reason.
func (f *faultyNode) closed(p streamwal.PChannel, reason string) telemetry.CloseEvent {
	f.t.Helper()
	var ev telemetry.CloseEvent
	require.Eventually(f.t, func() bool {
		f.rec.mu.Lock()
		defer f.rec.mu.Unlock()
		for _, c := range f.rec.closes {
			if c.PChannel == p && c.Reason == reason {
				ev = c
				return true
			}
		}
		return false
	}, 30*time.Second, 5*time.Millisecond, "the node closed %s (%s)", p, reason)
	return ev
}

// request sends msgs to p's append subject and returns the reply.
func (f *faultyNode) request(ctx context.Context, p streamwal.PChannel, msgs ...*messages.MutableMessage) (wire.AppendReply, error) {
	f.t.Helper()
	var req wire.AppendRequest
	for _, m := range msgs {
		nm, err := f.sys.Codec.Encode(m)
		require.NoError(f.t, err)
		req.Messages = append(req.Messages, wire.Message{Subject: nm.Subject, Header: nm.Header, Data: nm.Data})
	}
	var reply wire.AppendReply
	err := wire.Call(ctx, f.sys.Conn(), f.sys.Codec.Cluster().AppendSubject(p), req, &reply)
	return reply, err
}

// createCollection creates the collection of v through p's append subject.
func (f *faultyNode) createCollection(ctx context.Context, v streamwal.VChannel) wire.AppendResult {
	f.t.Helper()
	m, err := f.sys.Codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: v.String(), CollectionID: v.CollectionID()},
		VChannels:     []string{v.String()},
	})
	require.NoError(f.t, err)
	reply, err := f.request(ctx, v.PChannel(), m)
	require.NoError(f.t, err)
	require.Len(f.t, reply.Results, 1)
	return reply.Results[0]
}

// insert builds an insert on v with payload.
func (f *faultyNode) insert(v streamwal.VChannel, payload string) *messages.MutableMessage {
	f.t.Helper()
	m, err := f.sys.Codec.New(messages.TypeInsert, v, []byte(payload), messages.WithDML(0, 1))
	require.NoError(f.t, err)
	return m
}

// insertOf matches appends of an insert with payload.
func insertOf(payload string) func(faulty.Call) bool {
	return func(c faulty.Call) bool {
		for _, m := range c.Msgs {
			if c.Op == faulty.OpAppend && m.Type() == messages.TypeInsert && string(m.Payload()) == payload {
				return true
			}
		}
		return false
	}
}

// TestFaultyOpenRefusedServesNothing: while the backend refuses to open
// a PChannel's writer (before its barrier lands, or after: the writer is
// closed again), the node's open fails and it does not serve the
// PChannel: no WAL, nothing answers its append subject, its heartbeat
// lists nothing; the failure is reported to the hooks. Once the backend
// answers, the coordinator's next open succeeds and the node serves it.
func TestFaultyOpenRefusedServesNothing(t *testing.T) {
	for _, after := range []bool{false, true} {
		t.Run(fmt.Sprintf("after=%v", after), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			sw := faulty.NewSwitch(faulty.Fault{Err: faulty.Unavailable(), After: after}, faulty.OpOpenWriter)
			sw.On()
			f := startFaultyNode(t, ctx, sw)
			ev := f.opened()
			require.ErrorIs(t, ev.Err, faulty.ErrInjected)
			require.Positive(t, sw.Injected())
			p := ev.PChannel
			_, ok := f.node().WAL(p)
			require.False(t, ok, "no WAL of a refused open")
			v, err := p.VChannel(1, 0)
			require.NoError(t, err)
			_, err = f.request(ctx, p, f.insert(v, "x"))
			require.Error(t, err, "nothing answers the append subject of %s", p)
			require.NotContains(t, statusOf(t, ctx, f), p.String())

			sw.Off()
			require.Equal(t, p, f.serving(ctx))
			require.Contains(t, statusOf(t, ctx, f), p.String())
			require.Nil(t, f.createCollection(ctx, v).Error)
		})
	}
}

// statusOf lists the PChannels the node says it serves.
func statusOf(t *testing.T, ctx context.Context, f *faultyNode) []string {
	t.Helper()
	var reply wire.NodeStatusReply
	require.NoError(t, wire.Call(ctx, f.sys.Conn(), f.sys.Codec.Cluster().NodeSubject(f.node().ID(), streamwal.NodeStatus), struct{}{}, &reply))
	var out []string
	for _, c := range reply.Channels {
		out = append(out, fmt.Sprint(c.PChannel))
	}
	return out
}

// TestFaultyFencedWALIsDropped: an append whose writer says a newer owner
// fenced it fails as fenced, and the node drops the PChannel at once: it
// reports a close for that reason, and serves the PChannel again only
// under a new WAL (the coordinator's next open).
func TestFaultyFencedWALIsDropped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := startFaultyNode(t, ctx, nil)
	p := f.serving(ctx)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	require.Nil(t, f.createCollection(ctx, v).Error)
	w, _ := f.node().WAL(p)

	f.fb.SetInjector(faulty.Once(faulty.When(insertOf("fenced"), faulty.Fault{Err: faulty.Fenced()})))
	reply, err := f.request(ctx, p, f.insert(v, "fenced"))
	require.NoError(t, err)
	require.Len(t, reply.Results, 1)
	require.NotNil(t, reply.Results[0].Error)
	require.Equal(t, streamwal.CodeFenced, reply.Results[0].Error.Code)
	ev := f.closed(p, telemetry.ReasonFenced)
	require.Equal(t, w.Term(), ev.Term)
	require.Eventually(t, func() bool { cur, ok := f.node().WAL(p); return !ok || cur != w }, 30*time.Second, 5*time.Millisecond,
		"the fenced WAL is no longer served")
}

// TestFaultyFailedWALIsDropped: a DDL of unknown outcome stops the WAL
// (its state is uncertain, see package wal), and the node drops the
// PChannel: it reports a close as failed, and serves the PChannel again
// only under a new WAL, which finds the collection the DDL created.
func TestFaultyFailedWALIsDropped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := startFaultyNode(t, ctx, nil)
	p := f.serving(ctx)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	w, _ := f.node().WAL(p)

	f.fb.SetInjector(faulty.Once(faulty.AppendsOf(messages.TypeCreateCollection, faulty.Fault{Err: faulty.UnknownOutcome(), After: true})))
	res := f.createCollection(ctx, v)
	require.NotNil(t, res.Error)
	require.Equal(t, streamwal.CodeUnknownOutcome, res.Error.Code)
	require.ErrorIs(t, w.Err(), streamwal.ErrUnrecoverable)
	ev := f.closed(p, telemetry.ReasonFailed)
	require.Equal(t, w.Term(), ev.Term)
	require.Eventually(t, func() bool { cur, ok := f.node().WAL(p); return ok && cur != w }, 30*time.Second, 5*time.Millisecond,
		"the coordinator opens %s again", p)
	reply, err := f.request(ctx, p, f.insert(v, "after"))
	require.NoError(t, err)
	require.Nil(t, reply.Results[0].Error, "the collection the DDL created exists under the next owner")
}

// TestFaultyAppendRequestStopsAtARetriableRefusal: the appends of one
// request are ordered as listed; once the writer refuses one with an
// error worth a retry, the later ones are refused as retriable too and
// never reach the writer, while the earlier ones landed.
func TestFaultyAppendRequestStopsAtARetriableRefusal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := startFaultyNode(t, ctx, nil)
	p := f.serving(ctx)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	require.Nil(t, f.createCollection(ctx, v).Error)

	var third atomic.Int64
	f.fb.SetInjector(faulty.First(
		faulty.When(insertOf("1"), faulty.Fault{Err: faulty.Unavailable()}),
		faulty.When(func(c faulty.Call) bool {
			if insertOf("2")(c) {
				third.Add(1)
			}
			return false
		}, faulty.Fault{})))
	reply, err := f.request(ctx, p, f.insert(v, "0"), f.insert(v, "1"), f.insert(v, "2"))
	require.NoError(t, err)
	require.Len(t, reply.Results, 3)
	require.Nil(t, reply.Results[0].Error)
	require.Positive(t, reply.Results[0].ID)
	require.NotNil(t, reply.Results[1].Error)
	require.Equal(t, streamwal.CodeUnavailable, reply.Results[1].Error.Code)
	require.NotNil(t, reply.Results[2].Error)
	require.True(t, streamwal.IsRetriable(streamwal.Errorf(reply.Results[2].Error.Code, "%s", reply.Results[2].Error.Message)),
		"the later append is refused as retriable: %+v", reply.Results[2].Error)
	require.Zero(t, third.Load(), "the later append never reached the writer")

	// The WAL still serves: the refused appends go through on a retry.
	f.fb.SetInjector(nil)
	first := reply.Results[0].ID
	reply, err = f.request(ctx, p, f.insert(v, "1"), f.insert(v, "2"))
	require.NoError(t, err)
	require.Nil(t, reply.Results[0].Error)
	require.Nil(t, reply.Results[1].Error)
	require.Greater(t, reply.Results[0].ID, first)
	require.Greater(t, reply.Results[1].ID, reply.Results[0].ID)
}

// TestFaultyCloseFinishesAppendsInFlight: a graceful Close stops taking
// appends (nothing answers the append subject any more) but finishes
// those in flight: an append the backend holds up while the node closes
// lands and gets its result once the backend lets it through, and Close
// returns after it.
func TestFaultyCloseFinishesAppendsInFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := startFaultyNode(t, ctx, nil)
	p := f.serving(ctx)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	require.Nil(t, f.createCollection(ctx, v).Error)

	open, results := f.holdAppend(ctx, t, v)
	defer open()
	n := f.node()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = n.Close()
	}()
	// An append request without messages is answered at once (refused)
	// while the node serves p: no append queues behind the held one. One
	// that reaches the node as it unsubscribes goes unanswered: each
	// probe waits a little only.
	subject := f.sys.Codec.Cluster().AppendSubject(p)
	require.Eventually(t, func() bool {
		probe, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err := f.sys.Conn().RequestWithContext(probe, subject, []byte("{}"))
		return errors.Is(err, nats.ErrNoResponders)
	}, 30*time.Second, 5*time.Millisecond, "the closing node stops taking appends")
	select {
	case <-closed:
		t.Fatal("Close returned with an append in flight")
	default:
	}
	open()
	var got appendResult
	select {
	case got = <-results:
	case <-ctx.Done():
		t.Fatal("no reply to the append in flight")
	}
	require.NoError(t, got.err)
	require.Len(t, got.reply.Results, 1)
	require.Nil(t, got.reply.Results[0].Error, "the append in flight landed")
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Close did not return")
	}
}

// TestFaultyRetryOfUnknownOutcomeIsNotStoredTwice: an insert whose outcome
// the writer cannot tell (it landed) fails with the unknown outcome while
// the WAL goes on serving; the client's retry under the same message ID
// is recognised as a duplicate and answered with the message that
// landed: the stream holds it once.
func TestFaultyRetryOfUnknownOutcomeIsNotStoredTwice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := startFaultyNode(t, ctx, nil)
	p := f.serving(ctx)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	require.Nil(t, f.createCollection(ctx, v).Error)
	w, _ := f.node().WAL(p)

	insert := func() *messages.MutableMessage {
		m, err := f.sys.Codec.New(messages.TypeInsert, v, []byte("unknown"), messages.WithDML(0, 1), messages.WithMsgID("retried"))
		require.NoError(t, err)
		return m
	}
	f.fb.SetInjector(faulty.Once(faulty.When(insertOf("unknown"), faulty.Fault{Err: faulty.UnknownOutcome(), After: true})))
	reply, err := f.request(ctx, p, insert())
	require.NoError(t, err)
	require.NotNil(t, reply.Results[0].Error)
	require.Equal(t, streamwal.CodeUnknownOutcome, reply.Results[0].Error.Code)
	require.NoError(t, w.Err(), "the WAL goes on serving")

	reply, err = f.request(ctx, p, insert())
	require.NoError(t, err)
	require.Nil(t, reply.Results[0].Error)
	landed := reply.Results[0].ID
	cur, ok := f.node().WAL(p)
	require.True(t, ok)
	require.Same(t, w, cur)

	sc, err := f.fb.Unwrap().Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	require.NoError(t, err)
	defer func() { require.NoError(t, sc.Close()) }()
	copies := 0
	last, err := f.sys.Codec.New(messages.TypeInsert, v, []byte("last"), messages.WithDML(0, 1))
	require.NoError(t, err)
	reply, err = f.request(ctx, p, last)
	require.NoError(t, err)
	require.Nil(t, reply.Results[0].Error)
	for {
		m, err := sc.Next(ctx)
		require.NoError(t, err)
		if m.Type() == messages.TypeInsert && string(m.Payload()) == "unknown" {
			copies++
			require.Equal(t, landed, m.ID(), "the retry is answered with the message that landed")
		}
		if m.ID() >= reply.Results[0].ID {
			break
		}
	}
	require.Equal(t, 1, copies)
}

// appendResult is the outcome of an append request.
type appendResult struct {
	reply wire.AppendReply
	err   error
}

// holdAppend sends an insert to v's PChannel and returns once the
// backend holds its append, with the func that lets it through (called
// at the end of the test at the latest) and where the reply arrives.
func (f *faultyNode) holdAppend(ctx context.Context, t *testing.T, v streamwal.VChannel) (func(), <-chan appendResult) {
	t.Helper()
	gate, reached := make(chan struct{}), make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	t.Cleanup(open)
	held := faulty.Once(faulty.When(insertOf("held"), faulty.Fault{Hold: gate}))
	f.fb.SetInjector(faulty.InjectorFunc(func(c faulty.Call) faulty.Fault {
		got := held.Inject(c)
		if got.Hold != nil {
			close(reached)
		}
		return got
	}))
	results := make(chan appendResult, 1)
	m := f.insert(v, "held")
	go func() {
		reply, err := f.request(ctx, v.PChannel(), m)
		results <- appendResult{reply, err}
	}()
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatal("the append never reached the writer")
	}
	return open, results
}

// TestFaultyCloseIsBounded: an append the backend holds past the close
// budget does not hold a graceful Close's goodbye back: the node closes
// its WALs within a bounded time and deletes its registration while the
// append is still held.
func TestFaultyCloseIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := startFaultyNode(t, ctx, nil, func(c *node.Config) { c.CloseBudget = 100 * time.Millisecond })
	p := f.serving(ctx)
	v, err := p.VChannel(1, 0)
	require.NoError(t, err)
	require.Nil(t, f.createCollection(ctx, v).Error)
	js, err := njs.New(f.sys.Conn())
	require.NoError(t, err)
	nodes, err := js.KeyValue(ctx, f.sys.Codec.Cluster().BucketName(streamwal.BucketNodes))
	require.NoError(t, err)
	n := f.node()
	_, err = nodes.Get(ctx, streamwal.NodeKey(n.ID()))
	require.NoError(t, err, "the node is registered")

	open, _ := f.holdAppend(ctx, t, v)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = n.Close()
	}()
	require.Eventually(t, func() bool {
		_, err := nodes.Get(ctx, streamwal.NodeKey(n.ID()))
		return errors.Is(err, njs.ErrKeyNotFound)
	}, 30*time.Second, 10*time.Millisecond, "the node said goodbye with the append still held")
	open()
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Close did not return")
	}
}
