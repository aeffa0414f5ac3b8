package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/integration/workload"
)

// The shape of the cluster the fault test runs.
const (
	faultPChannels = 4
	faultReplicas  = "3"
	// faultProgress is how many more acknowledged operations of the load
	// the test waits for after each fault, before the next one.
	faultProgress = 50
)

// The IDs the fault test's processes run under, at every start.
var (
	faultCoords = []string{"coord-1", "coord-2"}
	faultNodes  = []string{"node-1", "node-2", "node-3"}
)

// faultRig is a three-server JetStream cluster of the test's, with the
// streamwal binary running on it as separate processes (two
// coordinators, three nodes, every stream and bucket at 3 replicas), a
// client load and its checker.
type faultRig struct {
	t      *testing.T
	nats   *embedded.Cluster
	urls   string
	procs  map[string]*serveProc // by component ID
	states string                // the nodes' state directories live below it
	c      *client.Client
	load   *workload.Load
}

// TestClusterProcessesUnderFaults runs streamwal as separate processes on
// a three-server JetStream cluster (issue 15 item 2): two `streamwal
// coord` and three `streamwal node`, each given all three server URLs,
// stable IDs and --replicas 3. A client load (plain appends from several
// goroutines over four VChannels of two collections, and transactions
// committed and rolled back) runs while, one after another: (a) the NATS
// server that is the JetStream meta leader is stopped and restarted on
// its store (the servers run in the test's process: the stop is a
// shutdown without lame duck mode, which drops every connection at once
// but, unlike a SIGKILL, hands the server's raft leaderships over
// first); (b) a node is killed with SIGKILL and
// started again; (c) the active coordinator is killed with SIGKILL and
// started again; (d) a node is frozen with SIGSTOP until the coordinator
// declared it dead and its PChannels serve elsewhere, then thawed with
// SIGCONT, while the load keeps sending to the PChannels it served; (e)
// every coordinator and node is killed with SIGKILL and started again
// under the same IDs. After each fault the time until every PChannel
// acknowledges an append again is logged ("fault X: writable again after
// Y"). At the end the load's checker (package workload) reads everything
// back: every acknowledged append exactly once where it was acknowledged,
// transactions whole or not at all, MessageIDs and TimeTicks strictly
// increasing per VChannel and per PChannel, and no message of an old term
// after a newer term's RecoveryBarrier (the frozen node's writes landed
// nothing after its successor's barrier). Its cluster, processes and
// directories are its own, and it mostly waits for them (the processes
// run without -race): it runs in parallel with the other tests that do,
// the restart tests, instead of before them.
func TestClusterProcessesUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of faults on a cluster of processes")
	}
	t.Parallel()
	began := time.Now()
	r := startFaultRig(t)

	r.natsServerFault()
	r.nodeKill()
	r.coordKill()
	r.nodeFreeze()
	r.restartAll()

	r.load.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), componentTimeout)
	defer cancel()
	rep, err := r.load.Check(ctx)
	require.NoError(t, err)
	t.Logf("checker: %s", rep)
	for _, b := range rep.BarriersBehind {
		t.Logf("barrier behind: %s", b)
	}
	require.NoError(t, rep.Err())
	require.Positive(t, rep.Plain.Acknowledged)
	require.Positive(t, rep.Txns.Committed)
	t.Logf("the whole test took %s", time.Since(began).Round(time.Millisecond))
}

// startFaultRig starts the cluster, the processes and the load, and waits
// until the load makes progress.
func startFaultRig(t *testing.T) *faultRig {
	t.Helper()
	nats := embedded.StartTestCluster(t)
	r := &faultRig{t: t, nats: nats, urls: strings.Join(nats.ClientURLs(), ","), procs: map[string]*serveProc{},
		states: t.TempDir()}
	r.startAll()
	c, err := client.Connect(r.urls, client.WithoutLocalBypass())
	require.NoError(t, err)
	t.Cleanup(func() { closeLater(t, c) })
	r.c = c
	r.waitServed(faultNodes...)

	ctx, cancel := context.WithTimeout(context.Background(), componentTimeout)
	defer cancel()
	var vs []streamwal.VChannel
	for id := int64(1); id <= 2; id++ {
		got, err := c.CreateCollection(ctx, client.Collection{DBName: "faults", Name: fmt.Sprintf("c%d", id), ID: id, Shards: 2})
		require.NoError(t, err)
		vs = append(vs, got...)
	}
	nc, err := nats.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	// A NATS failover delays the nodes' heartbeats past the coordinator's
	// NodeTTL (1 s): it declares live nodes dead and moves their
	// PChannels while they still write. The oracle refuses TimeTicks to
	// an owner once its successor's term is recorded, so every barrier
	// stays above every TimeTick before it: the check is strict.
	r.load, err = workload.New(workload.Config{Client: c, Conn: nc, VChannels: vs, Appenders: 4, Seed: 15})
	require.NoError(t, err)
	t.Logf("load on %v (PChannels %v)", vs, r.load.PChannels())
	require.NoError(t, r.load.Start())
	t.Cleanup(r.load.Stop)
	r.waitProgress()
	return r
}

