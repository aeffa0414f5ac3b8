package jetstream_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/internal/rotate"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// BenchmarkAppend appends 1 KiB messages from 64 goroutines through the
// sequencer and, on the same embedded server in the same run, through raw
// JetStream: async publish from one goroutine (4096 pending) and atomic
// batches of 1000 with an expected last sequence, one at a time. Both raw
// paths publish the same messages the sequencer writes (payload and
// Wal-* headers, a fresh Nats-Msg-Id each), so that the ratios measure the
// sequencer, not the size of its messages. It runs
// without and with SyncAlways (the writer then uses GroupCommit), and with
// two kinds of callers: window=1, each goroutine waits for every Append;
// window=32, each goroutine keeps up to 32 appends in flight (AppendAsync),
// as a node serving many clients does. The paths run in three rounds, each
// once a round in a rotating order. It reports msgs/s of each path (its
// messages over its total time) and the sequencer's ratio to each raw
// path:
//
//	go test -run '^$' -bench BenchmarkAppend -benchtime 150000x ./jetstream/
func BenchmarkAppend(b *testing.B) {
	for _, c := range []struct {
		fsync  bool
		window int
	}{{false, 1}, {false, 32}, {true, 1}, {true, 32}} {
		fsync, window := c.fsync, c.window
		b.Run(fmt.Sprintf("sync=%v/window=%d", fsync, window), func(b *testing.B) {
			srv := embedded.StartTest(b, func(o *embedded.Options) { o.SyncAlways = fsync })
			nc, err := srv.Connect()
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			seq, stats := benchSequencer(b, nc, jetstream.Options{GroupCommit: fsync}, "seq", window)
			paths := []func(n int) time.Duration{seq, benchRawAsync(b, nc, 1), benchRawBatch(b, nc)}
			// Three rounds, each path once a round in a rotating order, so
			// that no path always runs first on a fresh disk or last behind
			// the others' writeback; a path's rate is its messages over its
			// total time.
			const rounds = 3
			per := max(b.N/rounds, 1000)
			b.ResetTimer()
			took := rotate.Rounds(paths, rounds, per)
			rate := func(d time.Duration) float64 { return rotate.Rate(rounds*per, d) }
			seqRate, async, batch := rate(took[0]), rate(took[1]), rate(took[2])
			b.StopTimer()
			stats()
			b.ReportMetric(seqRate, "seq-msgs/s")
			b.ReportMetric(async, "raw-async-msgs/s")
			b.ReportMetric(batch, "raw-batch-msgs/s")
			b.ReportMetric(seqRate/async, "seq/raw-async")
			b.ReportMetric(seqRate/batch, "seq/raw-batch")
			b.ReportMetric(0, "ns/op")
		})
	}
}

const benchGoroutines = 64

var payload1K = make([]byte, 1024)

