package embedded_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/embedded"
)

// getJSON fetches url and decodes its JSON body into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	c := &http.Client{Timeout: waitFor}
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, url)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(body, v), "%s: %s", url, body)
}

// jsz is the part of /jsz the tests look at.
type jsz struct {
	Config struct {
		StoreDir   string `json:"store_dir"`
		SyncAlways bool   `json:"sync_always"`
	} `json:"config"`
	Streams int `json:"streams"`
}

// TestMonitoringEndpointServesJSZ starts a server with its monitoring
// endpoint on a free port: /jsz reports the server's JetStream
// configuration and its streams, and the port stays across a restart.
func TestMonitoringEndpointServesJSZ(t *testing.T) {
	s := embedded.StartTest(t, func(o *embedded.Options) { o.HTTPPort = -1; o.SyncAlways = true })
	url := s.MonitorURL()
	require.NotEmpty(t, url)
	_, js := connectJS(t, s.Connect)
	createStream(t, js, 1)

	var got jsz
	getJSON(t, url+"/jsz", &got)
	assert.Equal(t, s.StoreDir()+"/jetstream", got.Config.StoreDir)
	assert.True(t, got.Config.SyncAlways)
	assert.Equal(t, 1, got.Streams)

	require.NoError(t, s.Restart())
	assert.Equal(t, url, s.MonitorURL(), "the monitoring port is kept across a restart")
	var again jsz
	getJSON(t, url+"/jsz", &again)
	assert.Equal(t, 1, again.Streams)
}

// TestMonitoringEndpointIsOffByDefault checks that a server without
// HTTPPort has no monitoring address.
func TestMonitoringEndpointIsOffByDefault(t *testing.T) {
	s := embedded.StartTest(t)
	assert.Empty(t, s.MonitorURL())
	assert.Nil(t, s.NATSServer().MonitorAddr())
}

// TestMonitoringPortIsValidated refuses ports out of range, and a fixed
// port for the members of a cluster (they would all take it).
func TestMonitoringPortIsValidated(t *testing.T) {
	for _, port := range []int{-2, 65536} {
		o := embedded.Options{StoreDir: t.TempDir(), HTTPPort: port}
		require.ErrorIs(t, o.Validate(), embedded.ErrInvalidOptions, "HTTPPort %d", port)
	}
	c := embedded.ClusterOptions{BaseDir: t.TempDir(), Server: embedded.Options{HTTPPort: 8222}}
	require.ErrorIs(t, c.Validate(), embedded.ErrInvalidOptions)
	c.Server.HTTPPort = -1
	require.NoError(t, c.Validate())
}
