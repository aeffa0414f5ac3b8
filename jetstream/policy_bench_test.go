package jetstream_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/internal/rotate"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// BenchmarkAppendPolicy measures the unit policy of a group-committing
// writer (Options.PlainUpTo) on one PChannel of a server that fsyncs
// before every ack: 1 KiB appends from 1 to 64 callers that each wait for
// their append, through a writer that always batches what waits
// (PlainUpTo -1), writers that send a short queue as plain publishes
// (PlainUpTo 4 and 8), and raw synchronous publishes from as many
// callers, in rotating rounds. It reports each path's msgs/s and the writers' ratios
// to raw:
//
//	go test -run '^$' -bench BenchmarkAppendPolicy -benchtime 6000x ./jetstream/
func BenchmarkAppendPolicy(b *testing.B) {
	srv := embedded.StartTest(b, func(o *embedded.Options) { o.SyncAlways = true })
	nc, err := srv.Connect()
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	runs := 0 // each run opens PChannels and streams of its own
	for _, callers := range []int{1, 2, 4, 8, 16, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			runs++
			paths := []func(n int) time.Duration{
				policyWriter(b, nc, jetstream.Options{GroupCommit: true, PlainUpTo: -1}, fmt.Sprintf("batch%d", runs), callers),
				policyWriter(b, nc, jetstream.Options{GroupCommit: true, PlainUpTo: 4}, fmt.Sprintf("plainfour%d", runs), callers),
				policyWriter(b, nc, jetstream.Options{GroupCommit: true, PlainUpTo: 8}, fmt.Sprintf("plaineight%d", runs), callers),
				policyRawSync(b, nc, fmt.Sprintf("RAWSYNC%d", runs), callers),
			}
			const rounds = 3
			per := max(b.N/rounds, 300)
			b.ResetTimer()
			took := rotate.Rounds(paths, rounds, per)
			rate := func(d time.Duration) float64 { return rotate.Rate(rounds*per, d) }
			batch, plain4, plain8, raw := rate(took[0]), rate(took[1]), rate(took[2]), rate(took[3])
			b.StopTimer()
			b.ReportMetric(batch, "batch-msgs/s")
			b.ReportMetric(plain4, "plain4-msgs/s")
			b.ReportMetric(plain8, "plain8-msgs/s")
			b.ReportMetric(raw, "raw-sync-msgs/s")
			b.ReportMetric(batch/raw, "batch/raw")
			b.ReportMetric(plain4/raw, "plain4/raw")
			b.ReportMetric(plain8/raw, "plain8/raw")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// policyWriter returns a path appending n messages through a writer with
// opts from callers goroutines, each waiting for its append.
func policyWriter(b *testing.B, nc *nats.Conn, opts jetstream.Options, name string, callers int) func(n int) time.Duration {
	codec, err := messages.NewCodec("bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	be, err := jetstream.New(nc, codec, opts)
	if err != nil {
		b.Fatal(err)
	}
	p, _ := streamwal.NewPChannel(name, 0)
	v, _ := p.VChannel(1, 0)
	ctx := context.Background()
	w, err := be.OpenWriter(ctx, p, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = w.Close() })
	return func(n int) time.Duration {
		return eachCaller(n, callers, func() error {
			m, err := codec.New(messages.TypeInsert, v, payload1K)
			if err == nil {
				_, err = w.Append(ctx, m)
			}
			return err
		}, b)
	}
}

// policyRawSync returns a path publishing n messages synchronously from
// callers goroutines.
func policyRawSync(b *testing.B, nc *nats.Conn, name string, callers int) func(n int) time.Duration {
	js, err := njs.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	subj := rawStream(b, js, name, 1)
	return func(n int) time.Duration {
		return eachCaller(n, callers, func() error {
			_, err := js.PublishMsg(context.Background(), rawMessage(subj))
			return err
		}, b)
	}
}

// eachCaller runs n calls of fn spread over callers goroutines and
// returns how long they took.
func eachCaller(n, callers int, fn func() error, b *testing.B) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := g; i < n; i += callers {
				if err := fn(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}
