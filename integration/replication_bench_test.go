package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
)

// BenchmarkReplication measures issue 17's targets between two clusters,
// each a system on its own embedded server that fsyncs before every ack,
// 16 PChannels and one single-shard collection each on the primary, 1 KiB
// inserts from 64 callers that each wait for their append:
//
//   - live: the callers append while the secondary replicates; the
//     primary's append rate against the rate at which the secondary holds
//     what was appended (until it holds the last TimeTick of every
//     PChannel): replicated/primary, target at least 0.5;
//   - lag: the callers append at half the live rate for 5 s (60 s in the
//     long form) while the lag of every PChannel (client
//     ReplicationStatus) is sampled every 100 ms: its p50 and p99, target
//     p99 at most 1 s;
//   - catch-up: the secondary's node is down for 5 s (60 s) while the
//     callers append at half the live rate; after it restarts, the rate at
//     which the secondary takes up the backlog (timed from its first
//     progress: the node's start and the PChannels' assignment are
//     failover) against the live append rate: catch-up/live, target at
//     least 2.
//
// The long form runs with STREAMWAL_BENCH_LONG=1:
//
//	go test -run '^$' -bench BenchmarkReplication -benchtime 1x ./integration/
func BenchmarkReplication(b *testing.B) {
	phase := 5 * time.Second
	n := 20000
	if os.Getenv("STREAMWAL_BENCH_LONG") != "" {
		phase, n = 60*time.Second, 200000
	}
	ctx := context.Background()
	prim, sec := startBenchCluster(b, "east"), startBenchCluster(b, "west")
	r := &replicationBench{b: b, prim: prim, sec: sec}
	r.vs = benchCollections(b, prim.c, 16)
	topo := messages.Star(prim.member(ctx, b), sec.member(ctx, b))
	for _, c := range []*benchCluster{prim, sec} {
		if _, err := c.c.ConfigureReplication(ctx, topo); err != nil {
			b.Fatal(err)
		}
	}
	r.waitHeld(ctx)
	b.ResetTimer()

	start := time.Now()
	r.append(ctx, n, 0)
	appended := time.Since(start)
	r.waitHeld(ctx)
	held := time.Since(start)
	live := float64(n) / appended.Seconds()
	b.ReportMetric(live, "primary-msgs/s")
	b.ReportMetric(float64(n)/held.Seconds(), "replicated-msgs/s")
	b.ReportMetric(appended.Seconds()/held.Seconds(), "replicated/primary")

	p50, p99 := r.lag(ctx, live/2, phase)
	b.ReportMetric(p50.Seconds(), "lag-p50-s")
	b.ReportMetric(p99.Seconds(), "lag-p99-s")

	backlog, took := r.catchUp(ctx, live/2, phase)
	b.ReportMetric(float64(backlog)/took.Seconds()/live, "catch-up/live")
	b.ReportMetric(float64(backlog)/took.Seconds(), "catch-up-msgs/s")
	b.ReportMetric(0, "ns/op")
}

// benchCluster is one cluster of BenchmarkReplication, with a client.
type benchCluster struct {
	sys *system.System
	c   *client.Client
}

// startBenchCluster starts a cluster on a server of its own that fsyncs.
func startBenchCluster(b *testing.B, name streamwal.Cluster) *benchCluster {
	s := startBenchSystem(b, name, true)
	nc, err := s.Server.Connect()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	c, err := client.New(nc, client.WithCluster(name), client.WithLocal(s.Local()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return &benchCluster{sys: s, c: c}
}

// member is the cluster as a member of a topology.
func (c *benchCluster) member(ctx context.Context, b *testing.B) messages.ReplicateMember {
	m, err := c.c.ReplicateMember(ctx, c.sys.Server.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// replicationBench is the state of one BenchmarkReplication.
type replicationBench struct {
	b         *testing.B
	prim, sec *benchCluster
	vs        []streamwal.VChannel
	// last is the newest TimeTick appended, by PChannel.
	mu   sync.Mutex
	last map[string]messages.TimeTick
}

// append appends n inserts from 64 callers, at most rate a second
// (0: as fast as they go), remembering each PChannel's newest TimeTick.
func (r *replicationBench) append(ctx context.Context, n int, rate float64) {
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				if rate > 0 {
					if d := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
						time.Sleep(d) // the offered load's schedule, not a wait for a condition
					}
				}
				v := r.vs[i%int64(len(r.vs))]
				res, err := r.prim.c.AppendBytes(ctx, v, benchPayload)
				if err != nil {
					r.b.Error(err)
					return
				}
				r.note(v.PChannel(), res[0].TimeTick)
			}
		})
	}
	wg.Wait()
}

