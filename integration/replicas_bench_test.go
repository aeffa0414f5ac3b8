package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/internal/rotate"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
)

// BenchmarkClientReplicas measures client appends on a three-server
// JetStream cluster with every stream and bucket at 3 replicas (the
// servers' default sync, as a NATS cluster runs: an append is acknowledged
// once a quorum stored it), beside raw JetStream on the same cluster at 3
// replicas in the same run: 1 KiB messages from 64 goroutines, each with
// up to window appends in flight, through a remote node and through the
// local bypass, against raw asynchronous publishes with the same appends
// in flight spread over 16 R3 streams configured as PChannels (one per
// PChannel, every message what the client stores for an insert). The
// three paths alternate over three rounds; it reports the rates,
// remote/raw and local/raw:
//
//	go test -run '^$' -bench BenchmarkClientReplicas -benchtime 60000x ./integration/
func BenchmarkClientReplicas(b *testing.B) {
	for _, window := range []int{1, 32, 256} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) { benchReplicasRun(b, window) })
	}
}

// benchReplicasRun is one run of BenchmarkClientReplicas on a fresh
// cluster.
func benchReplicasRun(b *testing.B, window int) {
	ctx := context.Background()
	cl := embedded.StartTestCluster(b)
	s, err := system.Start(ctx, system.Options{Cluster: "bench", Server: cl.Servers()[0],
		Coord: coord.Config{Replicas: 3},
		Node:  node.Config{Recovery: node.RecoveryOptions{Replicas: 3}, Backend: jetstream.Options{Replicas: 3}}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.WaitServing(ctx, false); err != nil {
		b.Fatal(err)
	}
	remote := benchClient(b, s, client.WithoutLocalBypass())
	local := benchClient(b, s)
	vs := benchCollections(b, remote, 16)
	raw := newRawStreams(b, s.Conn(), remote.Codec(), vs)
	paths := []func(n int) time.Duration{
		func(n int) time.Duration { return raw.publish(window, n) },
		func(n int) time.Duration { return benchClientAppend(b, remote, vs, window, n) },
		func(n int) time.Duration { return benchClientAppend(b, local, vs, window, n) },
	}
	const rounds = 3
	per := max(b.N/rounds, 1000)
	b.ResetTimer()
	took := rotate.Rounds(paths, rounds, per)
	b.StopTimer()
	rate := func(d time.Duration) float64 { return rotate.Rate(rounds*per, d) }
	rRaw, rRemote, rLocal := rate(took[0]), rate(took[1]), rate(took[2])
	b.ReportMetric(rRemote, "remote-msgs/s")
	b.ReportMetric(rLocal, "local-msgs/s")
	b.ReportMetric(rRaw, "raw-async-msgs/s")
	b.ReportMetric(rRemote/rRaw, "remote/raw-async")
	b.ReportMetric(rLocal/rRaw, "local/raw-async")
	b.ReportMetric(0, "ns/op")
}

// rawStreams are R3 streams configured as PChannels, one per VChannel's
// PChannel, published to asynchronously.
type rawStreams struct {
	b       *testing.B
	js      njs.JetStream
	header  nats.Header
	streams int
}

// newRawStreams creates one R3 stream per VChannel of vs; its messages
// look like the inserts the client stores.
func newRawStreams(b *testing.B, nc *nats.Conn, codec *messages.Codec, vs []streamwal.VChannel) *rawStreams {
	js, err := njs.New(nc, njs.WithPublishAsyncMaxPending(1<<16))
	if err != nil {
		b.Fatal(err)
	}
	for i := range vs {
		if _, err := js.CreateStream(context.Background(), njs.StreamConfig{Name: fmt.Sprint("RAWR3_", i), Subjects: []string{fmt.Sprint("RAWR3.", i, ".>")},
			Storage: njs.FileStorage, Replicas: 3, AllowDirect: true, Duplicates: 2 * time.Minute}); err != nil {
			b.Fatal(err)
		}
	}
	return &rawStreams{b: b, js: js, header: storedHeader(b, codec, vs[0], 1), streams: len(vs)}
}

// publish sends n messages from 64 goroutines, each with up to window
// asynchronous publishes in flight, round robin over the streams, and
// returns how long that took.
func (r *rawStreams) publish(window, n int) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			var pending []njs.PubAckFuture
			for i := g; i < n || len(pending) > 0; i += 64 {
				if i < n {
					f, err := r.js.PublishMsgAsync(storedMsg(r.header, fmt.Sprint("RAWR3.", i%r.streams, ".x")))
					if err != nil {
						r.b.Error(err)
						return
					}
					pending = append(pending, f)
				}
				if len(pending) == window || i >= n {
					select {
					case <-pending[0].Ok():
					case err := <-pending[0].Err():
						r.b.Error(err)
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
