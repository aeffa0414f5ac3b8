package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/auth"
	"github.com/streamwal/streamwal/embedded"
)

// auth init writes auth.conf and a seed per role, says how to use them,
// and a nats-server configuration that includes auth.conf (as the output
// says) has the four users; a second run refuses to replace the seeds and
// changes nothing, --force replaces them.
func TestAuthInit(t *testing.T) {
	d := filepath.Join(t.TempDir(), "creds")
	out, err := runCmd(t, "", "auth", "init", "--dir", d, "--cluster", "prod", "--pchannels", "3")
	require.NoError(t, err)
	for _, want := range []string{`cluster "prod" (3 PChannels)`, "auth.conf", "include auth.conf",
		"streamwal coord --nkey " + filepath.Join(d, "coord.nk"), "streamwal node --nkey " + filepath.Join(d, "node.nk"),
		"--nkey " + filepath.Join(d, "client.nk"), "nats --nkey " + filepath.Join(d, "admin.nk"),
		"streamwal serve --auth-dir " + d} {
		require.Contains(t, out, want)
	}
	for _, r := range auth.Roles {
		info, err := os.Stat(auth.Dir(d).Seed(r))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), r)
	}
	info, err := os.Stat(d)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), info.Mode().Perm())

	conf := filepath.Join(d, "nats-server.conf")
	require.NoError(t, os.WriteFile(conf, []byte("port: -1\ninclude auth.conf\n"), 0o600))
	opts, err := server.ProcessConfigFile(conf)
	require.NoError(t, err)
	require.Len(t, opts.Nkeys, len(auth.Roles))

	seed, err := os.ReadFile(auth.Dir(d).Seed(auth.RoleClient))
	require.NoError(t, err)
	_, err = runCmd(t, "", "auth", "init", "--dir", d, "--cluster", "prod", "--pchannels", "3")
	require.ErrorIs(t, err, auth.ErrExists)
	require.Contains(t, err.Error(), "--force")
	again, err := os.ReadFile(auth.Dir(d).Seed(auth.RoleClient))
	require.NoError(t, err)
	require.Equal(t, seed, again, "a refused init changes nothing")

	_, err = runCmd(t, "", "auth", "init", "--dir", d, "--force")
	require.NoError(t, err)
	again, err = os.ReadFile(auth.Dir(d).Seed(auth.RoleClient))
	require.NoError(t, err)
	require.NotEqual(t, seed, again)
}

// auth init refuses bad flags with a message naming them, and writes
// nothing.
func TestAuthInitRefusesBadFlags(t *testing.T) {
	d := filepath.Join(t.TempDir(), "creds")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--dir is required"},
		{[]string{"--dir", d, "--cluster", "a.b"}, "--cluster"},
		{[]string{"--dir", d, "--pchannels", "0"}, "--pchannels"},
	} {
		_, err := runCmd(t, "", append([]string{"auth", "init"}, c.args...)...)
		require.ErrorContains(t, err, c.want, c.args)
		_, serr := os.Stat(d)
		require.ErrorIs(t, serr, os.ErrNotExist, "nothing written for %v", c.args)
	}
}

// The help of auth init explains the roles and how to deploy them.
func TestAuthInitHelp(t *testing.T) {
	out, err := runCmd(t, "", "auth", "init", "--help")
	require.NoError(t, err)
	for _, want := range []string{"coord ", "node ", "client ", "admin ", "include auth.conf", "--nkey D/client.nk",
		"streamwal serve --auth-dir D", "--force", "--pchannels"} {
		require.Contains(t, out, want)
	}
}

