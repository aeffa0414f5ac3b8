package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/services/wire"
)

// requireComesUpBalanced checks the view v of a cluster of two
// coordinators and two nodes that just came up: 16 PChannels on two
// nodes, 8 each, with one coordinator active and one standby
// (TestTakeoverKeepsAssignmentsOfEveryNode starts such a cluster).
func requireComesUpBalanced(t *testing.T, s *system.System, v wire.View) {
	t.Helper()
	require.Len(t, v.Channels, 16)
	require.Len(t, v.Nodes, 2)
	owners := map[string]int{}
	for _, a := range v.Channels {
		owners[a.Node]++
		require.Positive(t, a.Term)
	}
	for n, c := range owners {
		require.Equal(t, 8, c, "node %s", n)
	}
	active := 0
	for _, c := range s.Coordinators() {
		if _, ok := c.Active(); ok {
			active++
		}
	}
	require.Equal(t, 1, active, "exactly one coordinator is active")
	require.Contains(t, v.CChannel, "_vcchan")
}

// TestAddNodeMovesChannels: a node joining a one-node cluster takes half
// the PChannels, while a writer appends without loss.
func TestAddNodeMovesChannels(t *testing.T) {
	s := startSystem(t, 1, 1)
	waitServing(t, s, true)
	w := newWriter(t, s, 16)
	w.start(8)
	w.waitFor(t, 200)
	_, err := s.AddNode(context.Background())
	require.NoError(t, err)
	var v wire.View
	require.Eventually(t, func() bool {
		v = waitServing(t, s, true)
		return len(v.Nodes) == 2
	}, 30*time.Second, 10*time.Millisecond, "the new node takes half the PChannels")
	w.waitFor(t, 200)
	w.finish(t)
	w.checkReadBack(t, s)
}

// TestNodeCrashFailover: a node stopped without a goodbye has its
// PChannels serving on the other node; the time from the crash to every
// PChannel accepting appends again is reported.
func TestNodeCrashFailover(t *testing.T) {
	s := startSystem(t, 1, 2)
	before := waitServing(t, s, true)
	w := newWriter(t, s, 16)
	w.start(8)
	w.waitFor(t, 200)

	victim := streamwal.NodeID(before.Nodes[0])
	crashed := time.Now()
	s.StopNode(victim, true)
	waitAppendable(t, s, w, victim)
	failover := time.Since(crashed)
	t.Logf("failover: %v from the crash of %s to every PChannel accepting appends", failover, victim)
	require.Less(t, failover, 15*time.Second, "failover must finish")

	after := waitServing(t, s, false)
	for _, a := range after.Channels {
		require.NotEqual(t, string(victim), a.Node)
	}
	for _, a := range before.Channels {
		if a.Node == string(victim) {
			require.Greater(t, termOf(after, a.PChannel), a.Term, "%s was reassigned under a new term", a.PChannel)
		}
	}
	w.waitFor(t, 200)
	w.finish(t)
	w.checkReadBack(t, s)
}

// waitAppendable waits until an append to every collection succeeds after
// the crash and returns how long that took.
func waitAppendable(t *testing.T, s *system.System, w *writer, victim streamwal.NodeID) time.Duration {
	start := time.Now()
	for i, v := range w.vs {
		w.appendInsert(v, "probe-"+v.String()+"-"+string(victim))
		require.Empty(t, w.fatal, "probe %d", i)
	}
	return time.Since(start)
}

// termOf returns the term of a PChannel in a view.
func termOf(v wire.View, p string) uint64 {
	for _, a := range v.Channels {
		if a.PChannel == p {
			return a.Term
		}
	}
	return 0
}
