package integration

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// BenchmarkBroadcast measures the latency of one broadcast, called
// sequentially through the coordinator's request subject on an embedded
// cluster (one coordinator, two nodes, 16 PChannels, one file-store
// server, without and with fsync before every ack: sync=false, sync=true):
// the call returns once every replica landed, the task is a tombstone and
// its keys are free.
//
//   - cchannel: CreateDatabase of a fresh database per call, which goes to
//     the CChannel only;
//   - 16vchannels+cchannel: AlterCollection of a collection with 16 shards
//     (one VChannel on every PChannel) allocated and created beforehand:
//     17 replicas per call.
//
// Each reports the p50 and p99 latency in ms and ops/s, and, measured in
// the same run on the same server for comparison, the latency of one raw
// synchronous JetStream publish to one file-store stream (raw-p50-ms,
// raw-p99-ms) and the ratio of the p50s:
//
//	go test -run '^$' -bench BenchmarkBroadcast -benchtime 200x ./integration/
func BenchmarkBroadcast(b *testing.B) {
	for _, fsync := range []bool{false, true} {
		b.Run(fmt.Sprintf("sync=%v", fsync), func(b *testing.B) { benchBroadcast(b, fsync) })
	}
}

// benchBroadcast is BenchmarkBroadcast on a server that fsyncs before
// every ack or not.
func benchBroadcast(b *testing.B, fsync bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, err := system.Start(ctx, system.Options{Cluster: "bench", Coordinators: 1, Nodes: 2,
		ServerOptions: embedded.Options{StoreDir: b.TempDir(), SyncAlways: fsync}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	view, err := s.WaitServing(ctx, true)
	if err != nil {
		b.Fatal(err)
	}
	vs := bcAllocate(ctx, b, s, 1, 16)
	if _, err := bcCall(ctx, s, bcRequest(b, messages.TypeCreateCollection, vs, 1, bcCreateBody(1, vs), "")); err != nil {
		b.Fatal(err)
	}
	raw := newRawPublisher(ctx, b, s)

	var dbs atomic.Int64
	for _, c := range []struct {
		name    string
		targets int
		req     func(i int) wire.BroadcastRequest
	}{
		{"cchannel", 1, func(int) wire.BroadcastRequest {
			return wire.BroadcastRequest{Type: messages.TypeCreateDatabase.Name,
				DBName: fmt.Sprintf("bench%d", dbs.Add(1)), Payload: []byte(`{}`)}
		}},
		{"16vchannels+cchannel", 17, func(i int) wire.BroadcastRequest {
			return bcRequest(b, messages.TypeAlterCollection, vs, 1, messages.AlterCollectionBody{
				CollectionRef: bcRef(1), SchemaVersion: uint64(i + 1)}, "")
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			hist := hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3)
			n := 0
			start := time.Now()
			for ; b.Loop(); n++ {
				t0 := time.Now()
				reply, err := bcCall(ctx, s, c.req(n))
				if err != nil {
					b.Fatal(err)
				}
				_ = hist.RecordValue(time.Since(t0).Microseconds())
				if len(reply.Appended) != c.targets {
					b.Fatalf("%d targets, want %d (cchannel %s)", len(reply.Appended), c.targets, view.CChannel)
				}
			}
			elapsed := time.Since(start)
			rawHist := raw.measure(ctx, b, n)
			b.ReportMetric(float64(n)/elapsed.Seconds(), "ops/s")
			b.ReportMetric(ms(hist.ValueAtQuantile(50)), "p50-ms")
			b.ReportMetric(ms(hist.ValueAtQuantile(99)), "p99-ms")
			b.ReportMetric(ms(rawHist.ValueAtQuantile(50)), "raw-p50-ms")
			b.ReportMetric(ms(rawHist.ValueAtQuantile(99)), "raw-p99-ms")
			b.ReportMetric(float64(hist.ValueAtQuantile(50))/float64(rawHist.ValueAtQuantile(50)), "p50/raw-p50")
		})
	}
}

// ms converts microseconds to milliseconds.
func ms(us int64) float64 { return float64(us) / 1000 }

// rawPublisher publishes straight to one JetStream stream of its own on
// the cluster's server (file storage, one replica, like a PChannel's).
type rawPublisher struct {
	js      njs.JetStream
	subject string
	payload []byte
}

// newRawPublisher creates the raw stream.
func newRawPublisher(ctx context.Context, b *testing.B, s *system.System) *rawPublisher {
	js, err := njs.New(s.Conn())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, njs.StreamConfig{Name: "BENCH_RAW", Subjects: []string{"benchraw.>"},
		Storage: njs.FileStorage, Replicas: 1}); err != nil {
		b.Fatal(err)
	}
	// About the size of a broadcast replica's body.
	return &rawPublisher{js: js, subject: "benchraw.p", payload: make([]byte, 256)}
}

// measure publishes n messages one at a time, each waiting for its ack,
// and returns their latencies in microseconds.
func (r *rawPublisher) measure(ctx context.Context, b *testing.B, n int) *hdrhistogram.Histogram {
	hist := hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3)
	for range n {
		t0 := time.Now()
		if _, err := r.js.Publish(ctx, r.subject, r.payload); err != nil {
			b.Fatal(err)
		}
		_ = hist.RecordValue(time.Since(t0).Microseconds())
	}
	return hist
}
