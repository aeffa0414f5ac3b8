package integration

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/wire"
)

// watchView watches the view key on a connection of its own, as a client
// or an operator (`nats kv watch`) would, and returns the watcher after
// its initial value (the current view).
func watchView(t *testing.T, s *system.System) (njs.KeyWatcher, wire.View, *nats.Conn) {
	t.Helper()
	nc, err := s.Server.Connect(nats.Name("view-watcher"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := njs.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, s.Codec.Cluster().BucketName(streamwal.BucketAssignments))
	require.NoError(t, err)
	wctx, wcancel := context.WithCancel(context.Background())
	t.Cleanup(wcancel)
	watcher, err := kv.Watch(wctx, streamwal.KeyView)
	require.NoError(t, err)
	t.Cleanup(func() { _ = watcher.Stop() })
	var initial wire.View
	for got := false; ; {
		e := nextEntry(t, watcher)
		if e == nil {
			require.True(t, got, "the view key has a value")
			return watcher, initial, nc
		}
		initial, got = decodeView(t, e), true
	}
}

// nextEntry is the watcher's next update (nil: the end of the initial
// values).
func nextEntry(t *testing.T, w njs.KeyWatcher) njs.KeyValueEntry {
	t.Helper()
	select {
	case e, ok := <-w.Updates():
		require.True(t, ok, "the watcher stopped")
		return e
	case <-time.After(30 * time.Second):
		t.Fatal("no view update within 30s")
		return nil
	}
}

// decodeView decodes a put of the view key.
func decodeView(t *testing.T, e njs.KeyValueEntry) wire.View {
	t.Helper()
	require.Equal(t, njs.KeyValuePut, e.Operation(), "the view is only ever put")
	var v wire.View
	require.NoError(t, json.Unmarshal(e.Value(), &v))
	return v
}

// appendResponders lists the client connections subscribed to p's append
// subject, by name.
func appendResponders(t *testing.T, s *system.System, p string) []string {
	t.Helper()
	pc, err := streamwal.ParsePChannel(p)
	require.NoError(t, err)
	ns := s.Server.NATSServer()
	sz, err := ns.Subsz(&server.SubszOptions{Subscriptions: true, Test: s.Codec.Cluster().AppendSubject(pc), Limit: 4096})
	require.NoError(t, err)
	var out []string
	for _, sub := range sz.Subs {
		cz, err := ns.Connz(&server.ConnzOptions{CID: sub.Cid})
		require.NoError(t, err)
		require.Len(t, cz.Conns, 1)
		out = append(out, cz.Conns[0].Name)
	}
	return out
}

// TestDiscoveryViewWatch: the view key is watchable; while a node joins,
// every update carries a larger Version than the one before, and the last
// one shows the balanced assignment. Each PChannel's append subject has
// exactly one responder, its owner, which answers a plain request; once
// every node is gone, nobody answers and wire.Call says so with a
// retriable ErrUnavailable.
func TestDiscoveryViewWatch(t *testing.T) {
	s := startCluster(t, 1, 1)
	waitServing(t, s, true)
	w := newWriter(t, s, 16)
	w.start(8)
	w.waitFor(t, 200)

	watcher, initial, nc := watchView(t, s)
	require.True(t, balancedOn(initial, 1), "the initial value is the current view: %+v", initial)
	_, err := s.AddNode(context.Background())
	require.NoError(t, err)

	prev, last := initial, initial
	updates := 0
	for !balancedOn(last, 2) {
		e := nextEntry(t, watcher)
		require.NotNil(t, e)
		last = decodeView(t, e)
		updates++
		require.Greater(t, last.Version, prev.Version, "view versions strictly increase (update %d)", updates)
		require.Equal(t, initial.Epoch, last.Epoch, "no takeover happened")
		prev = last
	}
	t.Logf("node join: %d view updates, version %d -> %d", updates, initial.Version, last.Version)
	require.Equal(t, []int{8, 8}, sortedCounts(last))

	// The balanced update is the final one: the coordinator's view is the
	// same version, and nothing else was published.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	current, err := s.View(ctx)
	require.NoError(t, err)
	require.Equal(t, last.Version, current.Version, "the balanced update is the last one")
	require.Equal(t, last.Channels, current.Channels)
	select {
	case e := <-watcher.Updates():
		require.Nil(t, e, "no update after the balanced one")
	default:
	}

	// One responder per append subject, the owner, answering a plain
	// request (an empty append: refused, but answered by the node).
	for _, a := range current.Channels {
		require.Equal(t, []string{a.Node}, appendResponders(t, s, a.PChannel), "%s has its owner as only responder", a.PChannel)
		p, err := streamwal.ParsePChannel(a.PChannel)
		require.NoError(t, err)
		subject := s.Codec.Cluster().AppendSubject(p)
		m, err := nc.RequestWithContext(ctx, subject, []byte(`{"messages":[]}`))
		require.NoError(t, err, "%s answers a plain request", subject)
		require.NotEmpty(t, m.Data)
		err = wire.Call(ctx, nc, subject, wire.AppendRequest{}, nil)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "the owner itself refuses an empty append")
	}

	w.waitFor(t, 200)
	w.finish(t)
	w.checkReadBack(t, s)

	// Every node gone: nobody answers.
	for _, n := range s.Nodes() {
		s.StopNode(n.ID(), false)
	}
	for _, a := range current.Channels {
		require.Empty(t, appendResponders(t, s, a.PChannel))
		p, err := streamwal.ParsePChannel(a.PChannel)
		require.NoError(t, err)
		subject := s.Codec.Cluster().AppendSubject(p)
		_, err = nc.RequestWithContext(ctx, subject, []byte(`{"messages":[]}`))
		require.ErrorIs(t, err, nats.ErrNoResponders)
		err = wire.Call(ctx, nc, subject, wire.AppendRequest{}, nil)
		require.ErrorIs(t, err, streamwal.ErrUnavailable)
		require.ErrorIs(t, err, nats.ErrNoResponders)
		require.True(t, streamwal.IsRetriable(err))
	}
}

