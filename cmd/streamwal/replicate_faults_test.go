package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/integration/workload"
)

// The replication fault tests (issue 17 item 7): writers load the
// primary throughout while a fault hits the link or the secondary; at
// the end every acknowledged write is on the primary (workload.Check)
// and the secondary's copy is the primary's log (workload.WaitReplica).
// Each has servers, directories and ports of its own: they run in
// parallel with each other and the other parallel tests, to keep the
// suite short.
const (
	// faultsPChannels is the PChannel count of every cluster.
	faultsPChannels = 2
	// faultsWait bounds each wait for a condition of these tests: the
	// machine is loaded by other tests.
	faultsWait = 60 * time.Second
)

// faultsAcked is how many more acknowledged operations of the load each
// test waits for before and after its fault: 40 in the suite, 2000 in the
// long form (STREAMWAL_LONG=1 go test -run TestReplicateUnderLoad
// ./cmd/streamwal/), which keeps the load on for minutes.
var faultsAcked = longForm(40, 2000)

// longForm is short, or long when STREAMWAL_LONG is set.
func longForm(short, long int) int {
	if os.Getenv("STREAMWAL_LONG") != "" {
		return long
	}
	return short
}

// faultsPrimary is the primary cluster "east" of a fault test: an
// in-process system on a server of its own, a client and, once started,
// a load on a collection with a shard on each PChannel.
type faultsPrimary struct {
	url  string
	c    *client.Client
	load *workload.Load
}

// startFaultsPrimary starts the primary.
func startFaultsPrimary(t *testing.T) *faultsPrimary {
	t.Helper()
	sys := namedSystem(t, "east", faultsPChannels)
	url := sys.Server.ClientURL()
	return &faultsPrimary{url: url, c: memberClient(t, "east", url)}
}

// startLoad creates the load's collection (once replication is
// configured: the secondaries take its creation from the primary's log)
// and starts the load, and waits until it makes progress.
func (p *faultsPrimary) startLoad(t *testing.T, ctx context.Context, seed uint64) {
	t.Helper()
	vs, err := p.c.CreateCollection(ctx, client.Collection{DBName: "faults", Name: "c", ID: 1, Shards: faultsPChannels})
	require.NoError(t, err)
	p.load, err = workload.New(workload.Config{Client: p.c, Conn: natsConn(t, p.url), VChannels: vs, Appenders: 4, Seed: seed})
	require.NoError(t, err)
	t.Cleanup(p.load.Stop)
	require.NoError(t, p.load.Start())
	p.waitAcked(t, faultsAcked)
}

// natsConn is a connection to url, closed when the test ends.
func natsConn(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// waitAcked waits until the load had n more operations acknowledged than
// it had when called.
func (p *faultsPrimary) waitAcked(t *testing.T, n int) {
	t.Helper()
	want := p.load.Ledger().Acknowledged() + n
	require.NoError(t, pollEvery(faultsWait, 20*time.Millisecond, func() (bool, error) {
		return p.load.Ledger().Acknowledged() >= want, nil
	}), "the load makes progress on the primary")
}

// finish stops the load, checks that the primary holds every write it
// acknowledged, and that each secondary's copy converges to the
// primary's log; sec and conns are the secondaries' clients and
// connections.
func (p *faultsPrimary) finish(t *testing.T, sec []*client.Client, conns []*nats.Conn) {
	t.Helper()
	p.load.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), faultsWait)
	defer cancel()
	rep, err := p.load.Check(ctx)
	require.NoError(t, err)
	t.Logf("primary: %s", rep)
	require.NoError(t, rep.Err())
	require.Positive(t, rep.Plain.Acknowledged)
	require.Positive(t, rep.Txns.Committed)
	require.Positive(t, rep.Txns.RolledBack)
	for i, c := range sec {
		rep, err := workload.WaitReplica(ctx, workload.ReplicaConfig{Primary: p.c, Secondary: c, SecondaryConn: conns[i]})
		require.NoError(t, err)
		t.Logf("%s: %s", c.Cluster(), rep)
		require.NoError(t, rep.Err())
		require.True(t, rep.Converged())
		require.Positive(t, rep.Replicable)
	}
}

