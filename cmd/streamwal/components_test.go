package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/services/wire"
)

// componentTimeout bounds a coordinator's or node's start, and a wait for
// the cluster to serve again after a fault.
const componentTimeout = 60 * time.Second

// startComponent starts `streamwal <args>` (coord, node or serve on
// existing servers) with env added to its environment, and waits until
// it prints that it runs.
func startComponent(t *testing.T, env []string, args ...string) *serveProc {
	t.Helper()
	p := startProcess(t, env, args...)
	p.waitOutput(componentTimeout, "Press Ctrl-C to stop.")
	return p
}

// servedBy waits until `streamwal status --json` (run with env, and the
// server from it) shows every PChannel assigned and confirmed serving by
// a node the coordinator counts live, and every node of want confirming
// at least one PChannel in the session want gives it, and returns the
// status.
func servedBy(t *testing.T, env []string, want map[string]string) client.Status {
	t.Helper()
	var last client.Status
	var lastErr error
	err := pollEvery(componentTimeout, 200*time.Millisecond, func() (bool, error) {
		st, err := statusWithEnv(t, env)
		if err != nil {
			lastErr = err
			return false, nil
		}
		last = st
		return everyNodeServes(st, want), nil
	})
	require.NoError(t, err, "status never showed every PChannel served by %v: last %+v (last error %v)", want, last, lastErr)
	return last
}

// statusWithEnv runs `streamwal status --json` with env and no --server.
func statusWithEnv(t *testing.T, env []string) (client.Status, error) {
	out, err := runBinaryEnv(t, env, "", "status", "--json", "--timeout", "10s")
	if err != nil {
		return client.Status{}, err
	}
	return jsonLines[client.Status](t, out)[0], nil
}

// everyNodeServes reports whether st shows every PChannel served by a live
// node, and every node of want serving one in its session there.
func everyNodeServes(st client.Status, want map[string]string) bool {
	for _, ch := range st.Channels {
		if ch.State != wire.Assigned || !ch.Serving || !slices.Contains(st.View.Nodes, ch.Node) {
			return false
		}
	}
	serving := map[string]int{}
	for _, a := range st.View.Channels {
		if a.Serving && a.Session == want[a.Node] {
			serving[a.Node]++
		}
	}
	for id := range want {
		if serving[id] == 0 {
			return false
		}
	}
	return len(st.Channels) > 0
}

// sessionLine is the session a node's banner names.
var sessionLine = regexp.MustCompile(`node (\S+) of cluster .*, session (\S+)\.`)

// nodeSession is the node ID and session p's banner names.
func nodeSession(t *testing.T, p *serveProc) (string, string) {
	t.Helper()
	m := sessionLine.FindStringSubmatch(p.stdout.String())
	require.NotNil(t, m, "no node banner: %s", p.stdout.String())
	return m[1], m[2]
}

// readNodeID is the ID a node's state directory keeps.
func readNodeID(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, nodeIDFile))
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

// TestCoordAndNodesRunAsSeparateProcesses runs a coordinator and two
// nodes as processes of their own against a server of the test's: one
// node under --id, the other under the ID its --state-dir generated and
// keeps, found through NATS_URL. Once every PChannel is served by a node
// that confirms it, appends to a VChannel of each PChannel are
// acknowledged; the node under --id is stopped with SIGTERM and started
// again under the same ID, the other killed with SIGKILL and started again
// on its state directory (the same ID, read back); after each restart the
// restarted node serves again (in its new session) and every VChannel
// takes an append; at the end everything acknowledged reads back exactly
// once, and Ctrl-C (SIGINT) ends each process cleanly.
func TestCoordAndNodesRunAsSeparateProcesses(t *testing.T) {
	srv := embedded.StartTest(t)
	url := srv.ClientURL()
	env := []string{"NATS_URL=" + url}
	coordProc := startComponent(t, nil, "coord", "--server", url, "--id", "c1", "--pchannels", "4")
	require.Contains(t, coordProc.stdout.String(), `coordinator c1 of cluster "local" running on `+url)
	n1 := startComponent(t, nil, "node", "--server", url, "--id", "n1")
	stateDir := t.TempDir()
	n2 := startComponent(t, env, "node", "--state-dir", stateDir)
	n2ID := readNodeID(t, stateDir)
	sessions := map[string]string{}
	for _, p := range []*serveProc{n1, n2} {
		id, session := nodeSession(t, p)
		sessions[id] = session
	}
	require.Contains(t, sessions, n2ID, "the node of the state directory runs under the ID it keeps")
	servedBy(t, env, sessions)

	c := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), componentTimeout)
	defer cancel()
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "procs", Name: "c", ID: 1, Shards: 4})
	require.NoError(t, err)
	ledgers := make([]*ledger, len(vs))
	last := make([]string, len(vs))
	appendToAll := func(tag string) {
		for i, l := range ledgers {
			last[i], _ = l.appendUntilAcked(t, c, tag)
		}
	}
	for i, v := range vs {
		ledgers[i] = newLedger(t, v.String())
	}
	appendToAll("first")

	restarts := []struct {
		sig  syscall.Signal
		args []string
		id   string
	}{
		{syscall.SIGTERM, []string{"node", "--server", url, "--id", "n1"}, "n1"},
		{syscall.SIGKILL, []string{"node", "--state-dir", stateDir}, n2ID},
	}
	procs := map[string]*serveProc{"n1": n1, n2ID: n2}
	for _, r := range restarts {
		procs[r.id].stop(r.sig)
		start := time.Now()
		p := startComponent(t, env, r.args...)
		id, session := nodeSession(t, p)
		require.Equal(t, r.id, id, "restarted under the same ID")
		require.NotEqual(t, sessions[id], session, "a restart is a new session")
		sessions[id] = session
		servedBy(t, env, sessions)
		appendToAll(signalName[r.sig])
		t.Logf("%s of node %s: restarted, serving and every PChannel writable %s after the restart", signalName[r.sig], r.id,
			time.Since(start).Round(time.Millisecond))
		procs[r.id] = p
	}
	require.Equal(t, n2ID, readNodeID(t, stateDir), "the state directory keeps its ID")
	for i, l := range ledgers {
		l.verify(t, l.readBack(t, c, last[i]))
	}
	for _, p := range []*serveProc{coordProc, procs["n1"], procs[n2ID]} {
		p.stop(syscall.SIGINT) // a clean exit, or the test fails
		require.Contains(t, p.stdout.String(), "shutting down")
	}
}