// coordArgs are the arguments of coordinator id.
func (r *faultRig) coordArgs(id string) []string {
	return []string{"coord", "--server", r.urls, "--id", id, "--replicas", faultReplicas,
		"--pchannels", fmt.Sprint(faultPChannels)}
}

// nodeArgs are the arguments of node id.
func (r *faultRig) nodeArgs(id string) []string {
	return []string{"node", "--server", r.urls, "--id", id, "--state-dir", filepath.Join(r.states, id),
		"--replicas", faultReplicas}
}

// startAll starts every coordinator, then every node, each process at
// once, and waits until each says it runs.
func (r *faultRig) startAll() {
	r.t.Helper()
	for _, group := range [][]string{faultCoords, faultNodes} {
		for _, id := range group {
			r.procs[id] = startProcess(r.t, nil, r.args(id)...)
		}
		for _, id := range group {
			r.procs[id].waitOutput(componentTimeout, "Press Ctrl-C to stop.")
		}
	}
}

// args are the arguments of component id.
func (r *faultRig) args(id string) []string {
	if strings.HasPrefix(id, "coord") {
		return r.coordArgs(id)
	}
	return r.nodeArgs(id)
}

// restart starts component id again, under the same ID, and waits until
// it says it runs.
func (r *faultRig) restart(id string) {
	r.t.Helper()
	r.procs[id] = startComponent(r.t, nil, r.args(id)...)
}

// status is the cluster's status through the test's client.
func (r *faultRig) status() (client.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.c.Status(ctx)
}

// waitServed waits until a coordinator is active and every PChannel is
// served by a live node that confirms it, with every node of ids serving
// one in the session its running process started.
func (r *faultRig) waitServed(ids ...string) client.Status {
	r.t.Helper()
	sessions := map[string]string{}
	for _, id := range ids {
		_, sessions[id] = nodeSession(r.t, r.procs[id])
	}
	return r.waitStatus(fmt.Sprintf("every PChannel served, by %v among others", sessions), func(st client.Status) bool {
		return st.View.Leader != "" && everyNodeServes(st, sessions)
	})
}

// waitStatus waits until the status satisfies ok, which what describes.
func (r *faultRig) waitStatus(what string, ok func(client.Status) bool) client.Status {
	r.t.Helper()
	var last client.Status
	var lastErr error
	err := pollEvery(componentTimeout, 100*time.Millisecond, func() (bool, error) {
		st, err := r.status()
		if err != nil {
			lastErr = err
			return false, nil
		}
		last = st
		return ok(st), nil
	})
	require.NoError(r.t, err, "status never showed %s: last %+v (last error %v)", what, last, lastErr)
	return last
}

// waitProgress waits until the load had faultProgress more operations
// acknowledged.
func (r *faultRig) waitProgress() {
	r.t.Helper()
	from := r.load.Ledger().Acknowledged()
	err := pollUntil(componentTimeout, func() (bool, error) {
		return r.load.Ledger().Acknowledged() >= from+faultProgress, nil
	})
	require.NoError(r.t, err, "the load made no progress (errors so far: %v)", r.load.Ledger().Errors())
}

// writable probes every PChannel of the load until each acknowledges an
// append, and logs how long after since (when fault was injected) the
// last of them did.
func (r *faultRig) writable(fault string, since time.Time) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), componentTimeout)
	defer cancel()
	took, err := r.load.Probe(ctx, since)
	require.NoError(r.t, err, "fault %s: not writable again", fault)
	var slowest time.Duration
	var each []string
	for p, d := range took {
		slowest = max(slowest, d)
		each = append(each, fmt.Sprintf("%s %s", p, d.Round(time.Millisecond)))
	}
	sort.Strings(each)
	r.t.Logf("fault %s: writable again after %s (%s)", fault, slowest.Round(time.Millisecond), strings.Join(each, ", "))
}

