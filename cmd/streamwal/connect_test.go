package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// writeFile writes a file of the test's and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// userSeedFile writes the seed of a new nkey user and returns its path.
func userSeedFile(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	seed, err := kp.Seed()
	require.NoError(t, err)
	return writeFile(t, "user.nk", string(seed))
}

// TestConflictingConnectionFlagsAreRefused runs every command that
// connects with connection flags that do not go together, or files that
// cannot be used: each fails before it connects (there is no server),
// with a one-line error naming the flags, and prints nothing.
func TestConflictingConnectionFlagsAreRefused(t *testing.T) {
	seed := userSeedFile(t)
	creds := writeFile(t, "user.creds", "not a credentials file")
	notPEM := writeFile(t, "ca.pem", "not a certificate")
	missing := filepath.Join(t.TempDir(), "missing")
	stateDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(stateDir, nodeIDFile), []byte("n7\n"), 0o600))
	const nowhere = "nats://127.0.0.1:1"
	conflicts := []refused{
		{args: []string{"--creds", creds, "--nkey", seed}, want: "--creds and --nkey are different ways to authenticate: give one"},
		{args: []string{"--nkey", seed, "--user", "u", "--password", "p"}, want: "--nkey and --user/--password are different ways"},
		{args: []string{"--user", "u"}, want: "--user and --password go together"},
		{args: []string{"--password", "p"}, want: "--user and --password go together"},
		{args: []string{"--tls-cert", notPEM}, want: "--tls-cert and --tls-key go together"},
		{args: []string{"--tls-key", notPEM}, want: "--tls-cert and --tls-key go together"},
		{args: []string{"--creds", missing}, want: "--creds: stat " + missing},
		{args: []string{"--nkey", creds}, want: "--nkey " + creds},
		{args: []string{"--tls-ca", notPEM}, want: "--tls-ca: nats: failed to parse root certificate"},
		{args: []string{"--server", "http://127.0.0.1:4222"}, want: `--server "http://127.0.0.1:4222": scheme "http"`},
		{args: []string{"--server", "nats://a:1,,nats://b:2"}, want: "an empty URL in the list"},
	}
	commands := [][]string{
		{"status", "--server", nowhere},
		{"append", "--server", nowhere, "--vchannel", "pchan-0_1v0", "x"},
		{"tail", "--server", nowhere, "--pchannel", "pchan-0"},
		{"collection", "create", "--server", nowhere, "--name", "x", "--id", "1"},
		{"segments", "--server", nowhere, "--vchannel", "pchan-0_1v0"},
		{"bench", "--server", nowhere},
		{"coord", "--server", nowhere},
		{"node", "--server", nowhere, "--id", "n1"},
		{"serve", "--server", nowhere},
	}
	for _, command := range commands {
		for _, c := range conflicts {
			args := append(append([]string{}, command...), c.args...)
			what := strings.Join(args, " ")
			out, err := runCmd(t, "", args...)
			requireOneLineError(t, err, what)
			require.Contains(t, err.Error(), c.want, what)
			require.True(t, errors.Is(err, errConnFlags), "%s: %v", what, err)
			require.Empty(t, out, what)
		}
	}
	others := []refused{
		{args: []string{"node", "--server", nowhere}, want: "give --id or --state-dir"},
		{args: []string{"node", "--server", nowhere, "--id", "n1", "--group-commit", "maybe"}, want: `--group-commit "maybe": want auto, on or off`},
		{args: []string{"node", "--server", nowhere, "--id", "bad.id"}, want: "--id"},
		{args: []string{"node", "--server", nowhere, "--id", "n1", "--replicas", "0"}, want: "--replicas must be 1 to 5"},
		{args: []string{"node", "--server", nowhere, "--id", "n8", "--state-dir", stateDir}, want: "belongs to node n7"},
		{args: []string{"node", "--server", nowhere, "--id", "n1", "--duplicate-window", "10ms"}, want: "--duplicate-window"},
		{args: []string{"node", "--server", nowhere, "--id", "n1", "--checkpoint-interval", "0s"}, want: "--checkpoint-interval must be positive, got 0s"},
		{args: []string{"node", "--server", nowhere, "--id", "n1", "--truncate-interval", "-1s"}, want: "--truncate-interval must be positive, got -1s"},
		{args: []string{"serve", "--truncate-interval", "0s"}, want: "--truncate-interval must be positive, got 0s"},
		{args: []string{"coord", "--server", nowhere, "--pchannels", "0"}, want: "--pchannels must be positive"},
		{args: []string{"coord", "--server", nowhere, "--id", "a b"}, want: "--id"},
		{args: []string{"coord", "--server", nowhere, "--node-ttl", "100ms"}, want: "--node-ttl must be at least 500ms (two node heartbeats), got 100ms"},
		{args: []string{"serve", "--node-ttl", "0s"}, want: "--node-ttl must be at least 500ms"},
		{args: []string{"serve", "--server", nowhere, "--data-dir", t.TempDir()}, want: "--data-dir is for the embedded server"},
		{args: []string{"serve", "--server", nowhere, "--http-port", "8222"}, want: "--http-port is for the embedded server"},
		{args: []string{"serve", "--creds", creds}, want: "--creds applies only with --server"},
		{args: []string{"serve", "--replicas", "3"}, want: "--replicas applies only with --server"},
	}
	for _, c := range others {
		what := strings.Join(c.args, " ")
		out, err := runCmd(t, "", c.args...)
		requireOneLineError(t, err, what)
		require.Contains(t, err.Error(), c.want, what)
		require.Empty(t, out, what)
	}
	require.Equal(t, "n7\n", readFileString(t, filepath.Join(stateDir, nodeIDFile)), "a refused start keeps the state directory's ID")
}

