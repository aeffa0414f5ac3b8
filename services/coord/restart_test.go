package coord

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/wire"
)

// waitServing waits until every PChannel is ASSIGNED to node at term and
// confirmed as served by it.
func (e *env) waitServing(node string, term uint64) wire.View {
	e.t.Helper()
	var v wire.View
	require.Eventually(e.t, func() bool {
		v = wire.View{}
		if err := e.call(streamwal.CoordStatus, struct{}{}, &v); err != nil || len(v.Channels) == 0 {
			return false
		}
		for _, a := range v.Channels {
			if a.State != wire.Assigned || a.Node != node || a.Term != term || !a.Serving {
				return false
			}
		}
		return true
	}, 10*time.Second, poll, "channels never all served by %q at term %d", node, term)
	return v
}

// openCount is how many opens a fake node received.
func (n *fakeNode) openCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.opens)
}

// problemsOf are the protocol violations a fake node saw.
func (n *fakeNode) problemsOf() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.problems...)
}

// A whole cluster restarts: coordinator and node, the node under its
// stable ID in a new session that serves nothing yet. Every PChannel must
// be reopened on the new incarnation under a new term, whether the old
// incarnation died (its last heartbeat still in the bucket) or said
// goodbye. The coordinator once trusted the persisted assignments and took
// the new session's first heartbeat for the old owner's.
func TestFullRestartReopensEveryPChannelOfTheNewIncarnation(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(*fakeNode)
	}{
		{"node crashed", (*fakeNode).kill},
		{"node left", (*fakeNode).leave},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			c := e.start("coord-1")
			e.waitActive(5*time.Second, c)
			n := e.nodeSession("n1", "s1")
			e.waitServing("n1", 1)

			require.NoError(t, c.Close())
			tc.stop(n)

			c2 := e.start("coord-1")
			e.waitActive(5*time.Second, c2)
			again := e.nodeSession("n1", "s2")
			v := e.waitServing("n1", 2)
			for _, a := range v.Channels {
				require.Equal(t, "s2", a.Session, a.PChannel)
			}
			require.Equal(t, len(v.Channels), again.openCount())
			require.Empty(t, again.problemsOf())
		})
	}
}

// A coordinator that takes over from one that stopped keeps the
// assignments its live nodes confirm: no PChannel moves, no term grows.
func TestTakeoverKeepsWhatLiveNodesConfirm(t *testing.T) {
	e := newEnv(t)
	a := e.start("a")
	e.waitActive(5*time.Second, a)
	n := e.nodeSession("n1", "s1")
	e.waitServing("n1", 1)
	opens := n.openCount()

	require.NoError(t, a.Close())
	b := e.start("b")
	e.waitActive(5*time.Second, b)
	e.waitServing("n1", 1)
	require.Equal(t, opens, n.openCount(), "a confirmed PChannel was opened again")
}

// Until a live heartbeat confirms them, the PChannels a new coordinator
// found persisted are not served: the last heartbeat of a node that died
// still lists them, and must not count.
func TestStaleHeartbeatNeverConfirmsServing(t *testing.T) {
	e := newEnv(t)
	a := e.start("a", withLease(time.Minute))
	e.waitActive(5*time.Second, a)
	n := e.nodeSession("n1", "s1")
	e.waitServing("n1", 1)
	require.NoError(t, a.Close())
	n.kill()

	b := e.start("b")
	e.waitActive(5*time.Second, b)
	// The dead node's PChannels are never served; they end UNAVAILABLE
	// once its heartbeats are overdue.
	require.Eventually(t, func() bool {
		v := e.status()
		for _, ch := range v.Channels {
			require.False(t, ch.Serving, "%s served by a dead node: %+v", ch.PChannel, ch)
			if ch.State != wire.Unavailable {
				return false
			}
		}
		return true
	}, 10*time.Second, poll)
}

// A node that stops serving a PChannel by itself (its WAL failed or was
// fenced) says so in its next heartbeat, and the coordinator reassigns it.
func TestPChannelDroppedByItsOwnerIsReassigned(t *testing.T) {
	e := newEnv(t)
	c := e.start("a")
	e.waitActive(5*time.Second, c)
	n := e.nodeSession("n1", "s1")
	e.waitServing("n1", 1)

	n.unserve("pchan-2")
	require.Eventually(t, func() bool {
		for _, ch := range e.status().Channels {
			if ch.PChannel == "pchan-2" {
				return ch.Term == 2 && ch.Serving && ch.Node == "n1"
			}
		}
		return false
	}, 10*time.Second, poll)
	for _, ch := range e.status().Channels {
		if ch.PChannel != "pchan-2" {
			require.Equal(t, uint64(1), ch.Term, ch.PChannel)
		}
	}
}

// A coordinator restarted under its ID with ReclaimLease takes over the
// lease its crashed incarnation left at once, instead of waiting for it
// to lapse (here a minute, far beyond the test's deadline).
func TestReclaimLeaseTakesOverAnOwnLease(t *testing.T) {
	e := newEnv(t)
	reclaim := func(c *Config) { c.ReclaimLease = true }
	a := e.start("coord-1", withLease(time.Minute), reclaim)
	e.waitActive(5*time.Second, a)
	ep := epochOf(t, a)
	a.Crash()

	again := e.start("coord-1", withLease(time.Minute), reclaim)
	e.waitActive(5*time.Second, again)
	require.Greater(t, epochOf(t, again), ep)
}

