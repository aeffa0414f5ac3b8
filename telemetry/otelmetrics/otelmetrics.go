// Package otelmetrics turns streamwal's telemetry hooks into
// OpenTelemetry metrics. New takes any metric.MeterProvider; the package
// carries no exporter (package telemetry/endpoint serves them in the
// Prometheus text format).
//
// Instrument names are OpenTelemetry's dotted names; a Prometheus
// exporter writes them with underscores and unit suffixes, so that
// "streamwal.appends" is streamwal_appends_total and
// "streamwal.append.duration" (seconds) streamwal_append_duration_seconds.
// Labels are bounded: a PChannel, a node, a message type (the registry's),
// an error code, a reason or state from a fixed set; never a VChannel, a
// message ID or a payload.
package otelmetrics

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
)

// ScopeName is the instrumentation scope of the instruments.
const ScopeName = "github.com/streamwal/streamwal"

// Label keys.
const (
	keyPChannel = "pchannel"
	keyNode     = "node"
	keyType     = "type"
	keyCode     = "code"
	keyKind     = "kind"
	keyReason   = "reason"
	keyState    = "state"
)

// codeOK is the code label of a success.
const codeOK = "OK"

// Metrics is a telemetry hook that records every event as OpenTelemetry
// metrics. Put it in the Hooks of the components to measure.
type Metrics struct {
	appends, units, recoveries, fences, opens, closes, assigns, beats, tso, tsoTicks, broadcasts, clientReqs metric.Int64Counter
	inFlight                                                                                                 metric.Int64UpDownCounter
	appendDur, openDur, bcastDur, clientDur                                                                  metric.Float64Histogram
	unitSize, replayed                                                                                       metric.Int64Histogram
	serving, stuck, truncated, segments                                                                      metric.Int64Gauge
	checkpointAge, watermarkLag                                                                              metric.Float64Gauge
	replicationLag                                                                                           metric.Float64ObservableGauge

	pchannels   sync.Map // streamwal.PChannel -> attribute.KeyValue
	options     sync.Map // pchannelKey, appendKey, unitKey -> metric.MeasurementOption
	replication sync.Map // streamwal.PChannel -> messages.TimeTick (Through)
}

// The keys of the cached attribute sets of frequent measurements.
type (
	pchannelKey struct{ p streamwal.PChannel }
	appendKey   struct {
		p    streamwal.PChannel
		typ  string
		code streamwal.Code
	}
	unitKey struct {
		p     streamwal.PChannel
		batch bool
	}
)

// cached is the measurement option of key's attributes, built once.
func (m *Metrics) cached(key any, build func() []attribute.KeyValue) metric.MeasurementOption {
	if o, ok := m.options.Load(key); ok {
		return o.(metric.MeasurementOption)
	}
	o := attrs(build()...)
	m.options.Store(key, o)
	return o
}

// ofPChannel is the option of p's label alone.
func (m *Metrics) ofPChannel(p streamwal.PChannel) metric.MeasurementOption {
	return m.cached(pchannelKey{p}, func() []attribute.KeyValue { return []attribute.KeyValue{m.pchannel(p)} })
}

// Buckets of the histograms.
var (
	latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	openBuckets    = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	sizeBuckets    = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
	replayBuckets  = []float64{0, 10, 100, 1000, 10000, 100000, 1e6, 1e7}
)

