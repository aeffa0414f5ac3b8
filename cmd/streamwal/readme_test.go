package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/node/recovery"
)

// walkthroughHeading starts the README's walkthrough section; it ends at
// the next "## " heading.
const walkthroughHeading = "## Walkthrough: a running system"

// fence is a fenced block of the README.
type fence struct {
	lang string
	body []string
	line int // of the opening fence
	// adjacent: only blank lines separate it from the previous block.
	adjacent bool
}

// walkthroughFences returns the fenced blocks of the walkthrough.
func walkthroughFences(t *testing.T) []fence {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	lines := strings.Split(string(data), "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, walkthroughHeading) })
	require.GreaterOrEqual(t, start, 0, "README.md has no %q section", walkthroughHeading)
	var out []fence
	var cur *fence
	adjacent := false
	for i := start + 1; i < len(lines); i++ {
		l := lines[i]
		if cur == nil && strings.HasPrefix(l, "## ") {
			break
		}
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &fence{lang: strings.TrimPrefix(l, "```"), line: i + 1, adjacent: adjacent && len(out) > 0}
		case cur != nil && l == "```":
			out = append(out, *cur)
			cur, adjacent = nil, true
		case cur != nil:
			cur.body = append(cur.body, l)
		case strings.TrimSpace(l) != "":
			adjacent = false
		}
	}
	require.Nil(t, cur, "unclosed fence in the walkthrough")
	return out
}

// shellWords splits a line of a sh block the way sh would, for the
// little the walkthrough uses: words, '...' and "..." quotes, a comment
// from an unquoted #, and | between commands. Anything else that sh
// would interpret is refused, so that the README stays that simple.
func shellWords(line string) ([][]string, error) {
	var cmds [][]string
	var words []string
	var w strings.Builder
	inWord, single, double := false, false, false
	end := func() {
		if inWord {
			words = append(words, w.String())
		}
		w.Reset()
		inWord = false
	}
	rs := []rune(line)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case single:
			if r == '\'' {
				single = false
			} else {
				w.WriteRune(r)
			}
		case double:
			switch {
			case r == '"':
				double = false
			case r == '\\' && i+1 < len(rs) && strings.ContainsRune(`"\$`+"`", rs[i+1]):
				i++
				w.WriteRune(rs[i])
			case r == '$' || r == '`':
				return nil, fmt.Errorf("%q: expansions are not supported", line)
			default:
				w.WriteRune(r)
			}
		case r == '\'':
			single, inWord = true, true
		case r == '"':
			double, inWord = true, true
		case r == ' ' || r == '\t':
			end()
		case r == '#' && !inWord:
			i = len(rs)
		case r == '|':
			end()
			if len(words) == 0 {
				return nil, fmt.Errorf("%q: empty command before |", line)
			}
			cmds, words = append(cmds, words), nil
		case strings.ContainsRune("\\$`;&<>(){}*?[]~", r):
			return nil, fmt.Errorf("%q: %q outside quotes is not supported", line, r)
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if single || double {
		return nil, fmt.Errorf("%q: unterminated quote", line)
	}
	end()
	if len(words) > 0 {
		cmds = append(cmds, words)
	} else if len(cmds) > 0 {
		return nil, fmt.Errorf("%q: empty command after |", line)
	}
	return cmds, nil
}

func TestShellWords(t *testing.T) {
	for line, want := range map[string][][]string{
		`go run ./cmd/streamwal status`:                   {{"go", "run", "./cmd/streamwal", "status"}},
		`nats sub 'wal.local.*.v.*.insert'   # live`:      {{"nats", "sub", "wal.local.*.v.*.insert"}},
		`printf 'a\nb\n' | streamwal append --vchannel x`: {{"printf", `a\nb\n`}, {"streamwal", "append", "--vchannel", "x"}},
		`echo "a b" c`: {{"echo", "a b", "c"}},
		`streamwal append --vchannel x 'it''s' "say \"hi\""`: {{"streamwal", "append", "--vchannel", "x", "its", `say "hi"`}},
		`# only a comment`:                                    nil,
		`streamwal append --vchannel x a#b`:                   {{"streamwal", "append", "--vchannel", "x", "a#b"}},
		`nats kv get wal_local_assignments view   # the view`: {{"nats", "kv", "get", "wal_local_assignments", "view"}},
	} {
		got, err := shellWords(line)
		require.NoError(t, err, line)
		require.Equal(t, want, got, line)
	}
	for _, line := range []string{`a $HOME`, `a; b`, `a > f`, `a 'b`, `a | `, `| a`, "a `b`", `a *`} {
		_, err := shellWords(line)
		require.Error(t, err, line)
	}
}

