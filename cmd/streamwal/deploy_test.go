package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
)

// localClusterScript is the example script the deployment test runs.
var localClusterScript = filepath.Join("..", "..", "deploy", "local-cluster.sh")

// The ports of deploy/nats-{1,2,3}.conf (client, route, monitoring), which
// the script shifts by STREAMWAL_PORT_OFFSET.
var deployPorts = []int{4222, 4223, 4224, 6222, 6223, 6224, 8222, 8223, 8224}

// scriptTimeout bounds the script's start (three servers, two
// coordinators, three nodes) and its stop.
const scriptTimeout = 2 * time.Minute

// startedLine is the script's line for each process it starts.
var startedLine = regexp.MustCompile(`started (\S+) \(pid (\d+)\)`)

// exportServerLine is the script's instruction that names the servers.
var exportServerLine = regexp.MustCompile(`export STREAMWAL_SERVER=(\S+)\n`)

// TestLocalClusterScript runs deploy/local-cluster.sh as a user would
// (issue 15 item 6), with nats-server built from the module cache, on
// ports shifted away from anything else: it writes credentials, starts
// three nats-servers from the example configurations, two coordinators
// and three nodes at 3 replicas, and says it is ready once every PChannel
// is served. Then, with the client seed and the environment the script
// tells the user to export: status shows every PChannel served by three
// nodes, a collection is created, appended to and read back; the WAL
// streams have 3 replicas. Ctrl-C (SIGINT) stops the script cleanly, with
// every process it started gone.
func TestLocalClusterScript(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-server NATS cluster and five streamwal processes")
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("the script needs bash, which is not on PATH")
	}
	base := t.TempDir()
	cmd := exec.Command(bash, localClusterScript, base)
	p := startCmd(t, "local-cluster.sh", cmd, []string{
		"STREAMWAL_BIN=" + streamwalBinary(t), "NATS_SERVER=" + natsServerBinary(t),
		"STREAMWAL_PCHANNELS=4", "STREAMWAL_PORT_OFFSET=" + strconv.Itoa(freePortOffset(t)),
	})
	t.Cleanup(func() { stopScript(t, p, base) })
	out := p.waitOutput(scriptTimeout, "Press Ctrl-C to stop everything.")
	m := exportServerLine.FindStringSubmatch(out)
	require.NotNil(t, m, "the script says which servers to use:\n%s", out)
	env := []string{"STREAMWAL_SERVER=" + m[1], "STREAMWAL_NKEY=" + filepath.Join(base, "auth", "client.nk")}

	status := mustRunEnv(t, env, "status")
	require.Regexp(t, `(?m)^serving: +all 4 PChannels$`, status)
	require.Regexp(t, `(?m)^nodes: +node-1, node-2, node-3$`, status)
	mustRunEnv(t, env, "collection", "create", "--db", "shop", "--name", "orders", "--id", "1", "--shards", "2")
	mustRunEnv(t, env, "append", "--vchannel", "pchan-0_1v0", "--timeout", "30s", "hello")
	tail := mustRunEnv(t, env, "tail", "--vchannel", "pchan-0_1v0", "--from-start", "--limit", "3", "--timeout", "30s")
	require.Regexp(t, `(?m) Insert pchan-0_1v0 "hello"$`, tail)
	requireReplicas(t, m[1], filepath.Join(base, "auth", "admin.nk"), 3)

	started := startedLine.FindAllStringSubmatch(out, -1)
	require.Len(t, started, 8, "three servers, two coordinators, three nodes")
	p.signal(ctrlC())
	st := p.waitExit(scriptTimeout)
	require.True(t, st.Success(), "the script ends cleanly on Ctrl-C: %v", p.waitErr)
	require.Contains(t, p.stdout.String(), "local-cluster: stopped")
	for _, s := range started {
		pid, err := strconv.Atoi(s[2])
		require.NoError(t, err)
		require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "%s (pid %d) still runs", s[1], pid)
	}
}

// ctrlC is the signal of a Ctrl-C, SIGINT, unless this process was
// started with SIGINT ignored (in the background of a shell without job
// control): the script inherits that, and a shell cannot trap a signal
// ignored when it started, so SIGTERM, which it handles the same way,
// stands in.
func ctrlC() syscall.Signal {
	if signal.Ignored(syscall.SIGINT) {
		return syscall.SIGTERM
	}
	return syscall.SIGINT
}

// mustRunEnv runs the streamwal binary with env added, as a user who
// exported what the script printed would, and returns its output.
func mustRunEnv(t *testing.T, env []string, args ...string) string {
	t.Helper()
	out, err := runBinaryEnv(t, env, "", args...)
	require.NoError(t, err)
	return out
}

// requireReplicas checks, as the admin, that the WAL stream of pchan-0
// has the replicas asked for.
func requireReplicas(t *testing.T, servers, adminSeed string, replicas int) {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(adminSeed)
	require.NoError(t, err)
	nc, err := nats.Connect(servers, opt)
	require.NoError(t, err)
	defer nc.Close()
	js, err := njs.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := streamwal.ParsePChannel("pchan-0")
	require.NoError(t, err)
	s, err := js.Stream(ctx, streamwal.Cluster("local").StreamName(pc))
	require.NoError(t, err)
	require.Equal(t, replicas, s.CachedInfo().Config.Replicas)
}

// natsServerBinary builds nats-server (a dependency of this module, so
// its source is in the module cache) into a temporary directory, or skips
// the test saying why it cannot.
func natsServerBinary(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	path := filepath.Join(t.TempDir(), "nats-server")
	out, err := exec.Command(goTool, "build", "-o", path, "github.com/nats-io/nats-server/v2").CombinedOutput()
	if err != nil {
		t.Skipf("cannot build nats-server for the deployment script (go build github.com/nats-io/nats-server/v2: %v; "+
			"install it with `go install github.com/nats-io/nats-server/v2@v2.15.2`):\n%s", err, out)
	}
	return path
}

// freePortOffset picks an offset at which every port of the example
// configurations is free on 127.0.0.1.
func freePortOffset(t *testing.T) int {
	t.Helper()
	for range 50 {
		offset := 10000 + rand.IntN(40000)
		if portsFree(offset) {
			return offset
		}
	}
	t.Fatal("no offset with the nine ports of the configurations free")
	return 0
}

// portsFree reports whether every port of deployPorts shifted by offset
// can be listened on.
func portsFree(offset int) bool {
	for _, port := range deployPorts {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+offset))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}

// stopScript ends the script if it still runs (SIGTERM, which makes it
// stop what it started), then kills whatever it started that still runs
// in its base directory (all its processes run there), so that a failed
// test leaves no server behind.
func stopScript(t *testing.T, p *serveProc, base string) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(scriptTimeout):
		}
	}
	for _, s := range startedLine.FindAllStringSubmatch(p.stdout.String(), -1) {
		pid, _ := strconv.Atoi(s[2])
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil && cwd == base {
			t.Logf("killing %s (pid %d), left running", s[1], pid)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				t.Errorf("kill %s (pid %d): %v", s[1], pid, err)
			}
		}
	}
}
