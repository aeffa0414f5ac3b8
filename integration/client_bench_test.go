package integration

import (
	"context"
	"fmt"
	"maps"
	"strconv"
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
	"github.com/streamwal/streamwal/internal/rotate"
	"github.com/streamwal/streamwal/messages"
)

// BenchmarkClient measures, on one embedded server with SyncAlways and a
// cluster of 16 PChannels (one collection on each), client appends of
// 1 KiB messages from 64 goroutines through a remote node (NATS) and
// through the local bypass, beside raw JetStream atomic batches of 1000
// (one at a time, as one fenced writer sends them) on the same server; and
// reads of all 16 VChannels at once through the client beside raw ordered
// consumers of the same streams, subjects and counts (client, raw, raw,
// client: each path one cold and one warm pass). Each goroutine keeps
// up to window appends in flight (AppendAsync): with window=1024, each
// PChannel has about 4000 appends in flight, what its group commit needs
// to fill batches of 1000 (a batch gathers what arrived while the one
// before it was in flight); window=32 shows a lighter load. The appends
// run in three rounds, each path once a round in a rotating order, and
// each path's rate is its messages over its total time.
//
//	go test -run '^$' -bench BenchmarkClient -benchtime 150000x ./integration/
func BenchmarkClient(b *testing.B) {
	for _, window := range []int{32, 1024} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) { benchClientRun(b, window) })
	}
}

