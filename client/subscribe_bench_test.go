package client_test

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
)

// benchMessages is the VChannel's length in BenchmarkSubscribeVsRead.
const benchMessages = 20_000

// BenchmarkSubscribeVsRead reads one VChannel of benchMessages inserts
// of 256 bytes side by side, each iteration both ways: a plain Read to
// now, and a new durable subscription from the earliest message that
// acknowledges every 100 messages. It reports both rates and their ratio
// (subscribe/read; issue 18's target is at least 0.8).
//
//	go test -run '^$' -bench BenchmarkSubscribeVsRead -benchtime 5x ./client/
func BenchmarkSubscribeVsRead(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, err := system.Start(ctx, system.Options{ServerOptions: embedded.Options{StoreDir: b.TempDir()},
		Coord: coord.Config{PChannels: 1}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.WaitServing(ctx, false); err != nil {
		b.Fatal(err)
	}
	c, err := client.New(s.Conn(), client.WithLocal(s.Local()))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "bench", Name: "subscribe", ID: 1})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 256)
	for i := 0; i < benchMessages; i += 1000 {
		batch := make([][]byte, 1000)
		for j := range batch {
			batch[j] = payload
		}
		if _, err := c.AppendBytes(ctx, vs[0], batch...); err != nil {
			b.Fatal(err)
		}
	}
	types := []*messages.Type{messages.TypeInsert}
	var readTime, subTime time.Duration
	b.ResetTimer()
	for i := range b.N {
		began := time.Now()
		if n := benchRead(b, ctx, c, client.ReadOptions{VChannel: vs[0], Types: types, UntilNow: true}); n != benchMessages {
			b.Fatalf("read %d messages, want %d", n, benchMessages)
		}
		readTime += time.Since(began)
		began = time.Now()
		benchSubscribe(b, ctx, c, fmt.Sprintf("bench-%d", i), client.SubscribeVChannel(vs[0]), client.SubscribeTypes(types...))
		subTime += time.Since(began)
	}
	b.StopTimer()
	total := float64(b.N * benchMessages)
	b.ReportMetric(total/readTime.Seconds(), "read-msgs/s")
	b.ReportMetric(total/subTime.Seconds(), "subscribe-msgs/s")
	b.ReportMetric(readTime.Seconds()/subTime.Seconds(), "subscribe/read")
}

// benchRead reads to the end and counts.
func benchRead(b *testing.B, ctx context.Context, c *client.Client, o client.ReadOptions) int {
	s, err := c.Read(ctx, o)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	n := 0
	for {
		_, err := s.Next(ctx)
		if err == io.EOF {
			return n
		}
		if err != nil {
			b.Fatal(err)
		}
		n++
	}
}

// benchSubscribe takes benchMessages deliveries of a new subscription,
// acknowledging every 100th.
func benchSubscribe(b *testing.B, ctx context.Context, c *client.Client, name string, opts ...client.SubscribeOption) {
	sub, err := c.Subscribe(ctx, name, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	for n := 1; n <= benchMessages; n++ {
		d, err := sub.Next(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if n%100 == 0 {
			if err := d.Ack(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
}
