package integration

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/internal/rotate"
	"github.com/streamwal/streamwal/messages"
)

// sweepLevels are the appends in flight across the cluster that
// BenchmarkSweep measures.
var sweepLevels = []int{1, 4, 16, 64, 256, 1024, 4096}

// sweepPChannels is how many PChannels (and raw streams) the sweep spreads
// its appends over.
const sweepPChannels = 16

// BenchmarkSweep is the concurrency sweep of issue 19: 1 KiB inserts on
// one embedded server with one node and 16 PChannels (one collection on
// each), with 1, 4, 16, ... 4096 appends in flight across the cluster,
// through the client (remote: through NATS to the node; local: the local
// bypass) beside the raw JetStream paths with as many messages in flight
// on 16 streams configured as PChannels (every message what the client
// stores for an insert, with a fresh message ID):
//
//   - raw-sync: synchronous publishes (each waits for its ack);
//   - raw-async: asynchronous publishes, each caller waiting for its ack
//     future;
//   - raw-batch: atomic batches (orbit.go's jetstreamext), each
//     conditioned on its stream's last sequence as one fenced writer's
//     are: min(inflight, 16) writers, one stream each, one batch of
//     inflight/writers messages in flight each.
//
// In flight means callers that wait: inflight goroutines, each appending
// (or publishing) one message and waiting for it before the next, as
// most services do; a level is the number of such callers, not a window
// of one caller. Message i goes to PChannel (stream) i mod 16. The best of
// the three raw paths at a level is its denominator.
//
// At each level the five paths run in three rounds, each once a round in
// the rotating order of internal/rotate, each with max(N/3, inflight)
// messages a round; a path's rate is its messages over its total time,
// and its latencies (hdrhistogram-go) are those of every append of the
// three rounds (a batch's latency counts once per message). Each level
// reports remote-, local- and raw-msgs/s (raw: the best path; each raw
// path's own rate too), remote/raw and local/raw, and the p50 and p99
// latency in ms of remote, local and the best raw path. The fsync
// dimension runs with SyncAlways (fsync before every ack), nosync
// without; one server per dimension, shared by its levels:
//
//	go test -run '^$' -bench BenchmarkSweep -benchtime 2000x -timeout 30m ./integration/
//	go test -run '^$' -bench 'BenchmarkSweep/fsync/inflight=64$' -benchtime 2000x ./integration/
func BenchmarkSweep(b *testing.B) {
	for _, mode := range []struct {
		name  string
		fsync bool
	}{{"fsync", true}, {"nosync", false}} {
		b.Run(mode.name, func(b *testing.B) { benchSweepMode(b, mode.fsync) })
	}
}

// benchSweepMode starts the system of one dimension of BenchmarkSweep and
// runs its levels.
func benchSweepMode(b *testing.B, fsync bool) {
	s := startBenchSystem(b, "bench", fsync)
	remote := benchClient(b, s, client.WithoutLocalBypass())
	local := benchClient(b, s)
	vs := benchCollections(b, remote, sweepPChannels)
	nc, err := s.Server.Connect()
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	raw := newSweepRaw(b, nc, remote.Codec(), vs[0])
	for _, level := range sweepLevels {
		b.Run(fmt.Sprintf("inflight=%d", level), func(b *testing.B) {
			paths := []*sweepPath{
				{name: "remote", run: func(n int, lat []int64) time.Duration { return sweepClient(b, remote, vs, level, n, lat) }},
				{name: "local", run: func(n int, lat []int64) time.Duration { return sweepClient(b, local, vs, level, n, lat) }},
				{name: "raw-sync", run: func(n int, lat []int64) time.Duration { return raw.sync(level, n, lat) }},
				{name: "raw-async", run: func(n int, lat []int64) time.Duration { return raw.async(level, n, lat) }},
				{name: "raw-batch", run: func(n int, lat []int64) time.Duration { return raw.batches(level, n, lat) }},
			}
			benchSweepLevel(b, paths, level)
		})
	}
}

