package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/wire"
)

// restartOptions are those of a cluster that restarts as `streamwal
// serve` does: the same coordinator and node IDs every time (the system
// names its members in order), on one server's storage.
func restartOptions(srv *embedded.Server, reclaim bool) system.Options {
	return system.Options{Cluster: "it", Server: srv, Nodes: 2, Coord: coord.Config{ReclaimLease: reclaim}}
}

// startOn starts a system on srv and waits until it serves.
func startOn(t *testing.T, o system.Options) *system.System {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := system.Start(ctx, o)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	t.Cleanup(func() { stopNodes(s) })
	waitServing(t, s, false)
	return s
}

// TestFullRestartSameIDsIsWritable restarts a whole cluster, coordinator
// and nodes together under the same IDs, as every restart of `serve`
// does: stopped gracefully or crashed, on the same server or with the
// server restarted on its storage too. After each restart every PChannel
// must be served by a node that confirmed it, under a newer term, every
// VChannel must take writes, and every acknowledged write must read back
// exactly once. A crashed coordinator's lease is waited out unless the
// restart may reclaim it (as serve, which holds its data directory's
// lock, does).
func TestFullRestartSameIDsIsWritable(t *testing.T) {
	for _, tc := range []struct {
		name          string
		crash         bool
		reclaim       bool
		restartServer bool
	}{
		{"graceful", false, false, false},
		{"graceful with server restart", false, false, true},
		{"crash", true, false, false},
		{"crash reclaiming the lease with server restart", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // mostly idle: leases and heartbeats
			srv := embedded.StartTest(t)
			o := restartOptions(srv, tc.reclaim)
			s := startOn(t, o)
			w := newWriter(t, s, 4)
			w.start(4)
			w.waitFor(t, 100)
			w.finish(t)
			before, err := s.View(testContext(t))
			require.NoError(t, err)

			if tc.crash {
				s.Crash()
			} else {
				stopNodes(s)
				s.Close()
			}
			if tc.restartServer {
				require.NoError(t, srv.Restart())
			}
			start := time.Now()
			s2 := startOn(t, o)
			after := waitServing(t, s2, false)
			t.Logf("served again %v after the restart began", time.Since(start))
			requireNewerTerms(t, before, after)

			w.nc, w.stop = s2.Conn(), make(chan struct{})
			probeAll(t, w, "after-restart")
			w.start(4)
			w.waitFor(t, 100)
			w.finish(t)
			w.checkReadBack(t, s2)
		})
	}
}

// TestNodeRestartsAloneUnderItsID: one node of a running cluster stops
// and starts again under its ID (a new session); the coordinator, which
// kept running, reopens what it served under new terms, and its
// PChannels take writes again.
func TestNodeRestartsAloneUnderItsID(t *testing.T) {
	t.Parallel()
	srv := embedded.StartTest(t)
	s := startOn(t, restartOptions(srv, false))
	w := newWriter(t, s, 4)
	before := waitServing(t, s, false)
	for _, crash := range []bool{false, true} {
		id := streamwal.NodeID(before.Nodes[0])
		s.StopNode(id, crash)
		ctx := testContext(t)
		n, err := s.StartNode(ctx, id)
		require.NoError(t, err)
		after := viewWhen(t, s, "the restarted node serves again", func(v wire.View) bool {
			for _, a := range v.Channels {
				if !a.Serving || a.Node == string(id) && a.Session != n.Session() {
					return false
				}
			}
			return len(v.Nodes) == 2
		})
		for _, a := range channelsOf(before, id) {
			for _, b := range after.Channels {
				if b.PChannel == a.PChannel {
					require.Greater(t, b.Term, a.Term, "%s was served by the old incarnation of %s", a.PChannel, id)
				}
			}
		}
		probeAll(t, w, "node-restart")
		before = after
	}
	w.checkReadBack(t, s)
}

// requireNewerTerms checks that every PChannel of after is served under a
// term above the one it had before: no owner's old incarnation is
// trusted across a restart.
func requireNewerTerms(t *testing.T, before, after wire.View) {
	t.Helper()
	terms := map[string]uint64{}
	for _, a := range before.Channels {
		terms[a.PChannel] = a.Term
	}
	for _, a := range after.Channels {
		require.True(t, a.Serving, "%s not serving", a.PChannel)
		require.Greater(t, a.Term, terms[a.PChannel], "%s kept its term across the restart", a.PChannel)
	}
}

// testContext is a context that ends with the test (or after 30 s).
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
