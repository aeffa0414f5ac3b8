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
	remote := benchClient(b, s, client.WithoutLocalBypass())
	local := benchClient(b, s)
	vs := benchCollections(b, remote, 16)
	n := max(b.N, 2000)
	b.ResetTimer()
	rRemote := benchClientAppend(b, remote, vs, n)
	rLocal := benchClientAppend(b, local, vs, n)
	rBatch := benchRawBatches(b, s.Conn(), n)
	rRead := benchClientRead(b, remote, vs[0])
	rRawRead := benchRawRead(b, s.Conn(), "RAWBATCH")
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
				if len(window) == 32 || i >= n {
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

// benchClientRead reads a VChannel from the start to its current end.
func benchClientRead(b *testing.B, c *client.Client, v streamwal.VChannel) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	end, err := c.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var last messages.MessageID
	for _, ch := range end.Channels {
		if ch.PChannel == v.PChannel().String() {
			last = ch.LastID
		}
	}
	s, err := c.Read(ctx, client.ReadOptions{VChannel: v, Start: read.Earliest(), Types: []*messages.Type{messages.TypeInsert, messages.TypeTimeTick}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	start, count := time.Now(), 0
	for m, err := range s.All(ctx) {
		if err != nil {
			b.Fatal(err)
		}
		count++
		if m.ID() >= last {
			break
		}
	}
	return float64(count) / time.Since(start).Seconds()
}

// benchRawRead reads a raw stream with an ordered consumer.
func benchRawRead(b *testing.B, nc *nats.Conn, stream string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := njs.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		b.Fatal(err)
	}
	total := st.CachedInfo().State.Msgs
	cons, err := js.OrderedConsumer(ctx, stream, njs.OrderedConsumerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages()
	if err != nil {
		b.Fatal(err)
	}
	defer it.Stop()
	start := time.Now()
	for range total {
		if _, err := it.Next(njs.NextContext(ctx)); err != nil {
			b.Fatal(err)
		}
	}
	return float64(total) / time.Since(start).Seconds()
}