// sweepPath is one path of a sweep level: run sends n messages with
// their latencies in lat (µs, by message) and returns how long that
// took; the rest is what the rounds accumulate.
type sweepPath struct {
	name string
	run  func(n int, lat []int64) time.Duration
	took time.Duration
	hist *hdrhistogram.Histogram
}

// rate is the path's messages per second over its rounds.
func (p *sweepPath) rate(msgs int) float64 { return rotate.Rate(msgs, p.took) }

// benchSweepLevel runs the paths of one level in rotating rounds and
// reports the level's metrics.
func benchSweepLevel(b *testing.B, paths []*sweepPath, level int) {
	const rounds = 3
	per := max(b.N/rounds, level)
	lat := make([]int64, per)
	fns := make([]func(n int) time.Duration, len(paths))
	for i, p := range paths {
		p.hist = hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3)
		fns[i] = func(n int) time.Duration {
			took := p.run(n, lat)
			for _, us := range lat[:n] {
				_ = p.hist.RecordValue(us)
			}
			return took
		}
	}
	b.ResetTimer()
	took := rotate.Rounds(fns, rounds, per)
	b.StopTimer()
	for i, p := range paths {
		p.took = took[i]
	}
	best := paths[2]
	for _, p := range paths[3:] {
		if p.took < best.took {
			best = p
		}
	}
	msgs := rounds * per
	remote, local := paths[0], paths[1]
	b.Logf("inflight=%d: best raw path %s", level, best.name)
	b.ReportMetric(remote.rate(msgs), "remote-msgs/s")
	b.ReportMetric(local.rate(msgs), "local-msgs/s")
	b.ReportMetric(best.rate(msgs), "raw-msgs/s")
	for _, p := range paths[2:] {
		b.ReportMetric(p.rate(msgs), p.name+"-msgs/s")
	}
	b.ReportMetric(remote.rate(msgs)/best.rate(msgs), "remote/raw")
	b.ReportMetric(local.rate(msgs)/best.rate(msgs), "local/raw")
	for _, p := range []*sweepPath{remote, local, best} {
		name := p.name
		if p == best {
			name = "raw"
		}
		b.ReportMetric(ms(p.hist.ValueAtQuantile(50)), name+"-p50-ms")
		b.ReportMetric(ms(p.hist.ValueAtQuantile(99)), name+"-p99-ms")
	}
	b.ReportMetric(0, "ns/op")
}