// readFileString is the content of path.
func readFileString(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// TestConnectionFlagsComeFromTheEnvironment checks the precedence of the
// connection's sources on a running cluster: STREAMWAL_SERVER wins over
// NATS_URL, a flag over both; a conflict that comes from the environment
// names the variable; and an invalid value in a variable is refused,
// named. (It sets the process's environment, so it does not run in
// parallel.)
func TestConnectionFlagsComeFromTheEnvironment(t *testing.T) {
	c := newCluster(t)
	const nowhere = "nats://127.0.0.1:1"

	t.Setenv("NATS_URL", c.url)
	_, err := runCmd(t, "", "status", "--json", "--timeout", "10s")
	require.NoError(t, err, "NATS_URL stands for --server")

	t.Setenv("STREAMWAL_SERVER", nowhere)
	_, err = runCmd(t, "", "status", "--json", "--timeout", "10s")
	require.ErrorContains(t, err, nowhere, "STREAMWAL_SERVER wins over NATS_URL")

	_, err = runCmd(t, "", "status", "--json", "--timeout", "10s", "--server", c.url)
	require.NoError(t, err, "--server wins over STREAMWAL_SERVER")

	t.Setenv("STREAMWAL_SERVER", c.url)
	t.Setenv("STREAMWAL_CLUSTER", "elsewhere")
	_, err = runCmd(t, "", "status", "--json", "--timeout", "2s")
	require.ErrorContains(t, err, `"elsewhere"`, "STREAMWAL_CLUSTER stands for --cluster")
	_, err = runCmd(t, "", "status", "--json", "--timeout", "10s", "--cluster", "local")
	require.NoError(t, err, "--cluster wins over STREAMWAL_CLUSTER")

	t.Setenv("STREAMWAL_CLUSTER", "bad.name")
	_, err = runCmd(t, "", "status")
	require.ErrorContains(t, err, "--cluster (from STREAMWAL_CLUSTER)")

	t.Setenv("STREAMWAL_CLUSTER", "")
	t.Setenv("STREAMWAL_NKEY", userSeedFile(t))
	_, err = runCmd(t, "", "status", "--user", "u", "--password", "p")
	require.ErrorContains(t, err, "--nkey (from STREAMWAL_NKEY) and --user/--password are different ways to authenticate")

	t.Setenv("STREAMWAL_NKEY", "")
	t.Setenv("STREAMWAL_REPLICAS", "three")
	_, err = runCmd(t, "", "node", "--id", "n1")
	require.ErrorContains(t, err, `STREAMWAL_REPLICAS="three" (for --replicas)`)
}

// systemAccountServer starts a nats-server with JetStream whose clients
// log in as "app" (an ordinary account) or "sys" (the system account),
// fsyncing every write if syncAlways, and returns its URL.
func systemAccountServer(t *testing.T, syncAlways bool) string {
	t.Helper()
	sys, app := server.NewAccount("SYS"), server.NewAccount("APP")
	opts := &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), SyncAlways: syncAlways,
		NoSigs: true, NoLog: true, Accounts: []*server.Account{sys, app}, SystemAccount: "SYS",
		Users: []*server.User{{Username: "sys", Password: "s", Account: sys}, {Username: "app", Password: "a", Account: app}},
	}
	ns, err := server.NewServer(opts)
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	require.True(t, ns.ReadyForConnections(10*time.Second))
	return ns.ClientURL()
}

