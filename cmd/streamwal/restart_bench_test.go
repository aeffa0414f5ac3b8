package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// BenchmarkRestartToWritable measures how long a restarted `streamwal
// serve` takes to become writable on a log of 10,000, 100,000 and
// 1,000,000 messages (all on one PChannel, whose owner replays it from its
// checkpoint when it opens it): per size, a data directory is preloaded
// once (through the client, many appends in flight, --sync-always=false),
// and then, per signal, each iteration starts serve on it (fsync on, as by
// default) and times process start to the first acknowledged append,
// after the previous incarnation was stopped with that signal. It reports
// the mean ("ms/restart", "ms/serving": until serve printed its URL) and
// the slowest ("max-ms/restart"); ns/op is the whole cycle, stop
// included.
//
// A restarted nats-server reloads the message IDs of every message stored
// within its stream's duplicate window, to drop retried appends: that cost
// grows with what was written in the last window, not with the log. The
// variants tell the two apart: "recent" restarts right after the preload
// with the default window (2 min), so every preloaded message is still in
// it; "old" restarts the same log with --duplicate-window 1s, as a log
// written longer than a window ago; "truncated" serves with --retain 0s
// (the preloaded messages flushed and truncated before the restarts), so
// that the stream holds only the tail and the archive the rest. Run it
// with a fixed count of restarts, for example:
//
//	go test -run '^$' -bench BenchmarkRestartToWritable -benchtime 5x ./cmd/streamwal/
func BenchmarkRestartToWritable(b *testing.B) {
	oldLog := []string{"--duplicate-window", "1s"}
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("log=%d", n), func(b *testing.B) {
			dir := b.TempDir()
			preloadLog(b, dir, n)
			benchSignals(b, "recent", dir)
			benchSignals(b, "old", dir, oldLog...)
		})
		b.Run(fmt.Sprintf("log=%d/truncated", n), func(b *testing.B) {
			dir := b.TempDir()
			preloadLog(b, dir, n)
			truncateLog(b, dir, n)
			benchSignals(b, "", dir, append([]string{"--retain", "0s"}, oldLog...)...)
		})
	}
}

// benchSignals runs the restarts of one variant (named by prefix, if any)
// after each signal.
func benchSignals(b *testing.B, prefix, dir string, args ...string) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		name := signalName[sig]
		if prefix != "" {
			name = prefix + "/" + name
		}
		b.Run(name, func(b *testing.B) { benchRestarts(b, dir, sig, args...) })
	}
}

// truncateLog serves dir with --retain 0s, flushes collection 1 and waits
// until its PChannel's stream was truncated past the n preloaded messages.
func truncateLog(b *testing.B, dir string, n int) {
	b.Helper()
	start := time.Now()
	p, url := serveAndWait(b, dir, "--sync-always=false", "--retain", "0s", "--duplicate-window", "1s", "--log-level", "warn")
	defer p.stop(syscall.SIGTERM)
	mustRunBinary(b, "", "collection", "flush", "--server", url, "--id", "1", "--timeout", "30s")
	pch := restartVChannel[:strings.Index(restartVChannel, "_")]
	waitStatus(b, url, pch, 2*time.Minute, func(ch client.ChannelStatus) bool {
		return ch.FirstID > messages.MessageID(n)
	})
	b.Logf("flushed and truncated %d messages in %s", n, time.Since(start).Round(time.Millisecond))
}

// benchServeTimeout bounds a restart in the benchmark: the replay of a
// long log takes a while.
const benchServeTimeout = 3 * time.Minute

// benchRestarts restarts serve on dir b.N times, each after a stop with
// sig, and reports the times to serving and to the first acknowledged
// append.
func benchRestarts(b *testing.B, dir string, sig syscall.Signal, args ...string) {
	l := newLedger(b, restartVChannel)
	args = append([]string{"--log-level", "warn"}, args...)
	p, _ := serveAndWaitWithin(b, benchServeTimeout, dir, args...)
	p.stop(sig)
	var writable, serving, slowest time.Duration
	b.ResetTimer()
	for i := range b.N {
		p, url := serveAndWaitWithin(b, benchServeTimeout, dir, args...)
		serving += time.Since(p.started)
		c := connect(b, url)
		_, at := l.appendUntilAcked(b, c, fmt.Sprintf("bench-%d", i))
		d := at.Sub(p.started)
		writable += d
		slowest = max(slowest, d)
		p.stop(sig)
		closeLater(b, c)
	}
	b.StopTimer()
	b.ReportMetric(float64(writable.Milliseconds())/float64(b.N), "ms/restart")
	b.ReportMetric(float64(serving.Milliseconds())/float64(b.N), "ms/serving")
	b.ReportMetric(float64(slowest.Milliseconds()), "max-ms/restart")
}

// preloadBatch and preloadDepth shape the preload: messages an append
// call, calls in flight.
const (
	preloadBatch = 1000
	preloadDepth = 16
)

// preloadLog serves dir without fsync, creates collection 1 and appends n
// messages of 100 bytes to its VChannel, then stops serve cleanly.
func preloadLog(b *testing.B, dir string, n int) {
	b.Helper()
	start := time.Now()
	p, url := serveAndWait(b, dir, "--sync-always=false", "--log-level", "warn")
	createCollection(b, url, 1)
	c := connect(b, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var inFlight []*client.AppendFuture
	for sent := 0; sent < n; sent += preloadBatch {
		if len(inFlight) == preloadDepth {
			waitAppend(b, inFlight[0])
			inFlight = inFlight[1:]
		}
		inFlight = append(inFlight, c.AppendAsync(ctx, preloadMessages(b, c, sent, min(preloadBatch, n-sent))...))
	}
	for _, f := range inFlight {
		waitAppend(b, f)
	}
	_ = c.Close()
	p.stop(syscall.SIGTERM)
	b.Logf("preloaded %d messages in %s", n, time.Since(start).Round(time.Millisecond))
}

// preloadMessages builds count inserts for the preload, numbered from first.
func preloadMessages(b *testing.B, c *client.Client, first, count int) []*messages.MutableMessage {
	v := newLedger(b, restartVChannel).v
	msgs := make([]*messages.MutableMessage, count)
	for i := range msgs {
		payload := bytes.Repeat([]byte("x"), 100)
		copy(payload, fmt.Sprintf("pre-%09d", first+i))
		m, err := c.Codec().New(messages.TypeInsert, v, payload)
		if err != nil {
			b.Fatalf("build message: %v", err)
		}
		msgs[i] = m
	}
	return msgs
}

// waitAppend waits for a preload append, which must succeed.
func waitAppend(b *testing.B, f *client.AppendFuture) {
	b.Helper()
	if _, err := f.Wait(); err != nil {
		b.Fatalf("preload append: %v", err)
	}
}
