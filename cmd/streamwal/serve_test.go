package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var urlLine = regexp.MustCompile(`url:\s+(nats://\S+)\n`)

func TestServeStartsReachableServerAndStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuffer
	root := newRootCmd(&out, &out)
	root.SetArgs([]string{"serve", "--port", "0", "--data-dir", t.TempDir(), "--log-level", "disabled"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()

	var url string
	require.Eventually(t, func() bool {
		m := urlLine.FindStringSubmatch(out.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond, "serve printed no url: %s", out.String())

	nc, err := nats.Connect(url)
	require.NoError(t, err)
	js, err := nc.JetStream()
	require.NoError(t, err)
	info, err := js.AccountInfo()
	require.NoError(t, err, "JetStream must be enabled")
	require.NotNil(t, info)
	streams := 0
	for name := range js.StreamNames() {
		if strings.HasPrefix(name, "WAL_local_pchan-") {
			streams++
		}
	}
	require.Equal(t, 16, streams, "the node opened the WAL of every PChannel")
	require.Contains(t, out.String(), "pchannels:   16")
	nc.Close()

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop after cancel")
	}
	require.Contains(t, out.String(), "shutting down")
}

func TestServeRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--cluster", "bad.name"},
		{"serve", "--log-level", "loud"},
		{"serve", "--port", "-5", "--data-dir", t.TempDir()},
		{"serve", "extra-arg"},
		{"serve", "--pchannels", "0", "--data-dir", t.TempDir()},
	} {
		var out bytes.Buffer
		root := newRootCmd(&out, &out)
		root.SetArgs(args)
		err := root.ExecuteContext(context.Background())
		require.Error(t, err, "%v", args)
	}
}

// treeSnapshot describes every file and directory under dir (path, mode,
// size and modification time), so that a test can tell whether anything
// under it changed; unless strict, directories are described by their mode
// only (nats-server's recovery of a store creates and removes files in its
// directories while it leaves the files there alone).
func treeSnapshot(t *testing.T, dir string, strict bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		out[rel] = fmt.Sprintf("%v %d %s", info.Mode(), info.Size(), info.ModTime().Format(time.RFC3339Nano))
		if d.IsDir() && !strict {
			out[rel] = info.Mode().String()
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// busyPort listens on a free loopback port for the rest of the test and
// returns it.
func busyPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// A second serve on a data directory in use is refused at once, names the
// process that holds it, and the first one keeps serving.
func TestServeRefusesADataDirectoryInUse(t *testing.T) {
	dir := t.TempDir()
	first, url := serveAndWait(t, dir)
	out, err := runBinary(t, "", "serve", "--data-dir", dir, "--port", "0")
	require.Error(t, err)
	require.Contains(t, err.Error(), fmt.Sprintf("data dir %s is in use by another streamwal serve (pid %d)", dir, first.pid()))
	require.NotContains(t, out, "url:", "the second serve must not serve")
	lock, err := os.ReadFile(filepath.Join(dir, lockFileName))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(first.pid()), strings.TrimSpace(string(lock)), "the lock file still names the first serve")

	createCollection(t, url, 1)
	mustRunBinary(t, "", "append", "--server", url, "--vchannel", restartVChannel, "--timeout", "30s", "still-serving")
	first.stop(syscall.SIGTERM)
}

// The refusal happens before anything is written: nothing under the
// directory changes, the lock file included.
func TestServeInUseDataDirectoryIsLeftUntouched(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "keep.txt"), []byte("data"), 0o644))
	held, err := openDataDir(dir) // as another serve would hold it
	require.NoError(t, err)
	defer func() { require.NoError(t, held.release()) }()
	before := treeSnapshot(t, dir, true)

	_, err = runCmd(t, "", "serve", "--data-dir", dir, "--port", "0", "--log-level", "disabled")
	require.ErrorIs(t, err, errDataDirInUse)
	require.Equal(t, before, treeSnapshot(t, dir, true))
}

// A serve that fails to start (its port is taken) removes the data
// directory it created, parents included, but nothing above them.
func TestServeThatFailsToStartLeavesNoNewDirectory(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "new", "nested")
	_, err := runCmd(t, "", "serve", "--data-dir", dir, "--port", busyPort(t), "--log-level", "disabled")
	require.Error(t, err)
	require.Contains(t, err.Error(), "address already in use")
	_, err = os.Stat(filepath.Join(parent, "new"))
	require.ErrorIs(t, err, fs.ErrNotExist, "serve left the directory it created")
	_, err = os.Stat(parent)
	require.NoError(t, err, "the directory that existed stays")
}

// A serve that fails to start in a directory that existed leaves it and
// its data as they were: here the store of an earlier serve and a file of
// the user's. (Only the lock file changes: it names the last serve.)
func TestServeThatFailsToStartKeepsAnExistingDirectory(t *testing.T) {
	empty := t.TempDir()
	_, err := runCmd(t, "", "serve", "--data-dir", empty, "--port", busyPort(t), "--log-level", "disabled")
	require.Error(t, err)
	entries, err := os.ReadDir(empty)
	require.NoError(t, err)
	require.Empty(t, entries, "an empty directory stays, empty")

	dir := t.TempDir()
	p, url := serveAndWait(t, dir)
	createCollection(t, url, 1)
	p.stop(syscall.SIGINT)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "keep.txt"), []byte("data"), 0o644))
	before := treeSnapshot(t, dir, false)
	_, err = runCmd(t, "", "serve", "--data-dir", dir, "--port", busyPort(t), "--log-level", "disabled")
	require.Error(t, err)
	after := treeSnapshot(t, dir, false)
	require.Contains(t, after, lockFileName)
	delete(before, lockFileName)
	delete(after, lockFileName)
	require.Equal(t, before, after)

	p, url = serveAndWait(t, dir)
	mustRunBinary(t, "", "append", "--server", url, "--vchannel", restartVChannel, "--timeout", "30s", "collection-1-is-still-there")
	p.stop(syscall.SIGINT)
}
