package integration

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/internal/rotate"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/telemetry"
	"github.com/streamwal/streamwal/telemetry/otelmetrics"
	"github.com/streamwal/streamwal/telemetry/oteltrace"
)

// switchSampler samples every span while on, none while off (a child
// follows its parent either way).
type switchSampler struct{ on atomic.Bool }

// ShouldSample implements sdktrace.Sampler.
func (s *switchSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if s.on.Load() {
		return sdktrace.ParentBased(sdktrace.AlwaysSample()).ShouldSample(p)
	}
	return sdktrace.ParentBased(sdktrace.NeverSample()).ShouldSample(p)
}

// Description implements sdktrace.Sampler.
func (s *switchSampler) Description() string { return "switch" }

// switchHook passes events to its metrics while on, and the messages a
// node appends to its tracing adapter while tracing is on (a node that
// traces nothing otherwise).
type switchHook struct {
	on, tracing atomic.Bool
	m           *otelmetrics.Metrics
	trace       *oteltrace.Hook
}

func (h *switchHook) hooks() telemetry.Hooks {
	if h.on.Load() {
		return telemetry.Hooks{h.m}
	}
	return nil
}

func (h *switchHook) tracer() telemetry.Hooks {
	if h.tracing.Load() {
		return telemetry.Hooks{h.trace}
	}
	return nil
}

func (h *switchHook) OnMessageAppendStart(ctx context.Context, e telemetry.MessageAppendEvent) context.Context {
	return h.tracer().OnMessageAppendStart(ctx, e)
}

func (h *switchHook) OnMessageAppendEnd(ctx context.Context, e telemetry.MessageAppendEndEvent) {
	h.tracer().OnMessageAppendEnd(ctx, e)
}

// The events the benchmark's load produces.
func (h *switchHook) OnAppendStart(e telemetry.AppendStartEvent) { h.hooks().OnAppendStart(e) }
func (h *switchHook) OnAppend(e telemetry.AppendEvent)           { h.hooks().OnAppend(e) }
func (h *switchHook) OnUnit(e telemetry.UnitEvent)               { h.hooks().OnUnit(e) }
func (h *switchHook) OnTSO(e telemetry.TSOEvent)                 { h.hooks().OnTSO(e) }
func (h *switchHook) OnHeartbeat(e telemetry.HeartbeatEvent)     { h.hooks().OnHeartbeat(e) }
func (h *switchHook) OnStorage(e telemetry.StorageEvent)         { h.hooks().OnStorage(e) }

// BenchmarkClientTelemetry measures the cost of observability on
// BenchmarkClient's remote appends (1 KiB inserts from 64 goroutines, 32
// in flight each, 16 PChannels, SyncAlways), in one run on one system:
// everything off; metrics on (every node and coordinator event into
// OpenTelemetry instruments) with each append under a caller's span whose
// context the client injects and the node continues, sampler off; and the
// same with the sampler always on (spans exported in batches to a
// discarding exporter). Three rounds, each variant once a round in a
// rotating order.
//
//	go test -run '^$' -bench BenchmarkClientTelemetry -benchtime 60000x ./integration/
func BenchmarkClientTelemetry(b *testing.B) {
	ctx := context.Background()
	sampler := &switchSampler{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer func() { _ = tp.Shutdown(ctx) }()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer func() { _ = mp.Shutdown(ctx) }()
	m, err := otelmetrics.New(mp)
	if err != nil {
		b.Fatal(err)
	}
	hook := &switchHook{m: m, trace: oteltrace.New(tp)}
	s, err := system.Start(ctx, system.Options{Cluster: "bench",
		ServerOptions: embedded.Options{StoreDir: b.TempDir(), SyncAlways: true},
		Coord:         coord.Config{Hooks: telemetry.Hooks{hook}},
		Node:          node.Config{Hooks: telemetry.Hooks{hook}}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.WaitServing(ctx, false); err != nil {
		b.Fatal(err)
	}
	plain := benchClient(b, s, client.WithoutLocalBypass())
	traced := benchClient(b, s, client.WithoutLocalBypass(), client.WithTracerProvider(tp))
	vs := benchCollections(b, plain, 16)
	caller := tp.Tracer("bench")
	set := func(metrics, tracing, sample bool) {
		hook.on.Store(metrics)
		hook.tracing.Store(tracing)
		sampler.on.Store(sample)
	}
	paths := []func(n int) time.Duration{
		func(n int) time.Duration { set(false, false, false); return benchTracedAppend(b, plain, vs, n, nil) },
		func(n int) time.Duration { set(true, true, false); return benchTracedAppend(b, traced, vs, n, caller) },
		func(n int) time.Duration { set(true, true, true); return benchTracedAppend(b, traced, vs, n, caller) },
	}
	const rounds = 3
	per := max(b.N/rounds, 1000)
	b.ResetTimer()
	took := rotate.Rounds(paths, rounds, per)
	b.StopTimer()
	rate := func(d time.Duration) float64 { return rotate.Rate(rounds*per, d) }
	off, sampledOff, alwaysOn := rate(took[0]), rate(took[1]), rate(took[2])
	b.ReportMetric(off, "off-msgs/s")
	b.ReportMetric(sampledOff, "sampler-off-msgs/s")
	b.ReportMetric(alwaysOn, "always-on-msgs/s")
	b.ReportMetric(100*(1-sampledOff/off), "sampler-off-cost-%")
	b.ReportMetric(100*(1-alwaysOn/off), "always-on-cost-%")
	b.ReportMetric(0, "ns/op")
}

// benchTracedAppend appends n inserts as benchClientAppend does (64
// goroutines, 32 in flight each), each under a span of tracer when one is
// given.
func benchTracedAppend(b *testing.B, c *client.Client, vs []streamwal.VChannel, n int, tracer trace.Tracer) time.Duration {
	const window = 32
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			type pending struct {
				f    *client.AppendFuture
				span trace.Span
			}
			var queue []pending
			for i := g; i < n || len(queue) > 0; i += 64 {
				if i < n {
					m, err := c.Codec().New(messages.TypeInsert, vs[i%len(vs)], benchPayload)
					if err != nil {
						b.Error(err)
						return
					}
					ctx, span := context.Background(), trace.Span(nil)
					if tracer != nil {
						ctx, span = tracer.Start(ctx, "caller")
					}
					queue = append(queue, pending{f: c.AppendAsync(ctx, m), span: span})
				}
				if len(queue) == window || i >= n {
					_, err := queue[0].f.Wait()
					if queue[0].span != nil {
						queue[0].span.End()
					}
					if err != nil {
						b.Error(err)
						return
					}
					queue = queue[1:]
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}
