package jetstream_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/internal/rotate"
	"github.com/streamwal/streamwal/jetstream"
)

// BenchmarkAppendReplicas measures one writer on a three-server cluster
// at 3 replicas (one fenced unit in flight, gathering every waiting
// append, and lone appends behind it),
// beside raw asynchronous publishes to an R3 stream on the same cluster,
// with the same publishes in flight, in rotating rounds of the same run:
// 1 KiB messages from 64 goroutines, each with up to window appends in
// flight.
//
//	go test -run '^$' -bench BenchmarkAppendReplicas -benchtime 30000x ./jetstream/
func BenchmarkAppendReplicas(b *testing.B) {
	for _, window := range []int{1, 32, 256} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) {
			cl := embedded.StartTestCluster(b)
			nc, err := cl.Connect()
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			seq, stats := benchSequencer(b, nc, jetstream.Options{Replicas: 3}, "r3seq", window)
			paths := []func(n int) time.Duration{seq, benchRawWindow(b, nc, 3, window)}
			const rounds = 3
			per := max(b.N/rounds, 1000)
			b.ResetTimer()
			took := rotate.Rounds(paths, rounds, per)
			b.StopTimer()
			stats()
			rate := func(d time.Duration) float64 { return rotate.Rate(rounds*per, d) }
			seqRate, async := rate(took[0]), rate(took[1])
			b.ReportMetric(seqRate, "seq-msgs/s")
			b.ReportMetric(async, "raw-async-msgs/s")
			b.ReportMetric(seqRate/async, "seq/raw-async")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// benchRawWindow returns a path publishing n messages asynchronously to a
// stream of replicas from 64 goroutines, each with up to window publishes
// pending, as benchSequencer appends.
func benchRawWindow(b *testing.B, nc *nats.Conn, replicas, window int) func(n int) time.Duration {
	js, err := njs.New(nc, njs.WithPublishAsyncMaxPending(1<<16))
	if err != nil {
		b.Fatal(err)
	}
	subj := rawStream(b, js, fmt.Sprint("RAWWINDOW", replicas), replicas)
	return func(n int) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for g := range benchGoroutines {
			wg.Go(func() {
				var pending []njs.PubAckFuture
				for i := g; i < n || len(pending) > 0; i += benchGoroutines {
					if i < n {
						f, err := js.PublishMsgAsync(rawMessage(subj))
						if err != nil {
							b.Error(err)
							return
						}
						pending = append(pending, f)
					}
					if len(pending) == window || i >= n {
						select {
						case <-pending[0].Ok():
						case err := <-pending[0].Err():
							b.Error(err)
							return
						}
						pending = pending[1:]
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
}