// requireNoBuckets checks that the server at url holds no KV bucket.
func requireNoBuckets(t *testing.T, url string) {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := njs.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	names := js.KeyValueStoreNames(ctx)
	var got []string
	for n := range names.Name() {
		got = append(got, n)
	}
	require.NoError(t, names.Error())
	require.Empty(t, got, "buckets created by a start that failed")
}

// TestReplicasASingleServerCannotKeepFailFast starts a coordinator and a
// node with --replicas 3 on a single server: each exits non-zero at once
// with a message that says the server keeps one replica, and creates no
// bucket.
func TestReplicasASingleServerCannotKeepFailFast(t *testing.T) {
	srv := embedded.StartTest(t)
	url := srv.ClientURL()
	for _, args := range [][]string{
		{"coord", "--server", url, "--replicas", "3"},
		{"node", "--server", url, "--id", "n1", "--replicas", "3"},
	} {
		_, err := runBinary(t, "", args...)
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%v", args)
		require.Equal(t, 1, exit.ExitCode(), "%v", args)
		require.Contains(t, err.Error(), "--replicas 3: "+url)
		require.Contains(t, err.Error(), "is a single server, not part of a NATS cluster: it keeps 1 replica")
		require.Contains(t, err.Error(), "use --replicas 1")
	}
	requireNoBuckets(t, url)
}

// TestReplicasAClusterCannotPlaceFailFast starts a coordinator with
// --replicas 5 on a cluster of three servers: it exits non-zero at once,
// saying that the cluster cannot place five replicas.
func TestReplicasAClusterCannotPlaceFailFast(t *testing.T) {
	c := embedded.StartTestCluster(t)
	url := strings.Join(c.ClientURLs(), ",")
	_, err := runBinary(t, "", "coord", "--server", url, "--replicas", "5")
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, 1, exit.ExitCode())
	require.Contains(t, err.Error(), fmt.Sprintf("--replicas 5: the NATS cluster %q cannot place 5 replicas", c.Name()))
	require.Contains(t, err.Error(), "this connection knows of 3 server(s) in it")
	requireNoBuckets(t, c.ClientURLs()[0])
}

// TestServeOnAnExistingServer runs `serve --server` against a server of
// the test's (through STREAMWAL_SERVER): it starts no server of its own,
// runs a coordinator and a node under --id, and once it says it serves,
// an append is acknowledged and reads back; SIGTERM ends it cleanly, and
// a restart under the same ID serves again.
func TestServeOnAnExistingServer(t *testing.T) {
	srv := embedded.StartTest(t)
	url := srv.ClientURL()
	env := []string{"STREAMWAL_SERVER=" + url}
	p := startComponent(t, env, "serve", "--id", "s1", "--pchannels", "2")
	out := p.stdout.String()
	require.Contains(t, out, "serving on existing NATS servers")
	require.Contains(t, out, "node:        s1 (group commit off (auto: the servers' sync setting is not visible to this user))")
	require.Contains(t, out, "pchannels:   2")

	c := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), componentTimeout)
	defer cancel()
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "serve", Name: "c", ID: 1})
	require.NoError(t, err)
	l := newLedger(t, vs[0].String())
	l.appendUntilAcked(t, c, "first")
	p.stop(syscall.SIGTERM)

	p = startComponent(t, env, "serve", "--id", "s1", "--pchannels", "2")
	require.Contains(t, p.stdout.String(), "node:        s1 ")
	last, _ := l.appendUntilAcked(t, c, "after restart")
	l.verify(t, l.readBack(t, c, last))
	p.stop(syscall.SIGTERM)
}

// TestComponentCommandsExplainThemselves checks the help of coord, node
// and serve: what each runs, its identity, replicas, group commit, and
// where the connection's settings come from.
func TestComponentCommandsExplainThemselves(t *testing.T) {
	for cmd, wants := range map[string][]string{
		"coord": {"active-standby", "--id", "--replicas", "--pchannels", "STREAMWAL_COORD_ID", "--creds", "--nkey", "--tls-ca",
			"NATS_URL", "A flag given on\nthe command line wins over its variable"},
		"node": {"--state-dir", "<state-dir>/node-id", "--group-commit", "auto (the default)", "system account",
			"--retain", "--duplicate-window", "STREAMWAL_NODE_ID", "--replicas", "NATS_URL"},
		"serve":  {"--server", "--http-port", "/jsz", "no data directory is\nlocked", "NATS_URL is not\nread here", "--id"},
		"status": {"--creds", "STREAMWAL_SERVER", "NATS_URL"},
	} {
		out, err := runCmd(t, "", cmd, "--help")
		require.NoError(t, err)
		for _, w := range wants {
			require.Contains(t, out, w, "streamwal %s --help", cmd)
		}
	}
}