// serve --auth-dir refuses credentials that do not fit its cluster (before
// it creates anything) and goes with the embedded server only.
func TestServeAuthDirRefusedWhenItDoesNotFit(t *testing.T) {
	d := t.TempDir()
	_, err := runCmd(t, "", "auth", "init", "--dir", d, "--pchannels", "2")
	require.NoError(t, err)
	data := filepath.Join(t.TempDir(), "data")
	_, err = runCmd(t, "", "serve", "--data-dir", data, "--port", "0", "--auth-dir", d, "--cluster", "other", "--pchannels", "2")
	require.ErrorIs(t, err, auth.ErrNotCovered)
	require.ErrorContains(t, err, "streamwal auth init --dir "+d+" --cluster other --pchannels 2")
	_, err = runCmd(t, "", "serve", "--data-dir", data, "--port", "0", "--auth-dir", d, "--pchannels", "3")
	require.ErrorIs(t, err, auth.ErrNotCovered)
	_, err = os.Stat(data)
	require.ErrorIs(t, err, os.ErrNotExist, "a refused serve leaves no data directory")
	_, err = runCmd(t, "", "serve", "--server", "nats://127.0.0.1:1", "--auth-dir", d)
	require.ErrorContains(t, err, "--auth-dir is for the embedded server")
	_, err = runCmd(t, "", "serve", "--data-dir", data, "--port", "0", "--auth-dir", filepath.Join(d, "missing"))
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

// serve --auth-dir runs its coordinator and node under their seeds on an
// embedded server that accepts only the users of auth.conf: the client
// commands work with the client's seed (status, a collection, an append
// and a tail of it), and are refused without one.
func TestServeWithAuthDir(t *testing.T) {
	d := t.TempDir()
	mustRunBinary(t, "", "auth", "init", "--dir", d, "--pchannels", "2")
	p := startServe(t, t.TempDir(), "--auth-dir", d, "--pchannels", "2")
	url := p.waitURL(serveTimeout)
	banner := p.waitOutput(serveTimeout, "Press Ctrl-C")
	require.Contains(t, banner, "--nkey "+filepath.Join(d, "client.nk"))

	client := filepath.Join(d, "client.nk")
	status := mustRunBinary(t, "", "status", "--server", url, "--nkey", client, "--timeout", "20s")
	require.Contains(t, status, "pchan-1")
	mustRunBinary(t, "", "collection", "create", "--server", url, "--nkey", client, "--name", "orders", "--id", "1")
	mustRunBinary(t, "", "append", "--server", url, "--nkey", client, "--vchannel", "pchan-0_1v0", "--timeout", "20s", "hello")
	// The VChannel holds its CreateCollection, the CreateSegment its node
	// writes before the first insert, and the insert.
	tail := mustRunBinary(t, "", "tail", "--server", url, "--nkey", client, "--vchannel", "pchan-0_1v0", "--from-start",
		"--limit", "3", "--timeout", "20s")
	lines := strings.Split(strings.TrimRight(tail, "\n"), "\n")
	require.Len(t, lines, 3, tail)
	require.Contains(t, lines[0], "CreateCollection")
	require.Contains(t, lines[2], "hello")

	_, err := runBinary(t, "", "status", "--server", url, "--timeout", "5s")
	require.Error(t, err, "no credentials")
	require.Contains(t, strings.ToLower(err.Error()), "authorization")
	p.stop(syscall.SIGTERM)
}

// violations collects the permission violations a server logs.
type violations struct {
	mu    sync.Mutex
	lines []string
}

// Write keeps the lines that report a violation.
func (v *violations) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("Violation")) {
		v.mu.Lock()
		v.lines = append(v.lines, string(p))
		v.mu.Unlock()
	}
	return len(p), nil
}

// all returns what was logged so far.
func (v *violations) all() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.lines...)
}

// A server configured with auth.conf's users (as a nats-server with
// `include auth.conf` is) runs `streamwal coord --nkey coord.nk` and
// `streamwal node --nkey node.nk` as processes of their own: every
// PChannel is served, a client with client.nk (STREAMWAL_NKEY) appends
// and tails, and the server refused nothing to anyone.
func TestCoordAndNodeRunWithTheirSeeds(t *testing.T) {
	d := auth.Dir(t.TempDir())
	spec, err := auth.NewSpec("local", "pchan", 2)
	require.NoError(t, err)
	_, err = auth.Init(d, spec, false)
	require.NoError(t, err)
	users, err := auth.LoadUsers(d.Conf())
	require.NoError(t, err)
	log := &violations{}
	srv := embedded.StartTest(t, func(o *embedded.Options) {
		o.Users, o.Logger = users, zerolog.New(log).Level(zerolog.WarnLevel)
	})
	url := srv.ClientURL()
	coordProc := startComponent(t, nil, "coord", "--server", url, "--nkey", d.Seed(auth.RoleCoordinator), "--id", "c1", "--pchannels", "2")
	nodeProc := startComponent(t, nil, "node", "--server", url, "--nkey", d.Seed(auth.RoleNode), "--id", "n1")
	id, session := nodeSession(t, nodeProc)
	env := []string{"STREAMWAL_SERVER=" + url, "STREAMWAL_NKEY=" + d.Seed(auth.RoleClient)}
	servedBy(t, env, map[string]string{id: session})

	created, err := runBinaryEnv(t, env, "", "collection", "create", "--name", "orders", "--id", "1")
	require.NoError(t, err)
	v := regexp.MustCompile(`pchan-\d+_1v0`).FindString(created)
	require.NotEmpty(t, v, "the collection's VChannel: %s", created)
	_, err = runBinaryEnv(t, env, "", "append", "--vchannel", v, "--timeout", "20s", "hello")
	require.NoError(t, err)
	tail, err := runBinaryEnv(t, env, "", "tail", "--vchannel", v, "--from-start", "--limit", "3", "--timeout", "20s")
	require.NoError(t, err)
	require.Contains(t, tail, "hello")
	require.Empty(t, log.all(), "the server refused a permission to a streamwal process")

	// Credentials of cluster local used for another cluster: the server
	// drops the requests and answers nothing; each command says so at
	// once instead of waiting out its timeout (or, for a coordinator, a
	// minute of retries).
	_, err = runBinaryEnv(t, env, "", "status", "--cluster", "other", "--timeout", "30s")
	require.Error(t, err)
	require.Contains(t, err.Error(), `PERMISSION_DENIED: cluster "other"`)
	_, err = runBinary(t, "", "coord", "--server", url, "--nkey", d.Seed(auth.RoleCoordinator), "--cluster", "other", "--pchannels", "2")
	require.Error(t, err)
	require.Contains(t, err.Error(), "PERMISSION_DENIED")
	for _, p := range []*serveProc{nodeProc, coordProc} {
		p.stop(syscall.SIGINT)
	}
}
