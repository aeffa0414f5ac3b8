package wal_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/internal/rotate"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/timetick"
	"github.com/streamwal/streamwal/services/node/wal"
)

// BenchmarkChain appends 1 KiB inserts from 64 goroutines, each waiting
// for every append, through the whole WAL (lock, lifecycle and txn
// interceptors, TimeTicks, LastConfirmed, sync loop), through the WAL with
// recovery storage and shard management on (checkpoints to a memory
// store, segments of the default capacity), and, on the same embedded
// server in the same run, through the bare sequencer (a backend writer).
// It reports the rates, chain/bare and storage/chain:
//
//	go test -run '^$' -bench BenchmarkChain -benchtime 100000x ./services/node/wal/
func BenchmarkChain(b *testing.B) {
	be, codec := benchBackend(b)
	n := max(b.N, 2000)
	chainWAL := openBenchWAL(b, be, codec, "chain", nil)
	defer chainWAL.Close()
	storedWAL := openBenchWAL(b, be, codec, "stored", &wal.Storage{Store: recovery.NewMemory(), Tiers: be})
	defer storedWAL.Close()
	path := func(w *wal.WAL) func(k int) time.Duration {
		return func(k int) time.Duration { return benchWAL(b, w, codec, k) }
	}
	b.ResetTimer()
	// In many short rounds, alternating which goes first, so that neither
	// gains from running on a fresher server and a burst of load from
	// elsewhere on the machine falls on both alike.
	const rounds = 16
	took := rotate.Rounds([]func(int) time.Duration{path(chainWAL), path(storedWAL)}, rounds, n/rounds)
	chain, stored := rotate.Rate(n/rounds*rounds, took[0]), rotate.Rate(n/rounds*rounds, took[1])
	bare := rotate.Rate(n, benchBare(b, be, codec, n))
	b.StopTimer()
	b.ReportMetric(chain, "chain-msgs/s")
	b.ReportMetric(stored, "storage-msgs/s")
	b.ReportMetric(bare, "bare-msgs/s")
	b.ReportMetric(chain/bare, "chain/bare")
	b.ReportMetric(stored/chain, "storage/chain")
	b.ReportMetric(0, "ns/op")
}

// benchBackend starts a server for b and returns an archiving backend on
// it, and its codec; both are closed with b.
func benchBackend(b *testing.B) (*jetstream.JetStream, *messages.Codec) {
	srv := embedded.StartTest(b)
	nc, err := srv.Connect()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	codec, err := messages.NewCodec("bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	be, err := jetstream.New(nc, codec, jetstream.Options{Archive: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	return be, codec
}

const benchGoroutines = 64

var payload1K = make([]byte, 1024)

// openBenchWAL opens the WAL of PChannel name with its collection, with
// recovery storage and shard management when storage is not nil.
func openBenchWAL(b *testing.B, be jetstream.Backend, codec *messages.Codec, name string, storage *wal.Storage) *wal.WAL {
	ctx := context.Background()
	p, _ := streamwal.NewPChannel(name, 0)
	v, _ := p.VChannel(1, 0)
	w, err := wal.Open(ctx, wal.Config{Backend: be, Codec: codec, PChannel: p, Term: 1, Oracle: timetick.NewLocalOracle(nil), Storage: storage})
	if err != nil {
		b.Fatal(err)
	}
	create, err := codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: "c", CollectionID: 1}, VChannels: []string{v.String()}})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := w.Append(ctx, create); err != nil {
		b.Fatal(err)
	}
	return w
}

// benchWAL appends n inserts through w and returns the time it took.
func benchWAL(b *testing.B, w *wal.WAL, codec *messages.Codec, n int) time.Duration {
	ctx := context.Background()
	v, _ := w.PChannel().VChannel(1, 0)
	msgs := benchInserts(b, codec, v, n)
	return benchRun(b, n, func(i int) error {
		_, err := w.Append(ctx, msgs[i])
		return err
	})
}

// benchBare appends n inserts through a backend writer and returns the
// time it took.
func benchBare(b *testing.B, be jetstream.Backend, codec *messages.Codec, n int) time.Duration {
	ctx := context.Background()
	p, _ := streamwal.NewPChannel("bare", 0)
	v, _ := p.VChannel(1, 0)
	w, err := be.OpenWriter(ctx, p, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	msgs := benchInserts(b, codec, v, n)
	return benchRun(b, n, func(i int) error {
		_, err := w.Append(ctx, msgs[i])
		return err
	})
}

// benchInserts builds n inserts on v.
func benchInserts(b *testing.B, codec *messages.Codec, v streamwal.VChannel, n int) []*messages.MutableMessage {
	msgs := make([]*messages.MutableMessage, n)
	for i := range msgs {
		var err error
		if msgs[i], err = codec.New(messages.TypeInsert, v, payload1K); err != nil {
			b.Fatal(err)
		}
	}
	return msgs
}

// benchRun calls appendOne for 0..n-1 from 64 goroutines and returns the
// time it took.
func benchRun(b *testing.B, n int, appendOne func(i int) error) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	for g := range benchGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += benchGoroutines {
				if err := appendOne(i); err != nil {
					b.Error(fmt.Errorf("append %d: %w", i, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}