// New creates the instruments on mp's meter of ScopeName.
func New(mp metric.MeterProvider) (*Metrics, error) {
	b := builder{m: mp.Meter(ScopeName)}
	m := &Metrics{
		appends:    b.counter("streamwal.appends", "{message}", "Messages of append requests a node finished, by PChannel, message type and result code (OK when appended)."),
		inFlight:   b.upDown("streamwal.appends.in_flight", "{message}", "Messages of append requests a node is serving now."),
		appendDur:  b.histogram("streamwal.append.duration", "s", "Time a node took to serve an append request, by PChannel.", latencyBuckets),
		units:      b.counter("streamwal.append.units", "{unit}", "Units a WAL writer sent to JetStream, by PChannel and kind (publish or batch)."),
		unitSize:   b.intHistogram("streamwal.append.unit.size", "{message}", "Messages per unit a WAL writer sent, by PChannel.", sizeBuckets),
		recoveries: b.counter("streamwal.writer.recoveries", "{recovery}", "Times a WAL writer resolved its tail after an unknown outcome, by PChannel."),
		fences:     b.counter("streamwal.fencing.events", "{event}", "WALs fenced by a newer owner, by PChannel."),
		opens:      b.counter("streamwal.pchannel.opens", "{open}", "Opens of a PChannel by a node, by PChannel and result code."),
		openDur:    b.histogram("streamwal.pchannel.open.duration", "s", "Time an open of a PChannel took (barrier and replay), by PChannel.", openBuckets),
		replayed:   b.intHistogram("streamwal.pchannel.open.replayed", "{message}", "Messages replayed by an open of a PChannel, by PChannel.", replayBuckets),
		closes:     b.counter("streamwal.pchannel.closes", "{close}", "PChannels a node stopped serving, by PChannel and reason."),
		serving:    b.gauge("streamwal.serving.pchannels", "{pchannel}", "PChannels a node serves, by node, as of its last heartbeat."),
		assigns:    b.counter("streamwal.assignment.changes", "{change}", "Changes of a PChannel's assignment by the active coordinator, by PChannel and new state."),
		beats:      b.counter("streamwal.node.heartbeats", "{heartbeat}", "Heartbeats of a node, by node and result code."),
		tso:        b.counter("streamwal.tso.allocations", "{allocation}", "TimeTick allocation requests the coordinator answered, by result code."),
		tsoTicks:   b.counter("streamwal.tso.timeticks", "{timetick}", "TimeTicks the coordinator handed out."),
		broadcasts: b.counter("streamwal.broadcasts", "{broadcast}", "Broadcast requests the coordinator finished, by message type and result code."),
		bcastDur:   b.histogram("streamwal.broadcast.duration", "s", "Time from a broadcast request to its last target's append.", latencyBuckets),
		stuck:      b.gauge("streamwal.broadcasts.stuck", "{broadcast}", "Broadcasts stuck now (a target refused them for good)."),
		checkpointAge: b.floatGauge("streamwal.checkpoint.age", "s",
			"Age of the TimeTick of a WAL's last persisted checkpoint, by PChannel."),
		watermarkLag: b.floatGauge("streamwal.watermark.lag", "s",
			"Age of the TimeTick up to which a WAL consumed its log into its recovery state, by PChannel."),
		clientReqs: b.counter("streamwal.client.requests", "{request}", "Append requests a client made to PChannels' owners, by PChannel and result code."),
		clientDur:  b.histogram("streamwal.client.request.duration", "s", "Round trip of a client's append requests, by PChannel.", latencyBuckets),
		truncated:  b.gauge("streamwal.truncation.point", "", "MessageID below which a WAL's stream was last truncated, by PChannel."),
		segments:   b.gauge("streamwal.segments", "{segment}", "Segments of a WAL, by PChannel and state (growing, sealed, flushed)."),
	}
	m.replicationLag = b.observableGauge("streamwal.replication.lag", "s",
		"Time since the source TimeTick through which a secondary holds everything of its primary (computed when read, so it grows while replication is stuck), by PChannel.",
		m.observeReplication)
	if b.err != nil {
		return nil, b.err
	}
	return m, nil
}

// builder creates instruments, keeping the first error.
type builder struct {
	m   metric.Meter
	err error
}

// keep records err if it is the first.
func (b *builder) keep(err error) {
	if b.err == nil && err != nil {
		b.err = streamwal.Errorf(streamwal.CodeInternal, "create instrument: %v", err)
	}
}

// counter creates an Int64Counter.
func (b *builder) counter(name, unit, desc string) metric.Int64Counter {
	c, err := b.m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(err)
	return c
}

// upDown creates an Int64UpDownCounter.
func (b *builder) upDown(name, unit, desc string) metric.Int64UpDownCounter {
	c, err := b.m.Int64UpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(err)
	return c
}

// histogram creates a Float64Histogram with bounds.
func (b *builder) histogram(name, unit, desc string, bounds []float64) metric.Float64Histogram {
	h, err := b.m.Float64Histogram(name, metric.WithUnit(unit), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bounds...))
	b.keep(err)
	return h
}