// natsServerFault is fault (a): the JetStream meta leader among the NATS
// servers is shut down and, once every PChannel took an append without
// it, started again on its store.
func (r *faultRig) natsServerFault() {
	r.t.Helper()
	leader := r.nats.Leader()
	require.NotNil(r.t, leader, "the NATS cluster has a meta leader")
	i := slices.Index(r.nats.Servers(), leader)
	at := time.Now()
	require.NoError(r.t, r.nats.StopServer(i))
	r.writable(fmt.Sprintf("a (NATS server %s, the JetStream meta leader, stopped)", leader.Name()), at)
	r.waitProgress()
	at = time.Now()
	require.NoError(r.t, r.nats.RestartServer(i))
	r.writable(fmt.Sprintf("a (NATS server %s restarted on its store)", leader.Name()), at)
	r.waitServed(faultNodes...)
	r.waitProgress()
}

// busiestNode is the node that serves the most PChannels now.
func (r *faultRig) busiestNode() string {
	st, err := r.status()
	require.NoError(r.t, err)
	count := map[string]int{}
	for _, ch := range st.Channels {
		count[ch.Node]++
	}
	best := faultNodes[0]
	for _, id := range faultNodes {
		if count[id] > count[best] {
			best = id
		}
	}
	return best
}

// nodeKill is fault (b): the busiest node is killed with SIGKILL; once
// every PChannel took an append, it is started again.
func (r *faultRig) nodeKill() {
	r.t.Helper()
	id := r.busiestNode()
	at := time.Now()
	r.procs[id].stop(syscall.SIGKILL)
	r.writable(fmt.Sprintf("b (SIGKILL of node %s)", id), at)
	r.restart(id)
	r.waitServed(faultNodes...)
	r.waitProgress()
}

// coordKill is fault (c): the active coordinator is killed with SIGKILL;
// once the standby took over and every PChannel took an append, it is
// started again (as the standby).
func (r *faultRig) coordKill() {
	r.t.Helper()
	st, err := r.status()
	require.NoError(r.t, err)
	id := st.View.Leader
	require.Contains(r.t, faultCoords, id, "the active coordinator is one of the test's")
	at := time.Now()
	r.procs[id].stop(syscall.SIGKILL)
	r.writable(fmt.Sprintf("c (SIGKILL of the active coordinator %s)", id), at)
	r.waitStatus("the standby coordinator active", func(st client.Status) bool {
		return st.View.Leader != "" && st.View.Leader != id
	})
	r.restart(id)
	r.waitProgress()
}

// nodeFreeze is fault (d): the busiest node is frozen with SIGSTOP until
// the coordinator declared it dead and every PChannel serves on the other
// nodes (and took an append), then thawed with SIGCONT while the load
// runs: whatever it still had in flight, or takes from clients that
// still reach it, must land nothing after its successors' barriers (the
// checker's term check). It must then serve again.
func (r *faultRig) nodeFreeze() {
	r.t.Helper()
	id := r.busiestNode()
	p := r.procs[id]
	at := time.Now()
	p.signal(syscall.SIGSTOP)
	p.waitStopped(10 * time.Second)
	r.waitStatus(fmt.Sprintf("%s dead and its PChannels served elsewhere", id), func(st client.Status) bool {
		return !slices.Contains(st.View.Nodes, id) && everyNodeServes(st, nil)
	})
	r.writable(fmt.Sprintf("d (SIGSTOP of node %s, past its heartbeat timeout)", id), at)
	p.signal(syscall.SIGCONT)
	r.waitProgress()
	r.waitServed(faultNodes...)
	r.waitProgress()
}

// restartAll is fault (e): every coordinator and node is killed with
// SIGKILL at once, then all are started again under the same IDs.
func (r *faultRig) restartAll() {
	r.t.Helper()
	ids := append(slices.Clone(faultCoords), faultNodes...)
	at := time.Now()
	for _, id := range ids {
		r.procs[id].signal(syscall.SIGKILL)
	}
	for _, id := range ids {
		r.procs[id].waitExit(30 * time.Second)
	}
	r.startAll()
	r.writable("e (SIGKILL of every coordinator and node, all started again under the same IDs)", at)
	r.waitServed(faultNodes...)
	r.waitProgress()
}