// TestBalanceOnDemand: a balance request returns the view; on a balanced
// cluster it moves nothing (no new version); after a node joins, with the
// balance timer an hour away, a few requests lead to a balanced view.
func TestBalanceOnDemand(t *testing.T) {
	s := startSystemWith(t, system.Options{Coordinators: 1, Nodes: 1,
		Coord: coord.Config{BalanceInterval: time.Hour}})
	before := waitServing(t, s, true)
	w := newWriter(t, s, 16)
	w.start(8)
	w.waitFor(t, 200)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subject := s.Codec.Cluster().CoordSubject(streamwal.CoordBalance)
	balance := func() wire.View {
		var v wire.View
		require.NoError(t, wire.Call(ctx, s.Conn(), subject, struct{}{}, &v))
		require.Len(t, v.Channels, len(before.Channels))
		return v
	}

	// A balanced cluster: the request plans nothing.
	settled, err := s.View(ctx)
	require.NoError(t, err)
	got := balance()
	require.Equal(t, settled.Version, got.Version, "a balance request on a balanced cluster publishes nothing")
	require.Equal(t, settled.Channels, got.Channels)

	_, err = s.AddNode(ctx)
	require.NoError(t, err)
	start := time.Now()
	requests := 0
	var last wire.View
	require.Eventually(t, func() bool {
		last = balance()
		requests++
		return balancedOn(last, 2)
	}, 30*time.Second, 20*time.Millisecond, "balance requests lead to a balanced view")
	t.Logf("balanced after %d balance requests, %v after the join (view version %d)", requests, time.Since(start), last.Version)
	require.Equal(t, []int{8, 8}, sortedCounts(last))

	// Balanced again: another request moves nothing.
	again := balance()
	require.Equal(t, last.Version, again.Version)
	require.Equal(t, last.Channels, again.Channels)

	w.waitFor(t, 200)
	w.finish(t)
	w.checkReadBack(t, s)
}
