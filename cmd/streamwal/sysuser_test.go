package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
)

// reportLine is serve's banner line with the nats CLI command of a
// JetStream report: the server's URL and the system user's seed.
var reportLine = regexp.MustCompile(`report:\s+nats --server (\S+) --nkey (\S+) server report jetstream\n`)

// bannerReport waits for serve's banner and returns the URL and seed
// file of its report command.
func bannerReport(t *testing.T, p *serveProc) (url, seed string) {
	t.Helper()
	banner := p.waitOutput(serveTimeout, "Press Ctrl-C")
	m := reportLine.FindStringSubmatch(banner)
	require.NotNil(t, m, "no report command in the banner:\n%s", banner)
	return m[1], m[2]
}

// jszAnswer is the part of a server's answer to the request of `nats
// server report jetstream` the tests look at.
type jszAnswer struct {
	Data *struct {
		Config struct {
			StoreDir string `json:"store_dir"`
		} `json:"config"`
		Streams int `json:"streams"`
	} `json:"data"`
	Error *struct {
		Description string `json:"description"`
	} `json:"error"`
}

// serverReport makes the request `nats server report jetstream` makes
// ($SYS.REQ.SERVER.PING.JSZ), authenticated with the seed file, and
// returns the answer.
func serverReport(t *testing.T, url, seed string) jszAnswer {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(seed)
	require.NoError(t, err)
	nc, err := nats.Connect(url, opt)
	require.NoError(t, err, "the system user connects")
	defer nc.Close()
	msg, err := nc.Request(streamwal.ServerJSZPing, []byte(`{}`), 10*time.Second)
	require.NoError(t, err, "the server answers the system user's report request")
	var r jszAnswer
	require.NoError(t, json.Unmarshal(msg.Data, &r), "%s", msg.Data)
	require.Nil(t, r.Error, "%s", msg.Data)
	require.NotNil(t, r.Data, "%s", msg.Data)
	return r
}

// TestServeSystemUserRunsServerReports runs serve with --http-port: its
// banner prints the nats CLI command of a JetStream report with a seed
// it wrote to the data directory (mode 0600); the report's request is
// answered with the server's JetStream, kept in the data directory, while
// clients without credentials still create, append and read; a restart
// keeps the same seed, and the report works again.
func TestServeSystemUserRunsServerReports(t *testing.T) {
	dir := t.TempDir()
	p := startServe(t, dir, "--http-port", "-1", "--pchannels", "2")
	url, seed := bannerReport(t, p)
	require.Equal(t, filepath.Join(dir, sysSeedFile), seed)
	info, err := os.Stat(seed)
	require.NoError(t, err)
	require.Equal(t, sysSeedMode, info.Mode().Perm())
	written, err := os.ReadFile(seed)
	require.NoError(t, err)

	r := serverReport(t, url, seed)
	require.Equal(t, filepath.Join(dir, "jetstream"), r.Data.Config.StoreDir)
	require.GreaterOrEqual(t, r.Data.Streams, 2, "the WAL streams of both PChannels")

	mustRunBinary(t, "", "collection", "create", "--server", url, "--name", "orders", "--id", "1")
	mustRunBinary(t, "", "append", "--server", url, "--vchannel", "pchan-0_1v0", "--timeout", "20s", "hello")
	tail := mustRunBinary(t, "", "tail", "--server", url, "--vchannel", "pchan-0_1v0", "--from-start",
		"--limit", "3", "--timeout", "20s")
	require.Contains(t, tail, "hello")
	p.stop(syscall.SIGTERM)

	again := startServe(t, dir, "--pchannels", "2")
	url, seed = bannerReport(t, again)
	kept, err := os.ReadFile(seed)
	require.NoError(t, err)
	require.Equal(t, written, kept, "the seed is written once")
	require.GreaterOrEqual(t, serverReport(t, url, seed).Data.Streams, 2)
	tail = mustRunBinary(t, "", "tail", "--server", url, "--vchannel", "pchan-0_1v0", "--from-start",
		"--limit", "3", "--timeout", "20s")
	require.Contains(t, tail, "hello", "the data of the first start")
	again.stop(syscall.SIGTERM)
}

// TestServeSystemUserBesideAuthDir runs serve with --auth-dir: the
// system user's seed runs the report, and the admin's seed (a user of the
// global account, with every permission there) gets no answer to it.
func TestServeSystemUserBesideAuthDir(t *testing.T) {
	d := t.TempDir()
	mustRunBinary(t, "", "auth", "init", "--dir", d, "--pchannels", "2")
	p := startServe(t, t.TempDir(), "--auth-dir", d, "--pchannels", "2")
	url, seed := bannerReport(t, p)
	require.GreaterOrEqual(t, serverReport(t, url, seed).Data.Streams, 2)

	opt, err := nats.NkeyOptionFromSeed(filepath.Join(d, "admin.nk"))
	require.NoError(t, err)
	admin, err := nats.Connect(url, opt)
	require.NoError(t, err)
	defer admin.Close()
	_, err = admin.Request(streamwal.ServerJSZPing, []byte(`{}`), 2*time.Second)
	require.ErrorIs(t, err, nats.ErrNoResponders, "the admin is no system user")

	p.stop(syscall.SIGTERM)
}
