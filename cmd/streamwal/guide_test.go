package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// The tests of a CLI that guides its user (issue 15, item 7): each runs
// the command and checks its message and exit code.

// binaryRun is how a run of the built binary ended.
type binaryRun struct {
	stdout, stderr string
	code           int
}

// runBinaryExit runs the streamwal binary with args and stdin and returns
// its streams and exit code (a run that cannot start fails the test).
func runBinaryExit(t *testing.T, stdin string, args ...string) binaryRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, streamwalBinary(t), args...)
	var out, errOut bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("streamwal %s: %v", strings.Join(args, " "), err)
	}
	return binaryRun{stdout: out.String(), stderr: errOut.String(), code: cmd.ProcessState.ExitCode()}
}

// requireRefused checks that a run of the binary exited 1 with one line
// "streamwal: <error>" on standard error that contains want, and printed
// nothing on standard output.
func requireRefused(t *testing.T, r binaryRun, want string, what string) {
	t.Helper()
	require.Equal(t, 1, r.code, "%s: exit code; standard error: %s", what, r.stderr)
	require.Regexp(t, `^streamwal: [^\n]+\n$`, r.stderr, what)
	require.Contains(t, r.stderr, want, what)
	require.Empty(t, r.stdout, what)
}

func TestTailRefusesANegativeLimit(t *testing.T) {
	out, err := runCmd(t, "", "tail", "--vchannel", "pchan-0_1v0", "--limit", "-1", "--server", "nats://127.0.0.1:1")
	requireOneLineError(t, err, "tail --limit -1")
	require.Contains(t, err.Error(), "--limit must be 0 (no limit: follow until --timeout or Ctrl-C) or a positive count, got -1")
	require.Empty(t, out)

	help, err := runCmd(t, "", "tail", "--help")
	require.NoError(t, err)
	require.Regexp(t, `--limit int +stop after this many messages \(0: no limit, follow until --timeout or Ctrl-C\)`, help)
}

// A VChannel nothing will ever land on is refused at once: if tail
// waited, it would end without an error when --timeout (an hour) or the
// test's minute ends.
func TestTailOfAVChannelThatDoesNotExistSaysSoAtOnce(t *testing.T) {
	c := newCluster(t)
	v := c.createCollection(t, "shop", "orders", 1, 1)[0]

	_, err := c.run(t, "", "tail", "--vchannel", "pchan-3_99v0", "--timeout", "1h")
	requireOneLineError(t, err, "tail of a collection that does not exist")
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
	require.Contains(t, err.Error(), "--vchannel pchan-3_99v0: LIFECYCLE_VIOLATION: collection 99: collection not found")
	require.Contains(t, err.Error(), "--wait follows it until the collection is created")

	// Another PChannel's VChannel of an existing collection.
	other := (v.PChannel().Index() + 1) % testPChannels
	wrong := fmt.Sprintf("pchan-%d_1v0", other)
	_, err = c.run(t, "", "tail", "--vchannel", wrong, "--timeout", "1h", "--wait")
	requireOneLineError(t, err, "tail of a VChannel its collection does not have")
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Contains(t, err.Error(), fmt.Sprintf("collection 1 has the VChannels %s, not this one", v))

	// --wait follows a collection to come, until --timeout.
	out, err := c.run(t, "", "tail", "--vchannel", "pchan-3_99v0", "--wait", "--timeout", "300ms")
	require.NoError(t, err)
	require.Empty(t, out)

	// A dropped collection: its history, not its future.
	c.mustRun(t, "", "collection", "drop", "--db", "shop", "--name", "orders", "--id", "1")
	_, err = c.run(t, "", "tail", "--vchannel", v.String(), "--timeout", "1h")
	requireOneLineError(t, err, "tail of a dropped collection")
	require.Contains(t, err.Error(), "collection dropped: nothing new lands on it (--from-start reads its history)")
	out = c.mustRun(t, "", "tail", "--vchannel", v.String(), "--from-start", "--limit", "1", "--json")
	require.Equal(t, "CreateCollection", jsonLines[tailJSON](t, out)[0].Type)

	// The CChannel always exists.
	out = c.mustRun(t, "", "tail", "--vchannel", "pchan-0_vcchan", "--from-start", "--limit", "1", "--json")
	require.Equal(t, "CreateCollection", jsonLines[tailJSON](t, out)[0].Type)

	r := runBinaryExit(t, "", "tail", "--server", c.url, "--vchannel", "pchan-3_99v0")
	requireRefused(t, r, "collection 99: collection not found", "the binary's tail of a collection that does not exist")
}