// configure makes east (reached at eastURL) the primary of the
// secondaries (name=URL).
func configureFaults(t *testing.T, eastURL string, secondaries ...string) {
	t.Helper()
	args := []string{"replicate", "configure", "--primary", "east=" + eastURL, "--timeout", "30s"}
	for _, s := range secondaries {
		args = append(args, "--secondary", s)
	}
	out, err := runCmd(t, "", args...)
	require.NoError(t, err, out)
}

// replicationState reads c's replication status; ok is false while it
// does not list every PChannel.
func replicationState(ctx context.Context, c *client.Client) ([]client.ReplicationChannel, bool) {
	st, err := c.ReplicationStatus(ctx)
	if err != nil || len(st.Channels) != faultsPChannels {
		return nil, false
	}
	return st.Channels, true
}

// waitHeld waits until the secondary c holds the primary's log through
// since on every PChannel (its checkpoint's Through past it), and
// returns how long that took.
func waitHeld(t *testing.T, c *client.Client, since time.Time) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), faultsWait)
	defer cancel()
	var last []client.ReplicationChannel
	err := pollEvery(faultsWait, 50*time.Millisecond, func() (bool, error) {
		chs, ok := replicationState(ctx, c)
		if !ok {
			return false, nil
		}
		last = chs
		for _, ch := range chs {
			if !ch.LagKnown || ch.Through.Physical().Before(since) {
				return false, nil
			}
		}
		return true, nil
	})
	require.NoError(t, err, "%s never held the primary's log through %s: %+v", c.Cluster(), since.Format(time.StampMilli), last)
	return time.Since(since)
}

// TestReplicateUnderLoadNodeKilled: the secondary runs as processes, a
// coordinator and two nodes on a NATS server of its own, each node
// running the replicators of the PChannels it owns. Under load on the
// primary, a node that owns a PChannel is killed with SIGKILL: the
// coordinator moves its PChannels, and their replicators, to the other
// node, which catches up with the primary. The killed node then starts
// again under its ID and joins, and at the end the copy is the primary's
// log.
func TestReplicateUnderLoadNodeKilled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*faultsWait)
	defer cancel()
	prim := startFaultsPrimary(t)
	srv := embedded.StartTest(t)
	westURL := srv.ClientURL()
	env := []string{"NATS_URL=" + westURL, "STREAMWAL_CLUSTER=west"}
	startComponent(t, env, "coord", "--id", "c1", "--pchannels", fmt.Sprint(faultsPChannels))
	procs, sessions := map[string]*serveProc{}, map[string]string{}
	for _, id := range []string{"n1", "n2"} {
		procs[id] = startComponent(t, env, "node", "--id", id)
		_, sessions[id] = nodeSession(t, procs[id])
	}
	servedBy(t, env, sessions)
	configureFaults(t, prim.url, "west="+westURL)
	west := memberClient(t, "west", westURL)

	prim.startLoad(t, ctx, 71)
	waitHeld(t, west, time.Now())

	view, err := west.View(ctx)
	require.NoError(t, err)
	victim := view.Channels[0].Node
	require.Contains(t, procs, victim)
	survivor := map[string]string{"n1": "n2", "n2": "n1"}[victim]
	killed := time.Now()
	procs[victim].stop(syscall.SIGKILL)
	require.NoError(t, pollEvery(faultsWait, 50*time.Millisecond, func() (bool, error) {
		view, err := west.View(ctx)
		if err != nil {
			return false, nil
		}
		for _, a := range view.Channels {
			if a.Node != survivor || !a.Serving || a.Session != sessions[survivor] {
				return false, nil
			}
		}
		return len(view.Channels) == faultsPChannels, nil
	}), "every PChannel moves to %s", survivor)
	waitHeld(t, west, time.Now())
	t.Logf("SIGKILL of node %s: its PChannels and replicators moved to %s, which holds the primary's log through the present %s after the kill",
		victim, survivor, time.Since(killed).Round(time.Millisecond))

	// The killed node starts again under its ID and joins; replication
	// goes on, wherever the coordinator places the PChannels.
	startComponent(t, env, "node", "--id", victim)
	require.NoError(t, pollEvery(faultsWait, 50*time.Millisecond, func() (bool, error) {
		view, err := west.View(ctx)
		return err == nil && slices.Contains(view.Nodes, victim), nil
	}), "node %s is live again", victim)
	waitHeld(t, west, time.Now())
	prim.waitAcked(t, faultsAcked)
	prim.finish(t, []*client.Client{west}, []*nats.Conn{natsConn(t, westURL)})
}