// intHistogram creates an Int64Histogram with bounds.
func (b *builder) intHistogram(name, unit, desc string, bounds []float64) metric.Int64Histogram {
	h, err := b.m.Int64Histogram(name, metric.WithUnit(unit), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bounds...))
	b.keep(err)
	return h
}

// gauge creates an Int64Gauge.
func (b *builder) gauge(name, unit, desc string) metric.Int64Gauge {
	g, err := b.m.Int64Gauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(err)
	return g
}

// floatGauge creates a Float64Gauge.
func (b *builder) floatGauge(name, unit, desc string) metric.Float64Gauge {
	g, err := b.m.Float64Gauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(err)
	return g
}

// observableGauge creates a Float64ObservableGauge observed by callback.
func (b *builder) observableGauge(name, unit, desc string, callback metric.Float64Callback) metric.Float64ObservableGauge {
	g, err := b.m.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc), metric.WithFloat64Callback(callback))
	b.keep(err)
	return g
}

// pchannel is p's label, built once per PChannel.
func (m *Metrics) pchannel(p streamwal.PChannel) attribute.KeyValue {
	if kv, ok := m.pchannels.Load(p); ok {
		return kv.(attribute.KeyValue)
	}
	kv := attribute.String(keyPChannel, p.String())
	m.pchannels.Store(p, kv)
	return kv
}

// code is the label of a result: OK, or the error's code.
func code(c streamwal.Code) attribute.KeyValue {
	if c == "" {
		return attribute.String(keyCode, codeOK)
	}
	return attribute.String(keyCode, string(c))
}

// errCode is the label of err's result.
func errCode(err error) attribute.KeyValue { return code(streamwal.CodeOf(err)) }

// attrs is a measurement option of kvs.
func attrs(kvs ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(kvs...))
}

// bg is the context of measurements (hooks carry none).
var bg = context.Background()

// OnAppendStart implements telemetry.AppendStartHook.
func (m *Metrics) OnAppendStart(e telemetry.AppendStartEvent) {
	m.inFlight.Add(bg, int64(e.Messages), m.ofPChannel(e.PChannel))
}

// OnAppend implements telemetry.AppendHook. The latency is recorded once
// per run of results, which is once per request for the usual request
// whose messages share a type and a result.
func (m *Metrics) OnAppend(e telemetry.AppendEvent) {
	p := m.ofPChannel(e.PChannel)
	m.inFlight.Add(bg, -int64(e.Messages), p)
	m.appends.Add(bg, int64(e.Messages), m.cached(appendKey{e.PChannel, e.Type, e.Code}, func() []attribute.KeyValue {
		return []attribute.KeyValue{m.pchannel(e.PChannel), attribute.String(keyType, e.Type), code(e.Code)}
	}))
	m.appendDur.Record(bg, e.Latency.Seconds(), p)
}

// OnUnit implements telemetry.UnitHook.
func (m *Metrics) OnUnit(e telemetry.UnitEvent) {
	m.units.Add(bg, 1, m.cached(unitKey{e.PChannel, e.Batch}, func() []attribute.KeyValue {
		kind := "publish"
		if e.Batch {
			kind = "batch"
		}
		return []attribute.KeyValue{m.pchannel(e.PChannel), attribute.String(keyKind, kind)}
	}))
	m.unitSize.Record(bg, int64(e.Messages), m.ofPChannel(e.PChannel))
}

// OnWriterRecovery implements telemetry.WriterRecoveryHook.
func (m *Metrics) OnWriterRecovery(e telemetry.WriterRecoveryEvent) {
	m.recoveries.Add(bg, 1, attrs(m.pchannel(e.PChannel)))
}

// OnFence implements telemetry.FenceHook.
func (m *Metrics) OnFence(e telemetry.FenceEvent) {
	m.fences.Add(bg, 1, attrs(m.pchannel(e.PChannel)))
}

// OnOpen implements telemetry.OpenHook.
func (m *Metrics) OnOpen(e telemetry.OpenEvent) {
	p := m.pchannel(e.PChannel)
	m.opens.Add(bg, 1, attrs(p, errCode(e.Err)))
	if e.Err == nil {
		m.openDur.Record(bg, e.Took.Seconds(), attrs(p))
		m.replayed.Record(bg, int64(e.Replayed), attrs(p))
	}
}

