package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/internal/rotate"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// BenchmarkReadAcrossArchive reads N messages of 1 KiB from Earliest, on
// one embedded file-storage server in the same run: from a stream that
// holds them all (stream-only) and from one truncated at N/2 with Archive
// on, so that the first half comes from archived objects and the second
// from the stream (crossing). The two reads alternate over four rounds;
// it reports msgs/s of each (its messages over its total time) and the
// crossing read's ratio to the stream-only read:
//
//	go test -run '^$' -bench BenchmarkReadAcrossArchive -benchtime 100000x ./jetstream/
func BenchmarkReadAcrossArchive(b *testing.B) {
	srv := embedded.StartTest(b)
	nc, err := srv.Connect()
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	codec, err := messages.NewCodec("bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	be, err := jetstream.New(nc, codec, jetstream.Options{Archive: true})
	if err != nil {
		b.Fatal(err)
	}
	n := max(b.N, 20000)
	ctx := context.Background()
	plain, _ := streamwal.NewPChannel("plain", 0)
	tiered, _ := streamwal.NewPChannel("tiered", 0)
	fill(b, be, plain, n)
	fill(b, be, tiered, n)
	if err := be.Truncate(ctx, tiered, messages.MessageID(n/2)); err != nil {
		b.Fatal(err)
	}
	if st, err := be.State(ctx, tiered); err != nil || st.ArchivedBelow != messages.MessageID(n/2) {
		b.Fatalf("state after truncation: %+v, %v", st, err)
	}
	const rounds = 4
	read := func(p streamwal.PChannel) func(int) time.Duration {
		return func(n int) time.Duration { return readAll(b, be, p, n) }
	}
	b.ResetTimer()
	took := rotate.Rounds([]func(int) time.Duration{read(plain), read(tiered)}, rounds, n)
	b.StopTimer()
	rate := func(d time.Duration) float64 { return rotate.Rate(rounds*n, d) }
	b.ReportMetric(rate(took[0]), "stream-msgs/s")
	b.ReportMetric(rate(took[1]), "crossing-msgs/s")
	b.ReportMetric(rate(took[1])/rate(took[0]), "crossing/stream")
	b.ReportMetric(0, "ns/op")
}

// fill opens p and appends n-1 messages of 1 KiB after its barrier.
func fill(b *testing.B, be *jetstream.JetStream, p streamwal.PChannel, n int) {
	ctx := context.Background()
	w, err := be.OpenWriter(ctx, p, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	v, _ := p.VChannel(1, 0)
	var pending []*jetstream.AppendFuture
	for i := 1; i < n; i++ {
		m, err := be.Codec().New(messages.TypeInsert, v, payload1K)
		if err != nil {
			b.Fatal(err)
		}
		pending = append(pending, w.AppendAsync(ctx, m))
		if len(pending) == 256 || i == n-1 {
			for _, f := range pending {
				if _, err := f.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
			pending = pending[:0]
		}
	}
}

// readAll reads p from Earliest through message n and returns the time.
func readAll(b *testing.B, be *jetstream.JetStream, p streamwal.PChannel, n int) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	sc, err := be.Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sc.Close() }()
	want := messages.MessageID(1)
	for m, err := range sc.All(ctx) {
		if err != nil {
			b.Fatal(err)
		}
		if m.ID() != want {
			b.Fatalf("read %s: message %d, want %d", p, m.ID(), want)
		}
		if want++; int(want) > n {
			break
		}
	}
	return time.Since(start)
}