// benchClientRun is one run of BenchmarkClient on a fresh system.
func benchClientRun(b *testing.B, window int) {
	s := startBenchSystem(b, "bench", true)
	remote := benchClient(b, s, client.WithoutLocalBypass())
	local := benchClient(b, s)
	vs := benchCollections(b, remote, 16)
	raw := newRawBatches(b, s.Conn(), remote.Codec(), vs[0])
	// Three rounds, each path once a round in a rotating order, so that
	// no path always runs first on a fresh disk or last behind the
	// others' writeback.
	paths := []func(n int) time.Duration{
		raw.publish,
		func(n int) time.Duration { return benchClientAppend(b, remote, vs, window, n) },
		func(n int) time.Duration { return benchClientAppend(b, local, vs, window, n) },
	}
	const rounds = 3
	per := max(b.N/rounds, 1000)
	b.ResetTimer()
	took := rotate.Rounds(paths, rounds, per)
	rate := func(d time.Duration) float64 { return rotate.Rate(rounds*per, d) }
	rBatch, rRemote, rLocal := rate(took[0]), rate(took[1]), rate(took[2])
	// Reads run client, raw, raw, client: whichever reads a stream first
	// pays for loading it from disk, so each path gets one cold and one
	// warm pass.
	cold, counts := benchClientReads(b, remote, vs)
	rawTook := benchRawReads(b, s.Conn(), vs, counts) + benchRawReads(b, s.Conn(), vs, counts)
	warm, _ := benchClientReads(b, remote, vs)
	total := 0
	for _, n := range counts {
		total += 2 * n
	}
	rRead, rRawRead := float64(total)/(cold+warm).Seconds(), float64(total)/rawTook.Seconds()
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

// startBenchSystem starts a system of one node on a server of its own,
// fsyncing before every ack or not, and waits until it serves every
// PChannel; it stops when the benchmark ends.
func startBenchSystem(b *testing.B, cluster streamwal.Cluster, fsync bool) *system.System {
	ctx := context.Background()
	s, err := system.Start(ctx, system.Options{Cluster: cluster,
		ServerOptions: embedded.Options{StoreDir: b.TempDir(), SyncAlways: fsync}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	if _, err := s.WaitServing(ctx, false); err != nil {
		b.Fatal(err)
	}
	return s
}

// storedHeader is the header of a 1 KiB insert to v as the WAL stores it
// (term, TimeTick and LastConfirmed stamped), without a message ID: what
// the raw paths publish beside the client.
func storedHeader(b *testing.B, codec *messages.Codec, v streamwal.VChannel, lastConfirmed messages.MessageID) nats.Header {
	m, err := codec.New(messages.TypeInsert, v, benchPayload)
	if err != nil {
		b.Fatal(err)
	}
	tt, err := messages.NewTimeTick(time.Now(), 1)
	if err != nil {
		b.Fatal(err)
	}
	m.SetTerm(1) // the WAL stamps these three; the rest is as the client's
	m.SetTimeTick(tt)
	m.SetLastConfirmed(lastConfirmed)
	stored, err := codec.Encode(m)
	if err != nil {
		b.Fatal(err)
	}
	return stored.Header
}

// storedMsg is a stored insert of header under subject, with a fresh
// message ID.
func storedMsg(header nats.Header, subject string) *nats.Msg {
	h := maps.Clone(header)
	h.Set(nats.MsgIdHdr, nuid.Next())
	return &nats.Msg{Subject: subject, Data: benchPayload, Header: h}
}

// benchClient connects a client to the system's server.
func benchClient(b *testing.B, s *system.System, opts ...client.Option) *client.Client {
	nc, err := s.Server.Connect()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	c, err := client.New(nc, append([]client.Option{client.WithCluster("bench"), client.WithLocal(s.Local())}, opts...)...)
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

// benchClientAppend appends n messages from 64 goroutines, each with up
// to window in flight, and returns how long that took.
func benchClientAppend(b *testing.B, c *client.Client, vs []streamwal.VChannel, window, n int) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var pending []*client.AppendFuture
			for i := g; i < n || len(pending) > 0; i += 64 {
				if i < n {
					m, err := c.Codec().New(messages.TypeInsert, vs[i%len(vs)], benchPayload)
					if err != nil {
						b.Error(err)
						return
					}
					pending = append(pending, c.AppendAsync(context.Background(), m))
				}
				if len(pending) == window || i >= n {
					if _, err := pending[0].Wait(); err != nil {
						b.Error(err)
						return
					}
					pending = pending[1:]
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// rawBatches publishes atomic batches of 1000, one at a time, each
// conditioned on the stream's last sequence as one fenced writer's are, to
// a stream configured as a PChannel's. Every message is what the client
// stores for an insert (payload and Wal-* headers) with a fresh
// Nats-Msg-Id, so that the ratios compare the paths, not message sizes.
type rawBatches struct {
	b      *testing.B
	js     njs.JetStream
	header nats.Header
	last   uint64
}

// newRawBatches creates the raw stream; its messages look like inserts on v.
func newRawBatches(b *testing.B, nc *nats.Conn, codec *messages.Codec, v streamwal.VChannel) *rawBatches {
	js, err := njs.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), njs.StreamConfig{Name: "RAWBATCH", Subjects: []string{"RAWBATCH.>"},
		Storage: njs.FileStorage, AllowAtomicPublish: true, AllowDirect: true, Duplicates: 2 * time.Minute}); err != nil {
		b.Fatal(err)
	}
	return &rawBatches{b: b, js: js, header: storedHeader(b, codec, v, messages.MessageID(b.N))}
}

// publish sends n messages and returns how long that took.
func (r *rawBatches) publish(n int) time.Duration {
	start := time.Now()
	for done := 0; done < n; {
		batch := make([]*nats.Msg, min(1000, n-done))
		for i := range batch {
			batch[i] = storedMsg(r.header, "RAWBATCH.x")
		}
		batch[0].Header.Set(njs.ExpectedLastSeqHeader, strconv.FormatUint(r.last, 10))
		ack, err := jetstreamext.PublishMsgBatch(context.Background(), r.js, batch)
		if err != nil {
			r.b.Fatal(err)
		}
		r.last = ack.Sequence
		done += len(batch)
	}
	return time.Since(start)
}

// benchClientReads reads every VChannel from the start to its PChannel's
// current end, all at once, one client scanner each, and returns how long
// that took and how many messages each read.
func benchClientReads(b *testing.B, c *client.Client, vs []streamwal.VChannel) (time.Duration, []int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	end, err := c.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	last := map[string]messages.MessageID{}
	for _, ch := range end.Channels {
		last[ch.PChannel] = ch.LastID
	}
	return benchReads(vs, func(i int) int {
		s, err := c.Read(ctx, client.ReadOptions{VChannel: vs[i], Start: client.Earliest(), Types: []*messages.Type{messages.TypeInsert, messages.TypeTimeTick}})
		if err != nil {
			b.Error(err)
			return 0
		}
		defer s.Close()
		count := 0
		for m, err := range s.All(ctx) {
			if err != nil {
				b.Error(err)
				return count
			}
			count++
			if m.ID() >= last[vs[i].PChannel().String()] {
				break
			}
		}
		return count
	})
}

// benchRawReads reads, for every VChannel at once, as many messages as
// counts says from its PChannel's stream with a raw ordered consumer
// filtered to the subjects the client reads (the VChannel's own and its
// PChannel's), and returns how long that took.
func benchRawReads(b *testing.B, nc *nats.Conn, vs []streamwal.VChannel, counts []int) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := njs.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	c := streamwal.Cluster("bench")
	took, _ := benchReads(vs, func(i int) int {
		cons, err := js.OrderedConsumer(ctx, c.StreamName(vs[i].PChannel()), njs.OrderedConsumerConfig{FilterSubjects: c.VChannelFilter(vs[i])})
		if err != nil {
			b.Error(err)
			return 0
		}
		it, err := cons.Messages()
		if err != nil {
			b.Error(err)
			return 0
		}
		defer it.Stop()
		for n := range counts[i] {
			if _, err := it.Next(njs.NextContext(ctx)); err != nil {
				b.Error(err)
				return n
			}
		}
		return counts[i]
	})
	return took
}

// benchReads runs read for every VChannel at once and returns how long
// that took and each one's count.
func benchReads(vs []streamwal.VChannel, read func(i int) int) (time.Duration, []int) {
	counts := make([]int, len(vs))
	start := time.Now()
	var wg sync.WaitGroup
	for i := range vs {
		wg.Go(func() { counts[i] = read(i) })
	}
	wg.Wait()
	return time.Since(start), counts
}
