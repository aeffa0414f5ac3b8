package system_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/services/coord"
)

// fetch returns url's status and body.
func fetch(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestSystemEndpoint: with MetricsAddr, a system serves its components'
// metrics and its readiness, which it loses when its node goes away.
func TestSystemEndpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sys, err := system.Start(ctx, system.Options{Cluster: "ep", MetricsAddr: "127.0.0.1:0",
		ServerOptions: embedded.Options{StoreDir: t.TempDir()}, Coord: coord.Config{PChannels: 2}})
	require.NoError(t, err)
	defer sys.Close()
	base := "http://" + sys.MetricsAddr()
	_, err = sys.WaitServing(ctx, false)
	require.NoError(t, err)
	require.Eventually(t, func() bool { code, _ := fetch(t, base+"/readyz"); return code == http.StatusOK },
		10*time.Second, 10*time.Millisecond, "ready once every PChannel is served")
	code, body := fetch(t, base+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `streamwal_pchannel_opens_total{code="OK",pchannel="pchan-0"} 1`)
	serving := `streamwal_serving_pchannels{node="` + string(sys.Nodes()[0].ID()) + `"} 2`
	require.Eventually(t, func() bool { _, body := fetch(t, base+"/metrics"); return strings.Contains(body, serving) },
		10*time.Second, 10*time.Millisecond, "the node's heartbeat reports %s", serving)

	sys.StopNode(sys.Nodes()[0].ID(), false)
	require.Eventually(t, func() bool {
		code, body := fetch(t, base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "not served")
	}, 10*time.Second, 10*time.Millisecond, "not ready once no node serves")
}