// sweepCallers runs op for messages 0..n-1 from callers goroutines, each
// waiting for one before its next (goroutine g sends g, g+callers, ...),
// records each one's latency in lat (µs) and returns how long it all
// took. The first error fails the benchmark.
func sweepCallers(b *testing.B, callers, n int, lat []int64, op func(i int) error) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	for g := range min(callers, n) {
		wg.Go(func() {
			for i := g; i < n; i += callers {
				t0 := time.Now()
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
				lat[i] = time.Since(t0).Microseconds()
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// sweepClient appends n inserts through c from level callers that each
// wait for their append, message i to vs[i mod len(vs)].
func sweepClient(b *testing.B, c *client.Client, vs []streamwal.VChannel, level, n int, lat []int64) time.Duration {
	ctx := context.Background()
	return sweepCallers(b, level, n, lat, func(i int) error {
		m, err := c.Codec().New(messages.TypeInsert, vs[i%len(vs)], benchPayload)
		if err != nil {
			return err
		}
		if _, err := c.Append(ctx, m); err != nil {
			return fmt.Errorf("client append: %w", err)
		}
		return nil
	})
}

// sweepRaw publishes to 16 streams configured as PChannels (atomic
// batches allowed, the duplicate window of the backend's default) what
// the client stores for an insert.
type sweepRaw struct {
	b      *testing.B
	js     njs.JetStream
	header nats.Header
	last   [sweepPChannels]uint64 // of each stream, for conditioned batches
}

// newSweepRaw creates the raw streams; their messages look like inserts
// on v.
func newSweepRaw(b *testing.B, nc *nats.Conn, codec *messages.Codec, v streamwal.VChannel) *sweepRaw {
	// Generous timeouts: at 4096 in flight under fsync on a busy machine,
	// an ack may take longer than the default 5 s.
	js, err := njs.New(nc, njs.WithPublishAsyncMaxPending(1<<16), njs.WithDefaultTimeout(time.Minute),
		njs.WithPublishAsyncTimeout(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	for i := range sweepPChannels {
		if _, err := js.CreateStream(context.Background(), njs.StreamConfig{Name: fmt.Sprint("SWEEP_", i),
			Subjects: []string{fmt.Sprint("SWEEP.", i, ".>")}, Storage: njs.FileStorage, AllowAtomicPublish: true,
			AllowDirect: true, Duplicates: 2 * time.Minute}); err != nil {
			b.Fatal(err)
		}
	}
	return &sweepRaw{b: b, js: js, header: storedHeader(b, codec, v, 1)}
}

// msg is message i: for stream i mod 16, with a fresh message ID.
func (r *sweepRaw) msg(i int) *nats.Msg {
	return storedMsg(r.header, fmt.Sprint("SWEEP.", i%sweepPChannels, ".x"))
}

// sync publishes n messages synchronously from level callers.
func (r *sweepRaw) sync(level, n int, lat []int64) time.Duration {
	ctx := context.Background()
	return sweepCallers(r.b, level, n, lat, func(i int) error {
		if _, err := r.js.PublishMsg(ctx, r.msg(i)); err != nil {
			return fmt.Errorf("raw sync publish: %w", err)
		}
		return nil
	})
}

// async publishes n messages asynchronously from level callers, each
// waiting for its ack future before its next.
func (r *sweepRaw) async(level, n int, lat []int64) time.Duration {
	return sweepCallers(r.b, level, n, lat, func(i int) error {
		f, err := r.js.PublishMsgAsync(r.msg(i))
		if err != nil {
			return fmt.Errorf("raw async publish: %w", err)
		}
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return fmt.Errorf("raw async publish: %w", err)
		}
	})
}

// batches publishes n messages as atomic batches: min(level, 16)
// writers, writer w on stream w, each with one batch of level/writers
// messages in flight, conditioned on its stream's last sequence. Each
// message's latency is its batch's.
func (r *sweepRaw) batches(level, n int, lat []int64) time.Duration {
	writers := min(level, sweepPChannels)
	size := min(level/writers, 1000)
	r.syncLast()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		share := n / writers
		if w < n%writers {
			share++
		}
		first := w * (n / writers)
		first += min(w, n%writers)
		wg.Go(func() {
			if err := r.batchWriter(w, size, lat[first:first+share]); err != nil {
				r.b.Error(err)
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// syncLast reads each stream's last sequence: the other raw paths
// publish to the same streams between batch runs.
func (r *sweepRaw) syncLast() {
	for i := range sweepPChannels {
		st, err := r.js.Stream(context.Background(), fmt.Sprint("SWEEP_", i))
		if err != nil {
			r.b.Fatal(err)
		}
		info, err := st.Info(context.Background())
		if err != nil {
			r.b.Fatal(err)
		}
		r.last[i] = info.State.LastSeq
	}
}

// batchWriter publishes len(lat) messages to stream w in atomic batches
// of up to size, one at a time, and records their latencies in lat.
func (r *sweepRaw) batchWriter(w, size int, lat []int64) error {
	for done := 0; done < len(lat); {
		batch := make([]*nats.Msg, min(size, len(lat)-done))
		for i := range batch {
			batch[i] = r.msg(w)
		}
		batch[0].Header.Set(njs.ExpectedLastSeqHeader, strconv.FormatUint(r.last[w], 10))
		t0 := time.Now()
		ack, err := jetstreamext.PublishMsgBatch(context.Background(), r.js, batch)
		if err != nil {
			return fmt.Errorf("batch of %d to stream %d: %w", len(batch), w, err)
		}
		us := time.Since(t0).Microseconds()
		for i := range batch {
			lat[done+i] = us
		}
		r.last[w] = ack.Sequence
		done += len(batch)
	}
	return nil
}