// ReclaimLease never takes a lease held under another ID.
func TestReclaimLeaseLeavesAnotherIDsLease(t *testing.T) {
	e := newEnv(t)
	a := e.start("coord-1", withLease(time.Minute))
	e.waitActive(5*time.Second, a)
	a.Crash()

	other := e.start("coord-2", withLease(time.Minute), func(c *Config) { c.ReclaimLease = true })
	kv := e.kv(streamwal.BucketLeader)
	before, err := kv.Get(testCtx(t), streamwal.KeyLeader)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = other.reclaim(ctx, kv)
	require.ErrorIs(t, err, streamwal.ErrResourceBusy)
	after, err := kv.Get(testCtx(t), streamwal.KeyLeader)
	require.NoError(t, err)
	require.Equal(t, before.Revision(), after.Revision())
	require.Equal(t, "coord-1", string(after.Value()))
	_, active := other.Active()
	require.False(t, active)
}

// stallingNode registers and heartbeats in session but never answers an
// open, as a node stuck in a long replay; stop ends its heartbeats.
func (e *env) stallingNode(id streamwal.NodeID, session string) (stop func()) {
	t := e.t
	opens, err := e.nc.Subscribe(testCluster.NodeSubject(id, streamwal.NodeOpen), func(*nats.Msg) {})
	require.NoError(t, err)
	rec, err := json.Marshal(wire.NodeRecord{Node: string(id), Session: session})
	require.NoError(t, err)
	nodes := e.kv(streamwal.BucketNodes)
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(testNodeTTL / 4)
		defer tick.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = nodes.Put(ctx, streamwal.NodeKey(id), rec)
			cancel()
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(quit)
			<-done
			_ = opens.Unsubscribe()
		})
	}
	t.Cleanup(stop)
	return stop
}

// A node restarted while an open to its previous incarnation is under
// way (stuck in a long replay) gets its PChannels at once: the lost
// incarnation's opens are cancelled instead of holding the PChannels for
// the open timeout (here a minute, far beyond the test's deadline).
func TestLosingANodeCancelsItsOpens(t *testing.T) {
	e := newEnv(t)
	c := e.start("a", func(c *Config) { c.OpenTimeout = time.Minute })
	e.waitActive(5*time.Second, c)
	stop := e.stallingNode("n1", "s1")
	require.Eventually(t, func() bool {
		for _, ch := range e.status().Channels {
			if ch.State != wire.Assigning {
				return false
			}
		}
		return true
	}, 10*time.Second, poll)
	stop()
	again := e.nodeSession("n1", "s2")
	e.waitServing("n1", 2)
	require.Empty(t, again.problemsOf())
}

// refuseOpens makes the node refuse every open of p with why (nil: accept
// them again).
func (n *fakeNode) refuseOpens(p string, why error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.refuse == nil {
		n.refuse = map[string]error{}
	}
	if why == nil {
		delete(n.refuse, p)
		return
	}
	n.refuse[p] = why
}

// refusal is why the node refuses an open of p (nil: it accepts).
func (n *fakeNode) refusal(p string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.refuse[p]
}

// channelOf is p in v (zero if v has none).
func channelOf(v wire.View, p string) wire.Assignment {
	for _, a := range v.Channels {
		if a.PChannel == p {
			return a
		}
	}
	return wire.Assignment{}
}

// storedError is the Error of p's assignment in the assignments bucket.
func (e *env) storedError(p string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pc, err := streamwal.ParsePChannel(p)
	if err != nil {
		return ""
	}
	ent, err := e.kv(streamwal.BucketAssignments).Get(ctx, streamwal.AssignmentKey(pc))
	if err != nil {
		return ""
	}
	var a wire.Assignment
	if json.Unmarshal(ent.Value(), &a) != nil {
		return ""
	}
	return a.Error
}

// A node's refusal to open a PChannel (here HISTORY_LOST) is recorded on
// the assignment, in the view and in the assignments bucket, while the
// PChannel is not served, through the coordinator's next attempts; it is
// cleared once an owner confirms the PChannel.
func TestOpenErrorIsRecordedUntilServed(t *testing.T) {
	e := newEnv(t)
	c := e.start("a")
	e.waitActive(5*time.Second, c)
	n := e.nodeSession("n1", "s1")
	lost := streamwal.Errorf(streamwal.CodeHistoryLost, "pchan-2: the stream ends at 3 but MessageIDs up to 9 were handed out")
	n.refuseOpens("pchan-2", lost)

	var a wire.Assignment
	require.Eventually(t, func() bool {
		a = channelOf(e.status(), "pchan-2")
		return a.Error != ""
	}, 10*time.Second, poll, "the refusal never showed")
	require.Contains(t, a.Error, string(streamwal.CodeHistoryLost))
	require.Contains(t, a.Error, "MessageIDs up to 9")
	require.False(t, a.Serving)
	require.Eventually(t, func() bool {
		return strings.Contains(e.storedError("pchan-2"), string(streamwal.CodeHistoryLost))
	}, 10*time.Second, poll, "the refusal was never persisted")
	// Later attempts keep it: it stays while the PChannel is not served.
	opens := n.openCount()
	require.Eventually(t, func() bool { return n.openCount() > opens+2 }, 10*time.Second, poll)
	a = channelOf(e.status(), "pchan-2")
	require.Contains(t, a.Error, string(streamwal.CodeHistoryLost))
	for _, ch := range e.status().Channels {
		if ch.PChannel != "pchan-2" && ch.Serving {
			require.Empty(t, ch.Error, ch.PChannel)
		}
	}

	n.refuseOpens("pchan-2", nil)
	require.Eventually(t, func() bool {
		a = channelOf(e.status(), "pchan-2")
		return a.Serving
	}, 10*time.Second, poll, "never served once the node accepted")
	require.Empty(t, a.Error)
	require.Eventually(t, func() bool { return e.storedError("pchan-2") == "" }, 10*time.Second, poll,
		"the refusal stayed persisted")
	require.Empty(t, n.problemsOf())
}
