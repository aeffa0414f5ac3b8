package endpoint_test

import (
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
	"github.com/streamwal/streamwal/telemetry/endpoint"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks).
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }

// get fetches url and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// scrape parses the endpoint's /metrics.
func scrape(t *testing.T, e *endpoint.Endpoint) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + e.Addr() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// value is the value of the family's sample whose labels include want
// (a counter's, a gauge's or a histogram's count); ok false if none.
func value(f *dto.MetricFamily, want map[string]string) (float64, bool) {
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// TestMetricsInPrometheusFormat: hook events show up on /metrics under
// streamwal_* names with Prometheus units and bounded labels.
func TestMetricsInPrometheusFormat(t *testing.T) {
	e, err := endpoint.Start(endpoint.Options{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	defer e.Close()
	p, _ := streamwal.NewPChannel("pchan", 3)
	hooks := telemetry.Hooks{e.Metrics()}
	hooks.OnAppendStart(telemetry.AppendStartEvent{PChannel: p, Messages: 5})
	hooks.OnAppend(telemetry.AppendEvent{PChannel: p, Type: "Insert", Messages: 4, Latency: 3 * time.Millisecond})
	hooks.OnAppend(telemetry.AppendEvent{PChannel: p, Type: "Insert", Code: streamwal.CodeInvalidArgument, Messages: 1, Latency: 3 * time.Millisecond})
	hooks.OnUnit(telemetry.UnitEvent{PChannel: p, Messages: 4, Batch: true})
	hooks.OnOpen(telemetry.OpenEvent{PChannel: p, Term: 2, Replayed: 10, Took: time.Second})
	hooks.OnOpen(telemetry.OpenEvent{PChannel: p, Term: 1, Err: streamwal.Errorf(streamwal.CodeFenced, "fenced")})
	hooks.OnHeartbeat(telemetry.HeartbeatEvent{Node: "node-1", Serving: 7})
	hooks.OnTSO(telemetry.TSOEvent{Count: 16})
	hooks.OnStorage(telemetry.StorageEvent{PChannel: p, CheckpointAge: 1500 * time.Millisecond, WatermarkLag: 250 * time.Millisecond, Truncated: 42, Growing: 2})
	hooks.OnBroadcastStuck(telemetry.BroadcastStuckEvent{Stuck: 1})

	fams := scrape(t, e)
	pl := map[string]string{"pchannel": "pchan-3"}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"streamwal_appends_total", map[string]string{"pchannel": "pchan-3", "type": "Insert", "code": "OK"}, 4},
		{"streamwal_appends_total", map[string]string{"pchannel": "pchan-3", "type": "Insert", "code": "INVALID_ARGUMENT"}, 1},
		{"streamwal_appends_in_flight", pl, 0},
		{"streamwal_append_duration_seconds", pl, 2},
		{"streamwal_append_units_total", map[string]string{"pchannel": "pchan-3", "kind": "batch"}, 1},
		{"streamwal_append_unit_size", pl, 1},
		{"streamwal_pchannel_opens_total", map[string]string{"pchannel": "pchan-3", "code": "OK"}, 1},
		{"streamwal_pchannel_opens_total", map[string]string{"pchannel": "pchan-3", "code": "CHANNEL_FENCED"}, 1},
		{"streamwal_pchannel_open_duration_seconds", pl, 1},
		{"streamwal_serving_pchannels", map[string]string{"node": "node-1"}, 7},
		{"streamwal_node_heartbeats_total", map[string]string{"node": "node-1", "code": "OK"}, 1},
		{"streamwal_tso_allocations_total", map[string]string{"code": "OK"}, 1},
		{"streamwal_tso_timeticks_total", nil, 16},
		{"streamwal_checkpoint_age_seconds", pl, 1.5},
		{"streamwal_watermark_lag_seconds", pl, 0.25},
		{"streamwal_truncation_point", pl, 42},
		{"streamwal_segments", map[string]string{"pchannel": "pchan-3", "state": "growing"}, 2},
		{"streamwal_broadcasts_stuck", nil, 1},
	} {
		got, ok := value(fams[c.name], c.labels)
		require.True(t, ok, "%s%v is exported", c.name, c.labels)
		require.Equal(t, c.want, got, "%s%v", c.name, c.labels)
	}
	require.Contains(t, fams, "go_goroutines", "the Go runtime's metrics")
}

// TestHealthReadinessAndPprof: /healthz answers while the process runs,
// /readyz follows the check (503 until one is set), pprof only when
// asked.
func TestHealthReadinessAndPprof(t *testing.T) {
	e, err := endpoint.Start(endpoint.Options{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	base := "http://" + e.Addr()
	code, _ := get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get(t, base+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "starting")
	e.SetReady(func() error { return errors.New("pchan-1 not served") })
	code, body = get(t, base+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "pchan-1 not served")
	e.SetReady(func() error { return nil })
	code, _ = get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code)
	code, _ = get(t, base+"/debug/pprof/")
	require.Equal(t, http.StatusNotFound, code)
	require.NoError(t, e.Close())

	e, err = endpoint.Start(endpoint.Options{Addr: "127.0.0.1:0", Pprof: true})
	require.NoError(t, err)
	defer e.Close()
	code, body = get(t, "http://"+e.Addr()+"/debug/pprof/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "goroutine")
}

// TestBadAddressIsRefused: an address that cannot be listened on is an
// invalid argument.
func TestBadAddressIsRefused(t *testing.T) {
	_, err := endpoint.Start(endpoint.Options{Addr: "no-such-host.invalid:x"})
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
}

// TestReplicationLagGrowsWhenScraped: streamwal_replication_lag_seconds,
// by PChannel alone, is the time since the Through of the last event of
// an active replicator, computed at each scrape (so it grows with no
// event in between); a PChannel whose Through is unknown, or whose
// replicator stopped, has none.
func TestReplicationLagGrowsWhenScraped(t *testing.T) {
	e, err := endpoint.Start(endpoint.Options{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	defer e.Close()
	p, _ := streamwal.NewPChannel("pchan", 0)
	q, _ := streamwal.NewPChannel("pchan", 1)
	hooks := telemetry.Hooks{e.Metrics()}
	const name = "streamwal_replication_lag_seconds"
	require.NotContains(t, scrape(t, e), name, "no lag before a replicator reports")

	through := messages.TimeTickAt(time.Now().Add(-5 * time.Second))
	hooks.OnReplication(telemetry.ReplicationEvent{PChannel: p, Active: true, Source: "prim", Through: through, SourceTimeTick: through})
	hooks.OnReplication(telemetry.ReplicationEvent{PChannel: q, Active: true, Source: "prim"})
	fams := scrape(t, e)
	require.Equal(t, dto.MetricType_GAUGE, fams[name].GetType())
	require.Len(t, fams[name].GetMetric(), 1, "only the PChannel whose Through is known")
	first, ok := value(fams[name], map[string]string{"pchannel": "pchan-0"})
	require.True(t, ok)
	require.Len(t, fams[name].GetMetric()[0].GetLabel(), 1, "labelled by pchannel alone")
	require.GreaterOrEqual(t, first, 5.0)
	require.Less(t, first, 5.0+time.Since(through.Physical()).Seconds())

	// No event since: the lag still grows, scrape after scrape.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, ok := value(scrape(t, e)[name], map[string]string{"pchannel": "pchan-0"})
		require.True(t, ok)
		if got > first {
			break
		}
		require.False(t, time.Now().After(deadline), "the lag stayed at %v", got)
		time.Sleep(10 * time.Millisecond)
	}

	hooks.OnReplication(telemetry.ReplicationEvent{PChannel: p})
	require.NotContains(t, scrape(t, e), name, "a stopped replicator's PChannel has no lag")
}