// note remembers a TimeTick appended to p.
func (r *replicationBench) note(p streamwal.PChannel, tt messages.TimeTick) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]messages.TimeTick{}
	}
	r.last[p.String()] = max(r.last[p.String()], tt)
}

// held reports whether the secondary holds every TimeTick appended.
func (r *replicationBench) held(ctx context.Context) (bool, []client.ReplicationChannel) {
	st, err := r.sec.c.ReplicationStatus(ctx)
	if err != nil {
		return false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	through := map[string]messages.TimeTick{}
	for _, ch := range st.Channels {
		through[ch.SourcePChannel] = ch.Through
	}
	for p, tt := range r.last {
		if through[p] < tt {
			return false, st.Channels
		}
	}
	return len(st.Channels) > 0, st.Channels
}

// waitHeld waits until the secondary holds every TimeTick appended.
func (r *replicationBench) waitHeld(ctx context.Context) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ok, chs := r.held(ctx)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			r.b.Fatalf("the secondary does not hold what was appended: %+v", chs)
		}
		time.Sleep(20 * time.Millisecond) // polling interval of the status
	}
}

// lag appends at rate for d and samples every PChannel's lag every
// 100 ms; it returns the samples' p50 and p99.
func (r *replicationBench) lag(ctx context.Context, rate float64, d time.Duration) (p50, p99 time.Duration) {
	done := make(chan struct{})
	var samples []time.Duration
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		end := time.Now().Add(d)
		for now := range t.C {
			if now.After(end) {
				return
			}
			st, err := r.sec.c.ReplicationStatus(ctx)
			if err != nil {
				continue
			}
			for _, ch := range st.Channels {
				if ch.LagKnown {
					samples = append(samples, ch.Lag)
				}
			}
		}
	}()
	r.append(ctx, int(rate*d.Seconds()), rate)
	<-done
	if len(samples) == 0 {
		r.b.Fatal("no lag sampled")
	}
	slices.Sort(samples)
	return samples[len(samples)/2], samples[len(samples)*99/100]
}

// catchUp stops the secondary's nodes, appends at rate for d, starts a
// node again, and returns the backlog and how long the secondary took to
// hold it from the restart.
func (r *replicationBench) catchUp(ctx context.Context, rate float64, d time.Duration) (int, time.Duration) {
	r.waitHeld(ctx)
	for _, nd := range r.sec.sys.Nodes() {
		r.sec.sys.StopNode(nd.ID(), true)
	}
	_, before := r.held(ctx)
	backlog := int(rate * d.Seconds())
	r.append(ctx, backlog, rate)
	if _, err := r.sec.sys.AddNode(ctx); err != nil {
		r.b.Fatal(fmt.Errorf("restart the secondary's node: %w", err))
	}
	// The node's start and the PChannels' assignment to it are failover,
	// not replication: the catch-up is timed from the first progress.
	start := r.waitProgress(ctx, before)
	r.waitHeld(ctx)
	return backlog, time.Since(start)
}

// waitProgress waits until a PChannel of the secondary holds more than
// it did in before, and returns when it saw that.
func (r *replicationBench) waitProgress(ctx context.Context, before []client.ReplicationChannel) time.Time {
	was := map[string]messages.TimeTick{}
	for _, ch := range before {
		was[ch.PChannel] = ch.Through
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		_, chs := r.held(ctx)
		for _, ch := range chs {
			if ch.Through > was[ch.PChannel] {
				return time.Now()
			}
		}
		time.Sleep(20 * time.Millisecond) // polling interval of the status
	}
	r.b.Fatal("the secondary made no progress after its node restarted")
	return time.Time{}
}