// A mistyped --cluster is told at once (no command would end before its
// hour-long --timeout otherwise), naming the cluster, the server and the
// clusters the server has.
func TestAMistypedClusterIsToldAtOnce(t *testing.T) {
	c := newCluster(t)
	v := c.createCollection(t, "shop", "orders", 1, 1)[0].String()
	want := fmt.Sprintf(`UNAVAILABLE: no coordinator answers for cluster "locl" on %s: the server has no streamwal cluster of that name (it has "local")`, c.url)
	for _, args := range [][]string{
		{"status"},
		{"tail", "--vchannel", v},
		{"append", "--vchannel", v, "x"},
		{"collection", "create", "--db", "shop", "--name", "more", "--id", "2"},
		{"collection", "drop", "--db", "shop", "--name", "orders", "--id", "1"},
		{"collection", "flush", "--id", "1"},
		{"segments", "--vchannel", v},
		{"pchannel", "accept-loss", "pchan-0"},
		{"bench", "--duration", "1ms", "--progress=false"},
	} {
		what := strings.Join(args, " ")
		out, err := c.run(t, "", append(args, "--cluster", "locl", "--timeout", "1h")...)
		requireOneLineError(t, err, what)
		require.ErrorIs(t, err, streamwal.ErrUnavailable, what)
		require.Equal(t, want, err.Error(), what)
		require.Empty(t, out, what)
	}
	r := runBinaryExit(t, "", "status", "--server", c.url, "--cluster", "locl", "--timeout", "1h")
	requireRefused(t, r, want, "the binary's status of a mistyped cluster")
}

// A cluster the server has, with no coordinator: the command waits for
// one (a takeover takes a few seconds), then says none answers.
func TestAClusterWithoutACoordinatorIsToldWithinTheTimeout(t *testing.T) {
	c := newCluster(t)
	for _, co := range c.sys.Coordinators() {
		c.sys.StopCoordinator(co, false)
	}
	_, err := c.run(t, "", "status", "--timeout", "1s")
	requireOneLineError(t, err, "status without a coordinator")
	require.ErrorIs(t, err, streamwal.ErrUnavailable)
	require.Contains(t, err.Error(), fmt.Sprintf(`no coordinator answers for cluster "local" on %s (is one running?)`, c.url))
}

func TestCollectionCreateRefusesZeroShards(t *testing.T) {
	c := newCluster(t)
	before := c.quiet(t)
	for _, shards := range []string{"0", "-1"} {
		out, err := c.run(t, "", "collection", "create", "--db", "shop", "--name", "orders", "--id", "1", "--shards", shards)
		requireOneLineError(t, err, "--shards "+shards)
		require.Contains(t, err.Error(), "--shards must be at least 1 (the collection's VChannels, each on its own PChannel), got "+shards)
		require.Empty(t, out)
	}
	c.requireUnchanged(t, before, "--shards 0")
	r := runBinaryExit(t, "", "collection", "create", "--server", c.url, "--name", "orders", "--id", "1", "--shards", "0")
	requireRefused(t, r, "--shards must be at least 1", "the binary's collection create --shards 0")
}