// TestGroupCommitFollowsTheServersSyncSetting asks servers whether they
// fsync every write: a user of the system account learns the answer (yes
// or no, as the server was started), an ordinary user learns nothing, and
// --group-commit auto decides from it (or from replicas above one).
func TestGroupCommitFollowsTheServersSyncSetting(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, syncAlways := range []bool{true, false} {
		url := systemAccountServer(t, syncAlways)
		sysNC, err := nats.Connect(url, nats.UserInfo("sys", "s"))
		require.NoError(t, err)
		defer sysNC.Close()
		got, err := serversSyncAlways(ctx, sysNC)
		require.NoError(t, err)
		require.Equal(t, syncAlways, got)
		gc, why := decideGroupCommit(ctx, nopLog, sysNC, groupCommitAuto, 1)
		require.Equal(t, syncAlways, gc, why)

		appNC, err := nats.Connect(url, nats.UserInfo("app", "a"))
		require.NoError(t, err)
		defer appNC.Close()
		_, err = serversSyncAlways(ctx, appNC)
		require.ErrorIs(t, err, errSyncUnknown)
		gc, why = decideGroupCommit(ctx, nopLog, appNC, groupCommitAuto, 1)
		require.False(t, gc, why)
		require.Contains(t, why, "not visible to this user")
		gc, why = decideGroupCommit(ctx, nopLog, appNC, groupCommitAuto, 3)
		require.True(t, gc, why)
		gc, _ = decideGroupCommit(ctx, nopLog, appNC, groupCommitOn, 1)
		require.True(t, gc)
		gc, _ = decideGroupCommit(ctx, nopLog, sysNC, groupCommitOff, 1)
		require.False(t, gc)
	}
}

// monitorLine is serve's banner line of the monitoring endpoint.
var monitorLine = regexp.MustCompile(`monitoring:\s+(http://\S+)`)

// nopLog discards logs.
var nopLog = zerolog.Nop()

// getJSON fetches url and decodes its JSON body into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, url)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v), url)
}

// TestServeMonitoringEndpoint runs serve with --http-port -1: the banner
// names the monitoring endpoint, and its /jsz shows the embedded
// server's JetStream with the cluster's streams.
func TestServeMonitoringEndpoint(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuffer
	root := newRootCmd(&out, &out)
	root.SetArgs([]string{"serve", "--port", "0", "--http-port", "-1", "--pchannels", "2", "--data-dir", t.TempDir(), "--log-level", "disabled"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	var monitor string
	require.NoError(t, pollUntil(30*time.Second, func() (bool, error) {
		if m := monitorLine.FindStringSubmatch(out.String()); m != nil {
			monitor = m[1]
			return true, nil
		}
		select {
		case err := <-done:
			return false, errors.Join(errors.New("serve ended"), err)
		default:
			return false, nil
		}
	}), out.String())
	var jsz struct {
		Config struct {
			SyncAlways bool `json:"sync_always"`
		} `json:"config"`
		Streams int `json:"streams"`
	}
	getJSON(t, monitor+"/jsz", &jsz)
	require.True(t, jsz.Config.SyncAlways, "serve's default")
	require.GreaterOrEqual(t, jsz.Streams, 2, "the WAL streams of both PChannels")
	cancel()
	require.NoError(t, <-done)
}