// benchSequencer opens a writer of a backend with opts on PChannel
// name<window>-0 and returns a path appending n messages through it from
// 64 goroutines, each with up to window appends in flight, and a func
// logging the writer's counters.
func benchSequencer(b *testing.B, nc *nats.Conn, opts jetstream.Options, name string, window int) (func(n int) time.Duration, func()) {
	codec, err := messages.NewCodec("bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	be, err := jetstream.New(nc, codec, opts)
	if err != nil {
		b.Fatal(err)
	}
	p, _ := streamwal.NewPChannel(fmt.Sprintf("%s%d", name, window), 0)
	v, _ := p.VChannel(1, 0)
	ctx := context.Background()
	w, err := be.OpenWriter(ctx, p, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = w.Close() })
	run := func(n int) time.Duration {
		msgs := make([]*messages.MutableMessage, n)
		for i := range msgs {
			if msgs[i], err = codec.New(messages.TypeInsert, v, payload1K); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		var wg sync.WaitGroup
		for g := 0; g < benchGoroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var pending []*jetstream.AppendFuture
				for i := g; i < n || len(pending) > 0; i += benchGoroutines {
					if i < n {
						pending = append(pending, w.AppendAsync(ctx, msgs[i]))
					}
					if len(pending) == window || i >= n {
						if _, err := pending[0].Wait(ctx); err != nil {
							b.Error(err)
							return
						}
						pending = pending[1:]
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	stats := func() {
		st := w.Stats()
		b.Logf("sequencer: %d units, %d atomic batches, %d messages, %d recoveries", st.Units, st.Batches, st.Messages, st.Recoveries)
	}
	return run, stats
}

// rawStream creates a bare stream like the backend's, with replicas.
func rawStream(b *testing.B, js njs.JetStream, name string, replicas int) string {
	_, err := js.CreateStream(context.Background(), njs.StreamConfig{
		Name: name, Subjects: []string{name + ".>"}, Storage: njs.FileStorage, Replicas: replicas,
		AllowAtomicPublish: true, AllowDirect: true, Duplicates: 2 * time.Minute,
	})
	if err != nil {
		b.Fatal(err)
	}
	return name + ".x"
}

// benchRawAsync returns a path publishing n messages asynchronously from
// one goroutine (4096 pending) to a stream of replicas.
func benchRawAsync(b *testing.B, nc *nats.Conn, replicas int) func(n int) time.Duration {
	js, err := njs.New(nc, njs.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	subj := rawStream(b, js, fmt.Sprint("RAWASYNC", replicas), replicas)
	return func(n int) time.Duration {
		start := time.Now()
		for i := 0; i < n; i++ {
			if _, err := js.PublishMsgAsync(rawMessage(subj), njs.WithStallWait(time.Minute)); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("async publishes did not complete")
		}
		return time.Since(start)
	}
}

// benchRawBatch returns a path publishing n messages as atomic batches of
// 1000, one at a time, each conditioned on the expected last sequence.
func benchRawBatch(b *testing.B, nc *nats.Conn) func(n int) time.Duration {
	js, err := njs.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	subj := rawStream(b, js, "RAWBATCH", 1)
	var last uint64
	return func(n int) time.Duration {
		return rawBatches(b, js, subj, &last, n)
	}
}

// rawBatches publishes n messages as atomic batches of 1000 after *last,
// which it advances.
func rawBatches(b *testing.B, js njs.JetStream, subj string, last *uint64, n int) time.Duration {
	ctx := context.Background()
	start := time.Now()
	for done := 0; done < n; {
		size := min(1000, n-done)
		batch := make([]*nats.Msg, size)
		for i := range batch {
			batch[i] = rawMessage(subj)
		}
		batch[0].Header.Set(njs.ExpectedLastSeqHeader, fmt.Sprint(*last))
		ack, err := jetstreamext.PublishMsgBatch(ctx, js, batch)
		if err != nil {
			b.Fatal(err)
		}
		*last = ack.Sequence
		done += size
	}
	return time.Since(start)
}

// walHeader is the header of an insert as the sequencer writes it (without
// the message ID, set per message).
var walHeader = func() nats.Header {
	codec, err := messages.NewCodec("bench", nil)
	if err != nil {
		panic(err)
	}
	p, _ := streamwal.NewPChannel("raw", 0)
	v, _ := p.VChannel(1, 0)
	m, err := codec.New(messages.TypeInsert, v, payload1K)
	if err != nil {
		panic(err)
	}
	m.SetTerm(1) // the writer adds the term; the rest is as benchSequencer's
	nm, err := codec.Encode(m)
	if err != nil {
		panic(err)
	}
	return nm.Header
}()

// rawMessage is an insert for a raw stream: the sequencer's payload and
// headers under subject, with a fresh message ID.
func rawMessage(subj string) *nats.Msg {
	h := make(nats.Header, len(walHeader)+1)
	for k, v := range walHeader {
		h[k] = v
	}
	h.Set(nats.MsgIdHdr, nuid.Next())
	return &nats.Msg{Subject: subj, Data: payload1K, Header: h}
}