// OnClose implements telemetry.CloseHook.
func (m *Metrics) OnClose(e telemetry.CloseEvent) {
	m.closes.Add(bg, 1, attrs(m.pchannel(e.PChannel), attribute.String(keyReason, e.Reason)))
}

// OnAssign implements telemetry.AssignHook.
func (m *Metrics) OnAssign(e telemetry.AssignEvent) {
	m.assigns.Add(bg, 1, attrs(m.pchannel(e.PChannel), attribute.String(keyState, e.State)))
}

// OnHeartbeat implements telemetry.HeartbeatHook.
func (m *Metrics) OnHeartbeat(e telemetry.HeartbeatEvent) {
	node := attribute.String(keyNode, e.Node)
	m.beats.Add(bg, 1, attrs(node, errCode(e.Err)))
	m.serving.Record(bg, int64(e.Serving), attrs(node))
}

// OnTSO implements telemetry.TSOHook.
func (m *Metrics) OnTSO(e telemetry.TSOEvent) {
	m.tso.Add(bg, 1, attrs(errCode(e.Err)))
	if e.Err == nil {
		m.tsoTicks.Add(bg, int64(e.Count))
	}
}

// OnBroadcast implements telemetry.BroadcastHook.
func (m *Metrics) OnBroadcast(e telemetry.BroadcastEvent) {
	m.broadcasts.Add(bg, 1, attrs(attribute.String(keyType, e.Type), errCode(e.Err)))
	if e.Err == nil {
		m.bcastDur.Record(bg, e.Took.Seconds())
	}
}

// OnBroadcastStuck implements telemetry.BroadcastStuckHook.
func (m *Metrics) OnBroadcastStuck(e telemetry.BroadcastStuckEvent) {
	m.stuck.Record(bg, int64(e.Stuck))
}

// OnStorage implements telemetry.StorageHook.
func (m *Metrics) OnStorage(e telemetry.StorageEvent) {
	p := m.pchannel(e.PChannel)
	m.checkpointAge.Record(bg, e.CheckpointAge.Seconds(), attrs(p))
	m.watermarkLag.Record(bg, e.WatermarkLag.Seconds(), attrs(p))
	m.truncated.Record(bg, int64(e.Truncated), attrs(p))
	for _, s := range []struct {
		state string
		n     int
	}{{"growing", e.Growing}, {"sealed", e.Sealed}, {"flushed", e.Flushed}} {
		m.segments.Record(bg, int64(s.n), attrs(p, attribute.String(keyState, s.state)))
	}
}

// OnClientRequest implements telemetry.ClientRequestHook.
func (m *Metrics) OnClientRequest(e telemetry.ClientRequestEvent) {
	p := m.pchannel(e.PChannel)
	m.clientReqs.Add(bg, 1, attrs(p, code(e.Code)))
	m.clientDur.Record(bg, e.Latency.Seconds(), m.ofPChannel(e.PChannel))
}

// OnReplication implements telemetry.ReplicationHook: it keeps the
// Through of each PChannel a replicator of this process is active for,
// from which streamwal.replication.lag is computed when it is read (so a
// lag keeps growing while replication is stuck, even if the replicator
// reported nothing since); an inactive replicator's PChannel, or one
// whose Through is not known yet, is not exported. (Where several nodes
// of one process share a Metrics, a PChannel that moves between them may
// miss from a scrape until its new replicator's next report, a
// checkpoint interval later.)
func (m *Metrics) OnReplication(e telemetry.ReplicationEvent) {
	if !e.Active || e.Through == 0 {
		m.replication.Delete(e.PChannel)
		return
	}
	m.replication.Store(e.PChannel, e.Through)
}

// observeReplication observes the replication lag of every PChannel
// known: now minus its Through.
func (m *Metrics) observeReplication(_ context.Context, o metric.Float64Observer) error {
	now := time.Now()
	m.replication.Range(func(k, v any) bool {
		p, through := k.(streamwal.PChannel), v.(messages.TimeTick)
		o.Observe(max(now.Sub(through.Physical()), 0).Seconds(), m.ofPChannel(p))
		return true
	})
	return nil
}