// printfOutput is what printf prints for a format without conversions.
func printfOutput(format string) string {
	return strings.NewReplacer(`\n`, "\n", `\t`, "\t", `\\`, `\`).Replace(format)
}

var (
	shapeDigits = regexp.MustCompile(`\d+`)
	shapeDashes = regexp.MustCompile(`-{2,}`)
	shapeBlanks = regexp.MustCompile(`\s+`)
)

// shape is a line with what changes from run to run blurred: numbers,
// and the padding of table columns.
func shape(line string) string {
	line = shapeDigits.ReplaceAllString(line, "0")
	line = shapeDashes.ReplaceAllString(line, "-")
	return strings.TrimSpace(shapeBlanks.ReplaceAllString(line, " "))
}

// sameShape matches output lines against the README's, where a line
// "..." stands for any number of lines.
func sameShape(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if strings.TrimSpace(want[0]) == "..." {
		for i := 0; i <= len(got); i++ {
			if sameShape(want[1:], got[i:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && shape(want[0]) == shape(got[0]) && sameShape(want[1:], got[1:])
}

func TestSameShape(t *testing.T) {
	require.True(t, sameShape([]string{"appended 4 at 2026-11-29T18:58:29.563Z+3"}, []string{"appended 12 at 2027-01-02T03:04:05.006Z+1025"}))
	require.True(t, sameShape([]string{"| a  |    1 |", "...", "+--+"}, []string{"| a |   12 |", "| b | 3 |", "| c | 4 |", "+-----+"}))
	require.True(t, sameShape([]string{"x", "..."}, []string{"x"}))
	require.False(t, sameShape([]string{"appended 4 at"}, []string{"dropped 4 at"}))
	require.False(t, sameShape([]string{"a", "b"}, []string{"a"}))
}

// natsSub is a `nats sub` of the walkthrough: the commands after it must
// make something arrive.
type natsSub struct {
	line string
	sub  *nats.Subscription
}

// TestREADMEWalkthrough runs the README's walkthrough against an
// in-process cluster: every `go run ./cmd/streamwal ...` in-process (with
// the cluster's --server appended), its output compared in shape with
// the text block that follows it, and every `nats ...` checked through
// nats.go (the streams, buckets and keys it names exist; what it
// subscribes to receives messages).
func TestREADMEWalkthrough(t *testing.T) {
	fences := walkthroughFences(t)
	// No checkpoint before the walkthrough's status however slow the
	// machine (the default cadence persists 10 s after a change), so
	// that its CKPT AGE column is "-" as the README shows.
	c := newClusterOf(t, coord.DefaultPChannels, node.Config{SyncInterval: testSyncInterval,
		Recovery: node.RecoveryOptions{Cadence: recovery.Cadence{Interval: time.Hour}}})
	var subs []natsSub
	seen := map[string]bool{}
	ran := 0
	for i, f := range fences {
		if f.lang != "sh" {
			require.Contains(t, []string{"text"}, f.lang, "README.md:%d: fence language", f.line)
			continue
		}
		var expect []string
		if i+1 < len(fences) && fences[i+1].lang == "text" && fences[i+1].adjacent {
			expect = fences[i+1].body
		}
		for j, line := range f.body {
			where := fmt.Sprintf("README.md:%d: %s", f.line+1+j, line)
			cmds, err := shellWords(line)
			require.NoError(t, err, where)
			if len(cmds) == 0 {
				continue
			}
			ran++
			stdin := ""
			if len(cmds) == 2 {
				switch cmds[0][0] {
				case "printf":
					require.Len(t, cmds[0], 2, "%s: printf with one format", where)
					stdin = printfOutput(cmds[0][1])
				case "echo":
					stdin = strings.Join(cmds[0][1:], " ") + "\n"
				default:
					t.Fatalf("%s: only printf or echo may feed a pipe", where)
				}
				cmds = cmds[1:]
			}
			require.Len(t, cmds, 1, "%s: one pipe at most", where)
			words := cmds[0]
			var out string
			switch {
			case len(words) >= 3 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/streamwal":
				out = runWalkthroughCommand(t, c, where, stdin, words[3:], seen)
			case words[0] == "streamwal" || words[0] == "./streamwal":
				out = runWalkthroughCommand(t, c, where, stdin, words[1:], seen)
			case words[0] == "curl":
				require.Empty(t, stdin, where)
				out = runWalkthroughCurl(t, c, where, words[1:])
				seen["curl"] = true
			case words[0] == "nats":
				require.Empty(t, stdin, where)
				if s := checkNats(t, c, where, words[1:], seen); s != nil {
					subs = append(subs, natsSub{line: where, sub: s})
				}
				continue
			default:
				t.Fatalf("%s: the walkthrough runs streamwal and nats only", where)
			}
			if expect != nil && j == len(f.body)-1 {
				got := strings.Split(strings.TrimRight(out, "\n"), "\n")
				require.True(t, sameShape(expect, got),
					"%s: the output does not have the shape the README shows.\nREADME:\n%s\ngot:\n%s",
					where, strings.Join(expect, "\n"), out)
			}
		}
	}
	for _, s := range subs {
		m, err := s.sub.NextMsg(10 * time.Second)
		require.NoError(t, err, "%s: nothing arrived", s.line)
		require.NotEmpty(t, m.Header.Get("Wal-PChannel"), "%s: %s has no Wal-PChannel", s.line, m.Subject)
		if strings.HasSuffix(m.Subject, ".insert") {
			require.Equal(t, "Insert", m.Header.Get("Wal-Type"), s.line)
		}
		require.NoError(t, s.sub.Unsubscribe())
	}
	require.Greater(t, ran, 0)
	for _, kind := range []string{"collection create", "append", "append from standard input", "tail", "status", "bench",
		"nats stream ls", "nats stream view", "nats stream get", "nats sub", "nats kv ls", "nats kv watch", "curl"} {
		require.True(t, seen[kind], "the walkthrough shows no %s", kind)
	}
}

// runWalkthroughCommand runs a streamwal command of the walkthrough
// in-process and returns its output.
func runWalkthroughCommand(t *testing.T, c *cluster, where, stdin string, args []string, seen map[string]bool) string {
	t.Helper()
	require.NotEmpty(t, args, where)
	require.NotEqual(t, "serve", args[0], "%s: the walkthrough runs against the quick start's serve; it does not start one", where)
	kind := args[0]
	if kind == "collection" && len(args) > 1 {
		kind += " " + args[1]
	}
	if kind == "append" && stdin != "" {
		kind = "append from standard input"
	}
	seen[kind] = true
	if args[0] == "bench" {
		// The same workloads, shorter and lighter (see benchLoad).
		args = append(append(slices.Clone(args), "--duration", "150ms", "--progress=false"), benchLoad...)
	}
	out, err := c.run(t, stdin, args...)
	require.NoError(t, err, where)
	require.NotEmpty(t, out, where)
	return out
}

// runWalkthroughCurl fetches what a `curl -s HOST:PORT/PATH` of the
// walkthrough asks of serve's --metrics-addr, from the cluster's metrics
// endpoint, and returns the body.
func runWalkthroughCurl(t *testing.T, c *cluster, where string, args []string) string {
	t.Helper()
	require.Len(t, args, 2, "%s: curl -s URL", where)
	require.Equal(t, "-s", args[0], where)
	u := strings.TrimPrefix(args[1], "http://")
	slash := strings.Index(u, "/")
	require.Positive(t, slash, "%s: a URL with a path", where)
	resp, err := http.Get("http://" + c.sys.MetricsAddr() + u[slash:])
	require.NoError(t, err, where)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err, where)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", where, body)
	return string(body)
}

// checkNats checks what a nats command of the walkthrough shows, through
// nats.go; a subscription is returned for the caller to check later.
func checkNats(t *testing.T, c *cluster, where string, args []string, seen map[string]bool) *nats.Subscription {
	t.Helper()
	// Global flags naming the server: the test's cluster is the server.
	for i := 0; i < len(args); {
		switch {
		case args[i] == "--server" || args[i] == "-s":
			args = slices.Delete(args, i, min(i+2, len(args)))
		case strings.HasPrefix(args[i], "--server="):
			args = slices.Delete(args, i, i+1)
		default:
			i++
		}
	}
	cmd := strings.Join(args[:min(2, len(args))], " ")
	seen["nats "+cmd] = true
	rest := args[min(2, len(args)):]
	switch {
	case cmd == "account info" && len(rest) == 0:
		info, err := c.js.AccountInfo()
		require.NoError(t, err, "%s: JetStream enabled", where)
		require.NotZero(t, info.Streams, where)
	case cmd == "stream ls" && len(rest) == 0:
		var wal []string
		for name := range c.js.StreamNames() {
			if strings.HasPrefix(name, "WAL_local_pchan-") {
				wal = append(wal, name)
			}
		}
		require.Len(t, wal, 16, "%s: one stream per PChannel", where)
	case cmd == "stream view" && len(rest) == 1:
		info, err := c.js.StreamInfo(rest[0])
		require.NoError(t, err, where)
		require.NotZero(t, info.State.Msgs, where)
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			m, err := c.js.GetMsg(rest[0], seq)
			require.NoError(t, err, where)
			require.NotEmpty(t, m.Header.Get("Wal-Type"), "%s: message %d has its type in a header", where, seq)
		}
	case cmd == "stream get" && len(rest) == 2:
		seq, err := strconv.ParseUint(rest[1], 10, 64)
		require.NoError(t, err, "%s: a MessageID", where)
		m, err := c.js.GetMsg(rest[0], seq)
		require.NoError(t, err, where)
		require.NotEmpty(t, m.Header.Get("Wal-Type"), "%s: message %d has its type in a header", where, seq)
	case cmd == "stream get" && len(rest) == 3 && rest[1] == "--last-for":
		m, err := c.js.GetLastMsg(rest[0], rest[2])
		require.NoError(t, err, where)
		require.Equal(t, rest[2], m.Subject, where)
		require.NotEmpty(t, m.Header.Get("Wal-Type"), where)
	case cmd == "kv ls" && len(rest) == 0:
		var buckets []string
		for name := range c.js.KeyValueStoreNames() {
			buckets = append(buckets, name)
		}
		for _, b := range []string{"leader", "tso", "nodes", "assignments", "vchannels", "broadcast", "checkpoints", "replication"} {
			require.Contains(t, buckets, "wal_local_"+b, where)
		}
	case cmd == "kv ls" && len(rest) == 1:
		kv, err := c.js.KeyValue(rest[0])
		require.NoError(t, err, where)
		keys, err := kv.Keys()
		require.NoError(t, err, where)
		require.NotEmpty(t, keys, where)
	case cmd == "kv get" && len(rest) == 2:
		kv, err := c.js.KeyValue(rest[0])
		require.NoError(t, err, where)
		e, err := kv.Get(rest[1])
		require.NoError(t, err, where)
		require.NotEmpty(t, e.Value(), where)
	case cmd == "kv watch" && len(rest) == 1:
		kv, err := c.js.KeyValue(rest[0])
		require.NoError(t, err, where)
		w, err := kv.WatchAll()
		require.NoError(t, err, where)
		defer func() { _ = w.Stop() }()
		select {
		case e := <-w.Updates():
			require.NotNil(t, e, "%s: the watch shows the bucket's values first", where)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the watch showed nothing", where)
		}
	case args[0] == "sub" && len(args) == 2:
		seen["nats sub"] = true
		s, err := c.nc.SubscribeSync(args[1])
		require.NoError(t, err, where)
		require.NoError(t, c.nc.Flush(), where)
		return s
	default:
		t.Fatalf("%s: no check for this nats command; add one to readme_test.go", where)
	}
	return nil
}
