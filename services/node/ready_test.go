package node_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/telemetry/endpoint"
)

// readyz returns the status code and body of GET url.
func readyz(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// waitReadyz waits until GET url answers code, and returns the body.
func waitReadyz(t *testing.T, url string, code int) string {
	t.Helper()
	var got int
	var body string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got, body = readyz(t, url); got == code {
			return body
		}
	}
	t.Fatalf("%s never answered %d; last %d: %s", url, code, got, body)
	return ""
}

// TestReadinessFollowsTheActiveCoordinator: a node of a cluster whose
// buckets exist but whose coordinator is not running is not ready, though
// it heartbeats; once a coordinator runs and the node serves what it
// assigned, it is; when the coordinator gives its lease up, or crashes
// and its lease lapses, the node is not ready until another one takes
// over.
func TestReadinessFollowsTheActiveCoordinator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const cluster = streamwal.Cluster("ready")
	const leaseTTL = time.Second
	srv := embedded.StartTest(t)
	nc, err := srv.Connect()
	require.NoError(t, err)
	defer nc.Close()
	js, err := njs.New(nc)
	require.NoError(t, err)
	_, err = coord.Provision(ctx, js, cluster, 1, leaseTTL)
	require.NoError(t, err, "the cluster exists, with no coordinator")
	codec, err := messages.NewCodec(cluster, nil)
	require.NoError(t, err)
	n, err := node.Start(ctx, node.Config{Conn: nc, Codec: codec, ID: "n1"})
	require.NoError(t, err)
	defer n.Close()
	ep, err := endpoint.Start(endpoint.Options{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	defer ep.Close()
	ep.SetReady(n.Ready)
	url := fmt.Sprintf("http://%s/readyz", ep.Addr())

	code, body := readyz(t, url)
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "no coordinator holds the lease")
	require.ErrorIs(t, n.Ready(), node.ErrNotReady)

	startCoord := func(id string) *coord.Coordinator {
		c, err := coord.Start(ctx, coord.Config{Conn: nc, Cluster: cluster, ID: id, PChannels: 2, LeaseTTL: leaseTTL})
		require.NoError(t, err)
		return c
	}
	c1 := startCoord("c1")
	waitReadyz(t, url, http.StatusOK)
	for _, p := range []string{"pchan-0", "pchan-1"} {
		pc, err := streamwal.ParsePChannel(p)
		require.NoError(t, err)
		_, ok := n.WAL(pc)
		require.True(t, ok, "ready: it serves %s, the one node's", p)
	}

	require.NoError(t, c1.Close(), "gives its lease up")
	body = waitReadyz(t, url, http.StatusServiceUnavailable)
	require.Contains(t, body, "no coordinator holds the lease")

	c2 := startCoord("c2")
	waitReadyz(t, url, http.StatusOK)
	c2.Crash() // keeps its lease, which lapses
	body = waitReadyz(t, url, http.StatusServiceUnavailable)
	require.Contains(t, body, "lease")

	c3 := startCoord("c3")
	defer c3.Close()
	waitReadyz(t, url, http.StatusOK)
}

// TestRestartedNodeIsReadyOnlyServing: a node restarted under its ID
// (gracefully, then as after a crash) serves nothing of what it served
// before; whenever it says it is ready it serves every PChannel, the
// cluster's only node, and it does get ready.
func TestRestartedNodeIsReadyOnlyServing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sys, err := system.Start(ctx, system.Options{Cluster: "restart", ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Coord: coord.Config{PChannels: 2}})
	require.NoError(t, err)
	defer sys.Close()
	v, err := sys.WaitServing(ctx, false)
	require.NoError(t, err)
	id := sys.Nodes()[0].ID()
	for _, crash := range []bool{false, true} {
		sys.StopNode(id, crash)
		n, err := sys.StartNode(ctx, id)
		require.NoError(t, err)
		var ready error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if ready = n.Ready(); ready != nil {
				continue
			}
			for _, a := range v.Channels {
				p, err := streamwal.ParsePChannel(a.PChannel)
				require.NoError(t, err)
				_, ok := n.WAL(p)
				require.True(t, ok, "ready (crash %v) but not serving %s", crash, p)
			}
			break
		}
		require.NoError(t, ready, "crash %v", crash)
	}
}