func TestCollectionCreateRefusesANameTakenByAnotherID(t *testing.T) {
	c := newCluster(t)
	c.createCollection(t, "shop", "orders", 1, 2)
	before := c.quiet(t)
	out, err := c.run(t, "", "collection", "create", "--db", "shop", "--name", "orders", "--id", "2", "--shards", "2")
	requireOneLineError(t, err, "create under a taken name")
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Contains(t, err.Error(), "INVALID_ARGUMENT: collection 2: the name shop.orders is taken by collection 1")
	require.Empty(t, out)
	c.requireUnchanged(t, before, "create under a taken name")

	// The same name in another database is another collection; a dropped
	// collection's name is free again.
	c.createCollection(t, "other", "orders", 2, 1)
	c.mustRun(t, "", "collection", "drop", "--db", "shop", "--name", "orders", "--id", "1")
	c.createCollection(t, "shop", "orders", 3, 1)

	r := runBinaryExit(t, "", "collection", "create", "--server", c.url, "--db", "shop", "--name", "orders", "--id", "4")
	requireRefused(t, r, "the name shop.orders is taken by collection 3", "the binary's create under a taken name")
}

func TestAppendTypeInAnyCaseAndTheValidTypesListed(t *testing.T) {
	c := newCluster(t)
	vs := c.createCollection(t, "shop", "orders", 1, 1)
	v := vs[0].String()
	valid := strings.Join(appendTypes(messages.NewRegistry()), ", ")
	require.Contains(t, valid, "Insert")

	for _, typ := range []string{"insert", "DELETE", "uPsErT"} {
		c.mustRun(t, "", "append", "--vchannel", v, "--type", typ, "p-"+typ)
	}
	got := readAll(t, c.client(t), vs[0], 4)
	require.Equal(t, []*messages.Type{messages.TypeCreateCollection, messages.TypeInsert, messages.TypeDelete, messages.TypeUpsert},
		[]*messages.Type{got[0].Type(), got[1].Type(), got[2].Type(), got[3].Type()})

	help, err := runCmd(t, "", "append", "--help")
	require.NoError(t, err)
	require.Regexp(t, `--type string +message type, in any case: `+regexp.QuoteMeta(valid)+` \(default "Insert"\)`, help)

	before := c.quiet(t)
	for typ, want := range map[string]string{
		"Nope":     `--type "Nope": unknown message type; append takes ` + valid + " (in any case)",
		"timetick": `--type "timetick": TimeTick messages are not appended by hand`,
		"txn":      `--type "txn": Txn messages are not appended by hand`,
	} {
		_, err := c.run(t, "", "append", "--vchannel", v, "--type", typ, "x")
		requireOneLineError(t, err, "--type "+typ)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument, typ)
		require.Contains(t, err.Error(), want)
		require.Contains(t, err.Error(), "append takes "+valid)
	}
	c.requireUnchanged(t, before, "refused types")
	r := runBinaryExit(t, "", "append", "--vchannel", v, "--type", "Nope", "x")
	requireRefused(t, r, "append takes "+valid, "the binary's append --type Nope")
}

// A line of standard input as long as the largest payload is one
// message; a longer one is refused with the limit, and nothing lands.
func TestAppendTakesLinesUpToTheLargestPayload(t *testing.T) {
	c := newCluster(t)
	vs := c.createCollection(t, "shop", "orders", 1, 1)
	v := vs[0].String()
	limit := c.client(t).MaxPayload()
	require.GreaterOrEqual(t, limit, 1<<20, "a 1 MiB line fits the embedded server's payload")

	line := strings.Repeat("x", limit)
	out := c.mustRun(t, "short\n"+line+"\n", "append", "--vchannel", v, "--json")
	require.Len(t, jsonLines[map[string]any](t, out), 2)
	got := readAll(t, c.client(t), vs[0], 3)
	require.Equal(t, "short", string(got[1].Payload()))
	require.Equal(t, line, string(got[2].Payload()))

	before := c.quiet(t)
	_, err := c.run(t, "ok\n"+line+"y\n", "append", "--vchannel", v)
	requireOneLineError(t, err, "a line over the limit")
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Contains(t, err.Error(), fmt.Sprintf("read standard input: line 2: INVALID_ARGUMENT: longer than %d bytes, the most one message may carry", limit))
	_, err = c.run(t, "", "append", "--vchannel", v, line+"y")
	require.ErrorContains(t, err, fmt.Sprintf("payload argument 1 has %d bytes, more than the %d bytes one message may carry", limit+1, limit))
	c.requireUnchanged(t, before, "a line over the limit")
}

