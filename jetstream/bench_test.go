package jetstream_test

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
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// BenchmarkAppend appends 1 KiB messages from 64 goroutines through the
// sequencer and, on the same embedded server in the same run, through raw
// JetStream: async publish from one goroutine (4096 pending) and atomic
// batches of 1000 with an expected last sequence, one at a time. Both raw
// paths publish the same messages the sequencer writes (payload and
// Wal-* headers, a fresh Nats-Msg-Id each), so that the ratios measure the
// sequencer, not the size of its messages. It runs
// without and with SyncAlways (the writer then uses GroupCommit), and with
// two kinds of callers: window=1, each goroutine waits for every Append;
// window=32, each goroutine keeps up to 32 appends in flight (AppendAsync),
// as a node serving many clients does. It reports msgs/s of each path and
// the sequencer's ratio to each raw path:
//
//	go test -run '^$' -bench BenchmarkAppend -benchtime 50000x ./jetstream/
func BenchmarkAppend(b *testing.B) {
	for _, c := range []struct {
		fsync  bool
		window int
	}{{false, 1}, {false, 32}, {true, 1}, {true, 32}} {
		fsync, window := c.fsync, c.window
		b.Run(fmt.Sprintf("sync=%v/window=%d", fsync, window), func(b *testing.B) {
			srv := embedded.StartTest(b, func(o *embedded.Options) { o.SyncAlways = fsync })
			nc, err := srv.Connect()
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			n := max(b.N, 2000)
			b.ResetTimer()
			seq := benchSequencer(b, nc, fsync, window, n)
			async := benchRawAsync(b, nc, n)
			batch := benchRawBatch(b, nc, n)
			b.StopTimer()
			b.ReportMetric(seq, "seq-msgs/s")
			b.ReportMetric(async, "raw-async-msgs/s")
			b.ReportMetric(batch, "raw-batch-msgs/s")
			b.ReportMetric(seq/async, "seq/raw-async")
			b.ReportMetric(seq/batch, "seq/raw-batch")
			b.ReportMetric(0, "ns/op")
		})
	}
}

const benchGoroutines = 64

var payload1K = make([]byte, 1024)

// benchSequencer appends n messages through a writer from 64 goroutines.
func benchSequencer(b *testing.B, nc *nats.Conn, fsync bool, window, n int) float64 {
	codec, err := messages.NewCodec("bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	opts := jetstream.Options{}
	if fsync {
		opts.GroupCommit = true
	}
	be, err := jetstream.New(nc, codec, opts)
	if err != nil {
		b.Fatal(err)
	}
	p, _ := streamwal.NewPChannel(fmt.Sprintf("seq%d", window), 0)
	v, _ := p.VChannel(1, 0)
	ctx := context.Background()
	w, err := be.OpenWriter(ctx, p, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	msgs := make([]*messages.MutableMessage, n)
	for i := range msgs {
		if msgs[i], err = codec.New(messages.TypeInsert, v, payload1K); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < benchGoroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var pending []*jetstream.AppendFuture
			for i := g; i < n || len(pending) > 0; i += benchGoroutines {
				if i < n {
					pending = append(pending, w.AppendAsync(ctx, msgs[i]))
				}
				if len(pending) == window || i >= n {
					if _, err := pending[0].Wait(ctx); err != nil {
						b.Error(err)
						return
					}
					pending = pending[1:]
				}
			}
		}()
	}
	wg.Wait()
	rate := float64(n) / time.Since(start).Seconds()
	st := w.Stats()
	b.Logf("sequencer: %d units, %d atomic batches, %d messages, %d recoveries", st.Units, st.Batches, st.Messages, st.Recoveries)
	return rate
}

// rawStream creates a bare stream like the backend's.
func rawStream(b *testing.B, js njs.JetStream, name string) string {
	_, err := js.CreateStream(context.Background(), njs.StreamConfig{
		Name: name, Subjects: []string{name + ".>"}, Storage: njs.FileStorage,
		AllowAtomicPublish: true, AllowDirect: true, Duplicates: 2 * time.Minute,
	})
	if err != nil {
		b.Fatal(err)
	}
	return name + ".x"
}

// benchRawAsync publishes n messages asynchronously from one goroutine.
func benchRawAsync(b *testing.B, nc *nats.Conn, n int) float64 {
	js, err := njs.New(nc, njs.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	subj := rawStream(b, js, "RAWASYNC")
	start := time.Now()
	for i := 0; i < n; i++ {
		if _, err := js.PublishMsgAsync(rawMessage(subj), njs.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("async publishes did not complete")
	}
	return float64(n) / time.Since(start).Seconds()
}

// benchRawBatch publishes n messages as atomic batches of 1000, one at a
// time, each conditioned on the expected last sequence.
func benchRawBatch(b *testing.B, nc *nats.Conn, n int) float64 {
	js, err := njs.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	subj := rawStream(b, js, "RAWBATCH")
	ctx := context.Background()
	start := time.Now()
	var last uint64
	for done := 0; done < n; {
		size := min(1000, n-done)
		batch := make([]*nats.Msg, size)
		for i := range batch {
			batch[i] = rawMessage(subj)
		}
		batch[0].Header.Set(njs.ExpectedLastSeqHeader, fmt.Sprint(last))
		ack, err := jetstreamext.PublishMsgBatch(ctx, js, batch)
		if err != nil {
			b.Fatal(err)
		}
		last = ack.Sequence
		done += size
	}
	return float64(n) / time.Since(start).Seconds()
}

// walHeader is the header of an insert as the sequencer writes it (without
// the message ID, set per message).
var walHeader = func() nats.Header {
	codec, err := messages.NewCodec("bench", nil)
	if err != nil {
		panic(err)
	}
	p, _ := streamwal.NewPChannel("raw", 0)
	v, _ := p.VChannel(1, 0)
	m, err := codec.New(messages.TypeInsert, v, payload1K)
	if err != nil {
		panic(err)
	}
	m.SetTerm(1) // the writer adds the term; the rest is as benchSequencer's
	nm, err := codec.Encode(m)
	if err != nil {
		panic(err)
	}
	return nm.Header
}()

// rawMessage is an insert for a raw stream: the sequencer's payload and
// headers under subject, with a fresh message ID.
func rawMessage(subj string) *nats.Msg {
	h := make(nats.Header, len(walHeader)+1)
	for k, v := range walHeader {
		h[k] = v
	}
	h.Set(nats.MsgIdHdr, nuid.Next())
	return &nats.Msg{Subject: subj, Data: payload1K, Header: h}
}
