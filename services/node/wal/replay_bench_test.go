package wal_test

import (
	"context"
	"testing"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/timetick"
	"github.com/streamwal/streamwal/services/node/wal"
)

// BenchmarkReplay measures an open from a checkpoint with a long tail:
// b.N inserts of 1 KiB land after the last checkpoint (the cadence never
// fires during the appends), then a new owner opens and replays them (its
// headers only, see ReadOptions.HeadersOnly). In the same run it reads the
// same messages with a bare backend scanner (an ordered consumer), whole
// ("scan") and headers only ("scan-headers"), and reports the rates,
// replay/scan and replay/scan-headers:
//
//	go test -run '^$' -bench BenchmarkReplay -benchtime 200000x ./services/node/wal/
func BenchmarkReplay(b *testing.B) {
	be, codec := benchBackend(b)
	ctx := context.Background()
	p, _ := streamwal.NewPChannel("replay", 0)
	v, _ := p.VChannel(1, 0)
	store := recovery.NewMemory()
	cfg := func(term uint64, cadence time.Duration) wal.Config {
		return wal.Config{Backend: be, Codec: codec, PChannel: p, Term: term, Oracle: timetick.NewLocalOracle(nil),
			Storage: &wal.Storage{Store: store, Tiers: be, Retain: -1, Cadence: recovery.Cadence{Interval: cadence, Dirty: 1 << 30}}}
	}
	// A first checkpoint, right after the collection exists.
	w, err := wal.Open(ctx, cfg(1, time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	create, _ := codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: "c", CollectionID: 1}, VChannels: []string{v.String()}})
	if _, err := w.Append(ctx, create); err != nil {
		b.Fatal(err)
	}
	_ = w.Close()
	// The tail: b.N inserts after that checkpoint, never checkpointed
	// (the WAL is abandoned without its final round by failing it).
	n := max(b.N, 1000)
	w, err = wal.Open(ctx, cfg(2, time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	from := w.Barrier().ID()
	msgs := benchInserts(b, codec, v, n)
	benchRun(b, n, func(i int) error {
		_, err := w.Append(ctx, msgs[i])
		return err
	})
	last := from + messages.MessageID(n)
	b.ResetTimer()
	scanned := benchScan(b, be, p, jetstream.ReadOptions{Start: jetstream.From(from)}, last)
	headers := benchScan(b, be, p, jetstream.ReadOptions{Start: jetstream.From(from), HeadersOnly: true}, last)
	start := time.Now()
	w3, err := wal.Open(ctx, cfg(3, time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	r := w3.Recovered()
	took := time.Since(start)
	b.StopTimer()
	_ = w3.Close()
	_ = w.Close()
	if r.Replayed < n {
		b.Fatalf("replayed %d messages, want at least %d", r.Replayed, n)
	}
	replay := float64(r.Replayed) / took.Seconds()
	b.ReportMetric(replay, "replay-msgs/s")
	b.ReportMetric(scanned, "scan-msgs/s")
	b.ReportMetric(headers, "scan-headers-msgs/s")
	b.ReportMetric(replay/scanned, "replay/scan")
	b.ReportMetric(replay/headers, "replay/scan-headers")
	b.ReportMetric(0, "ns/op")
}

// benchScan reads p with opts through last with a bare scanner and
// returns the rate.
func benchScan(b *testing.B, be jetstream.Backend, p streamwal.PChannel, opts jetstream.ReadOptions, last messages.MessageID) float64 {
	ctx := context.Background()
	start := time.Now()
	sc, err := be.Read(ctx, p, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer sc.Close()
	count := 0
	for m, err := range sc.All(ctx) {
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
