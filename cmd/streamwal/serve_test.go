package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
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

var urlLine = regexp.MustCompile(`url:\s+(nats://\S+)`)

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
