package integration

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
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
)

// BenchmarkClient measures, on one embedded server with SyncAlways and a
// cluster of 16 PChannels (one collection on each), client appends of
// 1 KiB messages from 64 goroutines, each keeping up to 32 appends in
// flight (AppendAsync), through a remote node (NATS) and through the local
// bypass, beside raw JetStream atomic batches of 1000 on the same server;
// and reading one VChannel through the client beside a raw ordered
// consumer of the same number of messages:
//
//	go test -run '^$' -bench BenchmarkClient -benchtime 20000x ./integration/
func BenchmarkClient(b *testing.B) {
	ctx := context.Background()
	s, err := system.Start(ctx, system.Options{Cluster: "bench",
		ServerOptions: embedded.Options{StoreDir: b.TempDir(), SyncAlways: true}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.WaitServing(ctx, false); err != nil {
		b.Fatal(err)
	}
	remote := benchClient(b, s, client.WithoutLocalBypass(), client.WithMaxBatch(512))
	local := benchClient(b, s, client.WithMaxBatch(512))
	vs := benchCollections(b, remote, 16)
	n := max(b.N, 2000)
	b.ResetTimer()
	rRemote := benchClientAppend(b, remote, vs, n)
	rLocal := benchClientAppend(b, local, vs, n)
	rBatch := benchRawBatches(b, s.Conn(), n)
	rRead, counts := benchClientReads(b, remote, vs)
	rRawRead := benchRawReads(b, s.Conn(), vs, counts)
	b.StopTimer()
	b.ReportMetric(rRemote, "remote-msgs/s")
	b.ReportMetric(rLocal, "local-msgs/s")
	b.ReportMetric(rBatch, "raw-batch-msgs/s")
	b.ReportMetric(rRemote/rBatch, "remote/raw-batch")
	b.ReportMetric(rLocal/rBatch, "local/raw-batch")
	b.ReportMetric(rRead, "read-msgs/s")
	b.ReportMetric(rRawRead, "raw-read-msgs/s")
	b.ReportMetric(rRead/rRawRead, "read/raw-read")
	b.ReportMetric(0, "ns/op")
}

// benchClient connects a client to the system's server.
func benchClient(b *testing.B, s *system.System, opts ...client.Option) *client.Client {
	nc, err := s.Server.Connect()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	c, err := client.New(nc, append([]client.Option{client.WithCluster("bench")}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// benchCollections creates n single-shard collections.
func benchCollections(b *testing.B, c *client.Client, n int) []streamwal.VChannel {
	var vs []streamwal.VChannel
	for i := range n {
		got, err := c.CreateCollection(context.Background(), client.Collection{DBName: "bench", Name: fmt.Sprint(i), ID: int64(i + 1)})
		if err != nil {
			b.Fatal(err)
		}
		vs = append(vs, got...)
	}
	return vs
}

var benchPayload = make([]byte, 1024)

// benchWindow is how many appends each benchmark goroutine keeps in flight:
// 64 goroutines on 16 PChannels keep about 2000 appends in flight on each,
// so that its group commits can fill atomic batches of 1000 as the raw
// path's do.
const benchWindow = 512

// benchClientAppend appends n messages from 64 goroutines.
func benchClientAppend(b *testing.B, c *client.Client, vs []streamwal.VChannel, n int) float64 {
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var window []*client.AppendFuture
			for i := g; i < n || len(window) > 0; i += 64 {
				if i < n {
					m, err := c.Codec().New(messages.TypeInsert, vs[i%len(vs)], benchPayload)
					if err != nil {
						b.Error(err)
						return
					}
					window = append(window, c.AppendAsync(context.Background(), m))
				}
				if len(window) == benchWindow || i >= n {
					if _, err := window[0].Wait(); err != nil {
						b.Error(err)
						return
					}
					window = window[1:]
				}
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}

// benchRawBatches publishes n messages as atomic batches of 1000 to a
// fresh stream.
func benchRawBatches(b *testing.B, nc *nats.Conn, n int) float64 {
	ctx := context.Background()
	js, err := njs.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, njs.StreamConfig{Name: "RAWBATCH", Subjects: []string{"RAWBATCH.>"},
		Storage: njs.FileStorage, AllowAtomicPublish: true}); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for done := 0; done < n; {
		batch := make([]*nats.Msg, min(1000, n-done))
		for i := range batch {
			batch[i] = &nats.Msg{Subject: "RAWBATCH.x", Data: benchPayload, Header: nats.Header{}}
			batch[i].Header.Set(nats.MsgIdHdr, nuid.Next())
		}
		if _, err := jetstreamext.PublishMsgBatch(ctx, js, batch); err != nil {
			b.Fatal(err)
		}
		done += len(batch)
	}
	return float64(n) / time.Since(start).Seconds()
}

// benchClientReads reads every VChannel from the start to its PChannel's
// current end, all at once, one client scanner each, and returns the rate
// and how many messages each read.
func benchClientReads(b *testing.B, c *client.Client, vs []streamwal.VChannel) (float64, []int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	end, err := c.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	last := map[string]messages.MessageID{}
	for _, ch := range end.Channels {
		last[ch.PChannel] = ch.LastID
	}
	return benchReads(vs, func(i int) int {
		s, err := c.Read(ctx, client.ReadOptions{VChannel: vs[i], Start: read.Earliest(), Types: []*messages.Type{messages.TypeInsert, messages.TypeTimeTick}})
		if err != nil {
			b.Error(err)
			return 0
		}
		defer s.Close()
		count := 0
		for m, err := range s.All(ctx) {
			if err != nil {
				b.Error(err)
				return count
			}
			count++
			if m.ID() >= last[vs[i].PChannel().String()] {
				break
			}
		}
		return count
	})
}

// benchRawReads reads, for every VChannel at once, as many messages as
// counts says from its PChannel's stream with a raw ordered consumer
// filtered to the subjects the client reads (the VChannel's own and its
// PChannel's).
func benchRawReads(b *testing.B, nc *nats.Conn, vs []streamwal.VChannel, counts []int) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := njs.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	c := streamwal.Cluster("bench")
	rate, _ := benchReads(vs, func(i int) int {
		cons, err := js.OrderedConsumer(ctx, c.StreamName(vs[i].PChannel()), njs.OrderedConsumerConfig{FilterSubjects: c.VChannelFilter(vs[i])})
		if err != nil {
			b.Error(err)
			return 0
		}
		it, err := cons.Messages()
		if err != nil {
			b.Error(err)
			return 0
		}
		defer it.Stop()
		for n := range counts[i] {
			if _, err := it.Next(njs.NextContext(ctx)); err != nil {
				b.Error(err)
				return n
			}
		}
		return counts[i]
	})
	return rate
}

// benchReads runs read for every VChannel at once and returns the total
// rate and each one's count.
func benchReads(vs []streamwal.VChannel, read func(i int) int) (float64, []int) {
	counts := make([]int, len(vs))
	start := time.Now()
	var wg sync.WaitGroup
	for i := range vs {
		wg.Go(func() { counts[i] = read(i) })
	}
	wg.Wait()
	total := 0
	for _, n := range counts {
		total += n
	}
	return float64(total) / time.Since(start).Seconds(), counts
}