// TestReplicateUnderLoadLinkDrops: three clusters; the secondaries reach
// the primary through a TCP proxy (the topology's URL of the primary is
// the proxy's). Under load, the proxy cuts every connection and refuses
// new ones: both secondaries' lag, as their status (client and
// `replicate status`) reports it, grows while the link is down; once it
// is back they catch up, and at the end each copy is the primary's log.
func TestReplicateUnderLoadLinkDrops(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*faultsWait)
	defer cancel()
	prim := startFaultsPrimary(t)
	proxy := startLinkProxy(t, prim.url)
	names := []streamwal.Cluster{"west", "north"}
	var secs []*client.Client
	var conns []*nats.Conn
	var members, urls []string
	for _, name := range names {
		url := namedCluster(t, name, faultsPChannels)
		secs, conns = append(secs, memberClient(t, name, url)), append(conns, natsConn(t, url))
		members, urls = append(members, string(name)+"="+url), append(urls, url)
	}
	configureFaults(t, proxy.url(), members...)

	prim.startLoad(t, ctx, 72)
	for _, c := range secs {
		waitHeld(t, c, time.Now())
	}

	cut := time.Now()
	proxy.setDown(true)
	for _, c := range secs {
		first := waitLag(t, c, "a lag past 1.5 s", func(ch client.ReplicationChannel) bool { return ch.Lag > 1500*time.Millisecond })
		waitLag(t, c, "a lag still growing, and why", func(ch client.ReplicationChannel) bool {
			return ch.Lag > first[ch.PChannel]+500*time.Millisecond && strings.Contains(ch.Error, "disconnected from east")
		})
	}
	// The command an operator runs says so too.
	out, err := runCmd(t, "", "replicate", "status", "--server", urls[0], "--cluster", "west", "--json")
	require.NoError(t, err)
	var st client.ReplicationStatus
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Len(t, st.Channels, faultsPChannels, out)
	for _, ch := range st.Channels {
		require.True(t, ch.LagKnown && ch.Lag > 1500*time.Millisecond && ch.Error != "", "replicate status while the link is down: %s", out)
	}
	prim.waitAcked(t, faultsAcked) // the primary takes writes all along
	proxy.setDown(false)
	restored := time.Now()
	t.Logf("the link was down %s", restored.Sub(cut).Round(time.Millisecond))
	for _, c := range secs {
		took := waitHeld(t, c, restored)
		t.Logf("%s holds the primary's log through the link's return %s after it", c.Cluster(), took.Round(time.Millisecond))
	}
	prim.waitAcked(t, faultsAcked)
	prim.finish(t, secs, conns)
}

// waitLag waits until every PChannel of the secondary c reports a known
// lag that ok accepts, and returns the lags by PChannel.
func waitLag(t *testing.T, c *client.Client, what string, ok func(client.ReplicationChannel) bool) map[string]time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), faultsWait)
	defer cancel()
	var last []client.ReplicationChannel
	err := pollEvery(faultsWait, 50*time.Millisecond, func() (bool, error) {
		chs, known := replicationState(ctx, c)
		if !known {
			return false, nil
		}
		last = chs
		for _, ch := range chs {
			if !ch.LagKnown || !ok(ch) {
				return false, nil
			}
		}
		return true, nil
	})
	require.NoError(t, err, "%s: waiting for %s: %+v", c.Cluster(), what, last)
	lags := map[string]time.Duration{}
	for _, ch := range last {
		lags[ch.PChannel] = ch.Lag
	}
	return lags
}