// binaryPayload holds every byte value, newlines and invalid UTF-8.
func binaryPayload() []byte {
	var p []byte
	for i := range 3 * 256 {
		p = append(p, byte(i))
	}
	return append(p, "\n\r\n\xff\xfe end"...)
}

// append --file appends a file's bytes as one message, and tail --json
// gives it back in base64, saying so; text payloads stay text.
func TestBinaryPayloadsInWithFileAndOutInBase64(t *testing.T) {
	c := newCluster(t)
	vs := c.createCollection(t, "shop", "orders", 1, 1)
	v := vs[0].String()
	dir := t.TempDir()
	path := filepath.Join(dir, "payload.bin")
	p := binaryPayload()
	require.NoError(t, os.WriteFile(path, p, 0o600))

	out := c.mustRun(t, "", "append", "--vchannel", v, "--file", path, "--json")
	require.Len(t, jsonLines[map[string]any](t, out), 1, "one message")
	c.mustRun(t, string(p), "append", "--vchannel", v, "--file", "-", "--type", "delete")
	c.mustRun(t, "", "append", "--vchannel", v, "text ü")
	got := readAll(t, c.client(t), vs[0], 4)
	require.Equal(t, p, got[1].Payload(), "--file, byte for byte")
	require.Equal(t, p, got[2].Payload(), "--file -, byte for byte")
	require.Same(t, messages.TypeDelete, got[2].Type())

	out = c.mustRun(t, "", "tail", "--vchannel", v, "--from-start", "--limit", "5", "--json")
	var lines []map[string]any
	for _, l := range jsonLines[map[string]any](t, out) {
		if l["type"] != "CreateSegment" {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 4, out)
	for _, l := range lines[1:3] {
		require.Equal(t, "base64", l["payload_encoding"], "a binary payload says it is base64")
		dec, err := base64.StdEncoding.DecodeString(l["payload"].(string))
		require.NoError(t, err)
		require.Equal(t, p, dec)
	}
	require.Equal(t, "text ü", lines[3]["payload"])
	require.NotContains(t, lines[3], "payload_encoding", "a text payload is given as text")

	// Text output quotes the bytes.
	out = c.mustRun(t, "", "tail", "--vchannel", v, "--from-start", "--limit", "3")
	require.Contains(t, out, fmt.Sprintf(" Insert %s %q\n", v, p))

	before := c.quiet(t)
	limit := c.client(t).MaxPayload()
	big := filepath.Join(dir, "big.bin")
	require.NoError(t, os.WriteFile(big, bytes.Repeat([]byte{0}, limit+1), 0o600))
	for _, tc := range []refused{
		{args: []string{"append", "--vchannel", v, "--file", path, "x"}, want: "give payloads as arguments or with --file, not both"},
		{args: []string{"append", "--vchannel", v, "--file", filepath.Join(dir, "none")}, want: "--file: open " + filepath.Join(dir, "none")},
		{args: []string{"append", "--vchannel", v, "--file", big}, want: fmt.Sprintf("--file %s has more than %d bytes, the most one message may carry", big, limit)},
	} {
		out, err := c.run(t, tc.stdin, tc.args...)
		requireOneLineError(t, err, strings.Join(tc.args, " "))
		require.Contains(t, err.Error(), tc.want)
		require.Empty(t, out)
	}
	c.requireUnchanged(t, before, "refused --file")
}

// serve logs JSON lines when its standard error is not a terminal (here a
// pipe), plain text with --log-format text, and refuses another format.
func TestServeLogFormat(t *testing.T) {
	for _, format := range []string{"", "text", "json"} {
		var args []string
		if format != "" {
			args = []string{"--log-format", format}
		}
		p := startServe(t, t.TempDir(), args...)
		p.waitURL(serveTimeout)
		p.stop(syscall.SIGTERM)
		lines := strings.Split(strings.TrimRight(p.stderr.String(), "\n"), "\n")
		require.NotEmpty(t, lines[0], "serve logged nothing")
		for _, l := range lines {
			require.NotContains(t, l, "\x1b[", "escape codes in a log that is not a terminal")
			if format == "text" {
				require.Regexp(t, `^\d\d:\d\d:\d\d (DBG|INF|WRN|ERR) `, l)
				continue
			}
			var rec map[string]any
			require.NoError(t, json.Unmarshal([]byte(l), &rec), "--log-format %q: %q is not a JSON line", format, l)
			require.NotEmpty(t, rec["level"], l)
			require.NotEmpty(t, rec["time"], l)
		}
	}
	r := runBinaryExit(t, "", "serve", "--log-format", "xml", "--data-dir", filepath.Join(t.TempDir(), "d"))
	requireRefused(t, r, `invalid argument "xml" for "--log-format" flag: log format "xml": want text, json or auto`, "--log-format xml")
}

func TestVersion(t *testing.T) {
	bin := streamwalBinary(t)
	info, err := buildinfo.ReadFile(bin)
	require.NoError(t, err)
	for _, flag := range []string{"--version", "-v"} {
		r := runBinaryExit(t, "", flag)
		require.Equal(t, 0, r.code, r.stderr)
		require.Equal(t, "streamwal "+version(info, true)+"\n", r.stdout)
		require.Empty(t, r.stderr)
	}
	// What a build records, as --version says it.
	for _, tc := range []struct {
		info *debug.BuildInfo
		want string
	}{
		{&debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3, go1.26.1"},
		{&debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123abcd"},
			{Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "true"},
		}}, "(devel) (revision 0123abcd, 2026-12-01T10:00:00Z, modified), go1.26.1"},
		{&debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.modified", Value: "false"}}},
			"(devel) (revision 0123abcd)"},
	} {
		require.Equal(t, tc.want, version(tc.info, true))
	}
	require.Equal(t, "(unknown)", version(nil, false))
}

