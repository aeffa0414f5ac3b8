package wal_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
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
	defer be.Close()
	n := max(b.N, 2000)
	b.ResetTimer()
	chain := benchWAL(b, be, codec, n, nil)
	stored := benchWAL(b, be, codec, n, &wal.Storage{Store: recovery.NewMemory(), Tiers: be})
	bare := benchBare(b, be, codec, n)
	b.StopTimer()
	b.ReportMetric(chain, "chain-msgs/s")
	b.ReportMetric(stored, "storage-msgs/s")
	b.ReportMetric(bare, "bare-msgs/s")
	b.ReportMetric(chain/bare, "chain/bare")
	b.ReportMetric(stored/chain, "storage/chain")
	b.ReportMetric(0, "ns/op")
}

const benchGoroutines = 64

var payload1K = make([]byte, 1024)

// benchWAL appends n inserts through a WAL, with recovery storage and
// shard management when storage is not nil.
func benchWAL(b *testing.B, be jetstream.Backend, codec *messages.Codec, n int, storage *wal.Storage) float64 {
	ctx := context.Background()
	name := "chain"
	if storage != nil {
		name = "stored"
	}
	p, _ := streamwal.NewPChannel(name, 0)
	v, _ := p.VChannel(1, 0)
	w, err := wal.Open(ctx, wal.Config{Backend: be, Codec: codec, PChannel: p, Term: 1, Oracle: timetick.NewLocalOracle(nil), Storage: storage})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	create, err := codec.NewBody(messages.TypeCreateCollection, v, messages.CreateCollectionBody{
		CollectionRef: messages.CollectionRef{DBName: "db", CollectionName: "c", CollectionID: 1}, VChannels: []string{v.String()}})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := w.Append(ctx, create); err != nil {
		b.Fatal(err)
	}
	msgs := benchInserts(b, codec, v, n)
	return benchRun(b, n, func(i int) error {
		_, err := w.Append(ctx, msgs[i])
		return err
	})
}

// benchBare appends n inserts through a backend writer.
func benchBare(b *testing.B, be jetstream.Backend, codec *messages.Codec, n int) float64 {
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
// rate in messages per second.
func benchRun(b *testing.B, n int, appendOne func(i int) error) float64 {
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
	return float64(n) / time.Since(start).Seconds()
}