// TestReplicateUnderLoadSecondaryRestarts: the secondary runs as one
// `streamwal serve` process (its NATS server, coordinator and node).
// Under load on the primary it is stopped with SIGTERM and started again
// on its data directory, then killed with SIGKILL and started again:
// after each restart it carries its lag on (its replicators' records
// survive) and catches up with the primary, and at the end the copy is
// the primary's log.
func TestReplicateUnderLoadSecondaryRestarts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*faultsWait)
	defer cancel()
	prim := startFaultsPrimary(t)
	dir := t.TempDir()
	args := []string{"--cluster", "west", "--pchannels", fmt.Sprint(faultsPChannels)}
	proc, westURL := serveAndWait(t, dir, args...)
	configureFaults(t, prim.url, "west="+westURL)
	west := memberClient(t, "west", westURL)

	prim.startLoad(t, ctx, 73)
	waitHeld(t, west, time.Now())
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		chs, ok := replicationState(ctx, west)
		require.True(t, ok)
		_ = west.Close()
		proc.stop(sig)
		prim.waitAcked(t, faultsAcked) // writes the secondary misses while it is down
		proc, westURL = serveAndWait(t, dir, args...)
		restarted := time.Now()
		west = memberClient(t, "west", westURL)
		var after []client.ReplicationChannel
		require.NoError(t, pollEvery(faultsWait, 50*time.Millisecond, func() (ok bool, err error) {
			after, ok = replicationState(ctx, west)
			return ok, nil
		}), "the secondary's records after the %s", signalName[sig])
		for i, ch := range after {
			require.True(t, ch.LagKnown, "%s: the lag survives the %s", ch.PChannel, signalName[sig])
			require.GreaterOrEqual(t, ch.Through, chs[i].Through, "%s: the record survives the %s", ch.PChannel, signalName[sig])
		}
		took := waitHeld(t, west, restarted)
		t.Logf("%s of the secondary: it holds the primary's log through its restart %s after it", signalName[sig], took.Round(time.Millisecond))
		prim.waitAcked(t, faultsAcked)
	}
	prim.finish(t, []*client.Client{west}, []*nats.Conn{natsConn(t, westURL)})
	proc.stop(syscall.SIGINT)
}

// linkProxy is a TCP proxy to a NATS server that a test can take down:
// it then cuts every connection through it and refuses new ones, until
// it is brought back up.
type linkProxy struct {
	ln     net.Listener
	target string // host:port

	mu     sync.Mutex
	down   bool
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// startLinkProxy starts a proxy to the server at target (a NATS URL),
// closed when the test ends.
func startLinkProxy(t *testing.T, target string) *linkProxy {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &linkProxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// url is the proxy's address as a NATS URL.
func (p *linkProxy) url() string { return "nats://" + p.ln.Addr().String() }

// accept serves connections until the listener closes; while the proxy
// is down it closes each at once.
func (p *linkProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

// serve relays c to the target until either side ends or the proxy cuts
// them.
func (p *linkProxy) serve(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	if !p.track(c, up) {
		_, _ = c.Close(), up.Close()
		return
	}
	defer p.untrack(c, up)
	var wg sync.WaitGroup
	relay := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_, _ = dst.Close(), src.Close()
	}
	wg.Go(func() { relay(up, c) })
	relay(c, up)
	wg.Wait()
}

// track registers conns unless the proxy is down or closed.
func (p *linkProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down || p.closed {
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// untrack forgets conns.
func (p *linkProxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		delete(p.conns, c)
	}
}

// setDown takes the proxy down (cutting every connection) or brings it
// back up.
func (p *linkProxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		p.cutLocked()
	}
}

// cutLocked closes every connection through the proxy; p.mu is held.
func (p *linkProxy) cutLocked() {
	for c := range p.conns {
		_ = c.Close()
	}
}

// close stops the proxy and waits for its goroutines.
func (p *linkProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.cutLocked()
	p.mu.Unlock()
	p.wg.Wait()
}
