package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/internal/rotate"
	"github.com/streamwal/streamwal/messages"
)

// readReopen is how many inserts a reopening reader reads before it opens
// a new scanner, as `streamwal bench`'s read workload does.
const readReopen = 2000

// BenchmarkRead measures reads through the client beside bare ordered
// consumers of the same stored messages with the same filters (the
// VChannel's subjects in its PChannel's stream, which decode nothing), on
// one embedded server with 16 PChannels, one collection on each and b.N
// 1 KiB inserts (at least readReopen) preloaded on each VChannel. Two
// shapes, all 16 VChannels at once: whole, one reader per VChannel from
// the start to its last insert; and reopen, one reader per VChannel that
// reads readReopen inserts from the start and opens a new scanner, until
// it has read b.N. Each path runs once in each of four rounds, in a
// rotating order, and reports its inserts over its total time; whole/raw
// and reopen/raw are the ratios.
//
//	go test -run '^$' -bench BenchmarkRead -benchtime 5000x ./integration/
func BenchmarkRead(b *testing.B) {
	s := startBenchSystem(b, "bench", false)
	c := benchClient(b, s, client.WithoutLocalBypass())
	vs := benchCollections(b, c, 16)
	n := max(b.N, readReopen)
	benchPreload(b, c, vs, n)
	js, err := njs.New(s.Conn())
	if err != nil {
		b.Fatal(err)
	}
	whole := func(read readerOpen) func(int) time.Duration {
		return func(n int) time.Duration { return benchReadAll(b, vs, n, n, read) }
	}
	reopen := func(read readerOpen) func(int) time.Duration {
		return func(n int) time.Duration { return benchReadAll(b, vs, n, readReopen, read) }
	}
	client, raw := clientReader(c), rawReader(js)
	const rounds = 4
	b.ResetTimer()
	took := rotate.Rounds([]func(int) time.Duration{whole(client), whole(raw), reopen(client), reopen(raw)}, rounds, n)
	b.StopTimer()
	rate := func(d time.Duration) float64 { return rotate.Rate(rounds*n*len(vs), d) }
	b.ReportMetric(rate(took[0]), "whole-msgs/s")
	b.ReportMetric(rate(took[1]), "raw-whole-msgs/s")
	b.ReportMetric(rate(took[2]), "reopen-msgs/s")
	b.ReportMetric(rate(took[3]), "raw-reopen-msgs/s")
	b.ReportMetric(took[1].Seconds()/took[0].Seconds(), "whole/raw")
	b.ReportMetric(took[3].Seconds()/took[2].Seconds(), "reopen/raw")
	b.ReportMetric(0, "ns/op")
}

// benchPreload appends n 1 KiB inserts to each of vs, in batches of 1000.
func benchPreload(b *testing.B, c *client.Client, vs []streamwal.VChannel, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, v := range vs {
		for done := 0; done < n; {
			batch := make([]*messages.MutableMessage, min(1000, n-done))
			for i := range batch {
				m, err := c.Codec().New(messages.TypeInsert, v, benchPayload)
				if err != nil {
					b.Fatal(err)
				}
				batch[i] = m
			}
			if _, err := c.Append(ctx, batch...); err != nil {
				b.Fatal(err)
			}
			done += len(batch)
		}
	}
}

// readerOpen opens a reader of v's inserts from the start: next returns
// once it has read the next insert.
type readerOpen func(ctx context.Context, v streamwal.VChannel) (next func() error, stop func(), err error)

// clientReader reads v's inserts through the client's read pipeline.
func clientReader(c *client.Client) readerOpen {
	return func(ctx context.Context, v streamwal.VChannel) (func() error, func(), error) {
		s, err := c.Read(ctx, client.ReadOptions{VChannel: v, Start: client.Earliest(), Types: []*messages.Type{messages.TypeInsert}})
		if err != nil {
			return nil, nil, err
		}
		next := func() error { _, err := s.Next(ctx); return err }
		return next, func() { _ = s.Close() }, nil
	}
}

// rawReader reads v's subjects in its PChannel's stream with a bare
// ordered consumer, the filters the read pipeline uses, and skips what is
// not an insert by its subject (the PChannel-level messages and the
// collection's control messages, which the pipeline reads and skips too).
func rawReader(js njs.JetStream) readerOpen {
	cl := streamwal.Cluster("bench")
	return func(ctx context.Context, v streamwal.VChannel) (func() error, func(), error) {
		cons, err := js.OrderedConsumer(ctx, cl.StreamName(v.PChannel()), njs.OrderedConsumerConfig{FilterSubjects: cl.VChannelFilter(v)})
		if err != nil {
			return nil, nil, err
		}
		it, err := cons.Messages()
		if err != nil {
			return nil, nil, err
		}
		insert := cl.VChannelSubject(v, messages.TypeInsert.Token)
		next := func() error {
			for {
				m, err := it.Next(njs.NextContext(ctx))
				if err != nil || m.Subject() == insert {
					return err
				}
			}
		}
		return next, it.Stop, nil
	}
}

// benchReadAll reads n inserts of every VChannel of vs at once, one reader
// each that opens a new scanner after every `per` inserts, and returns how
// long that took.
func benchReadAll(b *testing.B, vs []streamwal.VChannel, n, per int, open readerOpen) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for _, v := range vs {
		wg.Go(func() {
			if err := benchReadOne(ctx, v, n, per, open); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// benchReadOne reads n inserts of v, opening a new reader after every
// `per`.
func benchReadOne(ctx context.Context, v streamwal.VChannel, n, per int, open readerOpen) error {
	for read := 0; read < n; {
		next, stop, err := open(ctx, v)
		if err != nil {
			return fmt.Errorf("open %s: %w", v, err)
		}
		for i := 0; i < per && read < n; i++ {
			if err := next(); err != nil {
				stop()
				return fmt.Errorf("read %s after %d: %w", v, read, err)
			}
			read++
		}
		stop()
	}
	return nil
}
