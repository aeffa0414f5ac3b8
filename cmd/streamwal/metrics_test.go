package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"syscall"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/messages"
)

// metricsLine is the line that says where a process serves its metrics.
var metricsLine = regexp.MustCompile(`http://(\S+)/metrics`)

// waitMetricsAddr waits until p printed where it serves its metrics.
func waitMetricsAddr(t *testing.T, p *serveProc) string {
	t.Helper()
	out := p.waitOutput(componentTimeout, "/metrics")
	m := metricsLine.FindStringSubmatch(out)
	require.NotNil(t, m, "no metrics address in %q", out)
	return "http://" + m[1]
}

// httpGet returns url's status and body.
func httpGet(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// waitHTTPStatus waits until url answers code.
func waitHTTPStatus(t *testing.T, url string, code int) {
	t.Helper()
	var last string
	err := pollUntil(componentTimeout, func() (bool, error) {
		got, body, err := httpGet(url)
		last = body
		return err == nil && got == code, nil
	})
	require.NoError(t, err, "%s never answered %d (last: %q)", url, code, last)
}

// scrapeMetrics parses base's /metrics with the Prometheus text parser.
func scrapeMetrics(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// sumMetric adds up the values of the family's samples whose labels
// include want (counters and gauges).
func sumMetric(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	var sum float64
next:
	for _, m := range fams[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return sum
}

// TestServeMetricsAndReadiness: `serve --metrics-addr` answers /healthz,
// is ready once it serves, and its counters move by exactly the appends
// made (issue 16's "done when").
func TestServeMetricsAndReadiness(t *testing.T) {
	p := startServe(t, t.TempDir(), "--pchannels", "2", "--metrics-addr", "127.0.0.1:0")
	url := p.waitURL(componentTimeout)
	base := waitMetricsAddr(t, p)
	code, _, err := httpGet(base + "/healthz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	p.waitOutput(componentTimeout, "Press Ctrl-C to stop.")
	waitHTTPStatus(t, base+"/readyz", http.StatusOK)

	c := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), componentTimeout)
	defer cancel()
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "db", Name: "metrics", ID: 1})
	require.NoError(t, err)
	inserts := map[string]string{"type": messages.TypeInsert.Name, "code": "OK"}
	before := scrapeMetrics(t, base)
	const n = 25
	for i := range n {
		m, err := c.Codec().New(messages.TypeInsert, vs[0], []byte{byte(i)})
		require.NoError(t, err)
		_, err = c.Append(ctx, m)
		require.NoError(t, err)
	}
	after := scrapeMetrics(t, base)
	require.Equal(t, float64(n), sumMetric(after, "streamwal_appends_total", inserts)-sumMetric(before, "streamwal_appends_total", inserts))
	require.Zero(t, sumMetric(after, "streamwal_appends_in_flight", nil), "nothing in flight once every append returned")
	require.Equal(t, float64(2), sumMetric(after, "streamwal_pchannel_opens_total", map[string]string{"code": "OK"}))
	require.Positive(t, sumMetric(after, "streamwal_append_units_total", nil)-sumMetric(before, "streamwal_append_units_total", nil))
	require.Positive(t, sumMetric(after, "streamwal_tso_allocations_total", map[string]string{"code": "OK"}))
	require.Contains(t, after, "streamwal_append_duration_seconds")
}

// TestComponentReadiness: a node is not ready while no coordinator has
// created its cluster, and both components are once it serves; once the
// coordinator stops, the node is not ready again.
func TestComponentReadiness(t *testing.T) {
	srv := embedded.StartTest(t)
	url := srv.ClientURL()
	node := startProcess(t, nil, "node", "--server", url, "--id", "n1", "--metrics-addr", "127.0.0.1:0")
	nodeBase := waitMetricsAddr(t, node)
	code, _, err := httpGet(nodeBase + "/healthz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	code, body, err := httpGet(nodeBase + "/readyz")
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, code, "no coordinator yet: %s", body)

	coord := startProcess(t, nil, "coord", "--server", url, "--pchannels", "2", "--metrics-addr", "127.0.0.1:0", "--pprof")
	coordBase := waitMetricsAddr(t, coord)
	waitHTTPStatus(t, coordBase+"/readyz", http.StatusOK)
	node.waitOutput(componentTimeout, "Press Ctrl-C to stop.")
	assigned := map[string]string{"state": "ASSIGNED"}
	err = pollUntil(componentTimeout, func() (bool, error) {
		return sumMetric(scrapeMetrics(t, coordBase), "streamwal_assignment_changes_total", assigned) == 2, nil
	})
	require.NoError(t, err, "the coordinator never counted both PChannels assigned")
	waitHTTPStatus(t, nodeBase+"/readyz", http.StatusOK)
	nodeFams := scrapeMetrics(t, nodeBase)
	require.Equal(t, float64(2), sumMetric(nodeFams, "streamwal_pchannel_opens_total", map[string]string{"code": "OK"}))
	code, _, err = httpGet(coordBase + "/debug/pprof/")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "--pprof serves the profiler")
	code, _, err = httpGet(nodeBase + "/debug/pprof/")
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, code, "no profiler without --pprof")

	coord.stop(syscall.SIGTERM) // gives its lease up
	waitHTTPStatus(t, nodeBase+"/readyz", http.StatusServiceUnavailable)
	_, body, err = httpGet(nodeBase + "/readyz")
	require.NoError(t, err)
	require.Contains(t, body, "no coordinator holds the lease")
}

// TestMetricsAddrIsChecked: a malformed --metrics-addr, or --pprof
// without it, is refused before anything starts.
func TestMetricsAddrIsChecked(t *testing.T) {
	out, err := runBinary(t, "", "coord", "--server", "nats://127.0.0.1:1", "--metrics-addr", "localhost")
	require.Error(t, err, out)
	require.Contains(t, err.Error(), `--metrics-addr "localhost": want HOST:PORT`)
	out, err = runBinary(t, "", "serve", "--data-dir", t.TempDir(), "--pprof")
	require.Error(t, err, out)
	require.Contains(t, err.Error(), "--pprof needs --metrics-addr")
}