// walkCommands calls fn on cmd and every command under it.
func walkCommands(cmd *cobra.Command, fn func(*cobra.Command)) {
	fn(cmd)
	for _, sub := range cmd.Commands() {
		walkCommands(sub, fn)
	}
}

// setShown sets a flag from the default help shows; a list shows as
// "[a,b]".
func setShown(f *pflag.Flag) error {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		items := strings.Trim(f.DefValue, "[]")
		if items == "" {
			return sv.Replace(nil)
		}
		return sv.Replace(strings.Split(items, ","))
	}
	return f.Value.Set(f.DefValue)
}

// Every flag's default, as help shows it, is the value the flag has
// when not given: set from the shown text, each flag of one tree equals
// the untouched flag of another.
func TestEveryFlagShowsItsRealDefault(t *testing.T) {
	shown, real := newRootCmd(io.Discard, io.Discard), newRootCmd(io.Discard, io.Discard)
	n := 0
	walkCommands(shown, func(cmd *cobra.Command) {
		other, _, err := real.Find(strings.Fields(cmd.CommandPath())[1:])
		require.NoError(t, err)
		check := func(f *pflag.Flag) {
			what := cmd.CommandPath() + " --" + f.Name
			require.False(t, f.Changed, "%s counts as given", what)
			require.NoError(t, setShown(f), what)
			require.Equal(t, other.Flag(f.Name).Value.String(), f.Value.String(), "%s: help shows %q", what, f.DefValue)
			n++
		}
		cmd.LocalNonPersistentFlags().VisitAll(check)
		cmd.PersistentFlags().VisitAll(check)
	})
	require.Greater(t, n, 50)

	// bench --help in particular: its --timeout default.
	help, err := runCmd(t, "", "bench", "--help")
	require.NoError(t, err)
	m := regexp.MustCompile(`--timeout duration +bound of the whole command \(default (\S+)\)`).FindStringSubmatch(help)
	require.NotNil(t, m, help)
	shownTimeout, err := time.ParseDuration(m[1])
	require.NoError(t, err)
	bench, _, err := real.Find([]string{"bench"})
	require.NoError(t, err)
	realTimeout, err := bench.Flags().GetDuration("timeout")
	require.NoError(t, err)
	require.Equal(t, realTimeout, shownTimeout)
}
