package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
)

// namedCluster starts cluster name of pchannels PChannels on a server of
// its own and returns its URL.
func namedCluster(t *testing.T, name streamwal.Cluster, pchannels int) string {
	t.Helper()
	return namedSystem(t, name, pchannels).Server.ClientURL()
}

// namedSystem starts cluster name of pchannels PChannels on a server of
// its own.
func namedSystem(t *testing.T, name streamwal.Cluster, pchannels int) *system.System {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sys, err := system.Start(ctx, system.Options{Cluster: name, ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Coord: coord.Config{PChannels: pchannels}, Node: node.Config{SyncInterval: testSyncInterval}})
	require.NoError(t, err)
	t.Cleanup(sys.Close)
	_, err = sys.WaitServing(ctx, false)
	require.NoError(t, err)
	return sys
}

func TestReplicateConfigureAndStatus(t *testing.T) {
	east, west, north := namedCluster(t, "east", 2), namedCluster(t, "west", 2), namedCluster(t, "north", 3)

	_, err := runCmd(t, "", "replicate", "configure", "--primary", "east="+east, "--secondary", "north="+north, "--timeout", "20s")
	require.ErrorIs(t, err, streamwal.ErrPChannelCountMismatch)
	_, err = runCmd(t, "", "replicate", "configure", "--secondary", "west="+west)
	require.ErrorContains(t, err, "--primary")
	_, err = runCmd(t, "", "replicate", "configure", "--primary", "east")
	require.ErrorContains(t, err, "NAME=URL")

	out, err := runCmd(t, "", "replicate", "configure", "--primary", "east="+east, "--secondary", "west="+west, "--timeout", "20s")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^east: primary, 2 pchannels \(broadcast \d+\)\nwest: secondary, 2 pchannels`, out)

	// The secondary reports a replicator per PChannel, caught up with the
	// (idle) primary.
	deadline := time.Now().Add(20 * time.Second)
	var st client.ReplicationStatus
	for {
		out, err = runCmd(t, "", "replicate", "status", "--server", west, "--cluster", "west", "--json")
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal([]byte(out), &st))
		caughtUp := len(st.Channels) == 2
		for _, ch := range st.Channels {
			caughtUp = caughtUp && ch.LagKnown && ch.Lag < 2*time.Second && ch.Source == "east"
		}
		if caughtUp {
			break
		}
		require.False(t, time.Now().After(deadline), "replication status: %s", out)
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, messages.RoleSecondary, st.Role)
	require.Equal(t, streamwal.Cluster("east"), st.Topology.Primary)

	out, err = runCmd(t, "", "replicate", "status", "--server", west, "--cluster", "west")
	require.NoError(t, err)
	require.Contains(t, out, "role:        secondary")
	require.Contains(t, out, "east/pchan-1")
	out, err = runCmd(t, "", "replicate", "status", "--server", east, "--cluster", "east")
	require.NoError(t, err)
	require.Contains(t, out, "role:        primary")
	require.False(t, strings.Contains(out, "PCHANNEL"), "a primary has no replicators: %s", out)
	out, err = runCmd(t, "", "replicate", "status", "--server", north, "--cluster", "north")
	require.NoError(t, err)
	require.Contains(t, out, "not configured")
}

// TestReplicateConfigureStarts: a new secondary starts at the
// configuration that adds it, which is refused while it lacks the
// primary's collections; with --copy-history it copies the primary's
// whole log. A secondary that follows the primary already goes on where
// it is when another is added.
func TestReplicateConfigureStarts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eastURL, westURL, northURL := namedCluster(t, "east", changePChannels), namedCluster(t, "west", changePChannels), namedCluster(t, "north", changePChannels)
	east, west, north := memberClient(t, "east", eastURL), memberClient(t, "west", westURL), memberClient(t, "north", northURL)
	col := client.Collection{DBName: "db", Name: "col", ID: 1, Partitions: []int64{1}}
	vs, err := east.CreateCollection(ctx, col)
	require.NoError(t, err)
	_, err = east.AppendBytes(ctx, vs[0], []byte("before"))
	require.NoError(t, err)

	out, err := runCmd(t, "", "replicate", "configure", "--primary", "east="+eastURL, "--secondary", "west="+westURL, "--timeout", "20s")
	require.ErrorContains(t, err, "--copy-history", out)
	topo, ok, err := east.ReplicationTopology(ctx)
	require.NoError(t, err)
	require.False(t, ok, "a refused configuration changes nothing: %+v", topo)
	out, err = runCmd(t, "", "replicate", "configure", "--primary", "east="+eastURL, "--secondary", "west="+westURL, "--copy-history", "--timeout", "20s")
	require.NoError(t, err)
	require.Contains(t, out, "west: secondary, 2 pchannels")
	require.Contains(t, out, "copies the primary's whole readable log")
	waitFor(t, "west's copy of east's history", func() bool { return inserts(t, ctx, west)["before"] == 1 })

	// North holds the collection already (restored, say): it starts at
	// the configuration, and west goes on.
	_, err = north.CreateCollection(ctx, col)
	require.NoError(t, err)
	out, err = runCmd(t, "", "replicate", "configure", "--primary", "east="+eastURL, "--secondary", "west="+westURL,
		"--secondary", "north="+northURL, "--timeout", "20s")
	require.NoError(t, err)
	require.Contains(t, out, "west: secondary, 2 pchannels")
	require.Contains(t, out, "goes on where it is")
	require.Contains(t, out, "north: secondary, 2 pchannels")
	require.Contains(t, out, "starts at this configuration")
	_, err = east.AppendBytes(ctx, vs[0], []byte("after"))
	require.NoError(t, err)
	waitFor(t, "north's copy of what east took since", func() bool { return inserts(t, ctx, north)["after"] == 1 })
	require.Equal(t, map[string]int{"after": 1}, inserts(t, ctx, north), "north starts at the configuration")
	waitFor(t, "west's copy", func() bool { return inserts(t, ctx, west)["after"] == 1 })
	require.Equal(t, map[string]int{"before": 1, "after": 1}, inserts(t, ctx, west))
	for _, c := range []*client.Client{east, west, north} {
		topo, _, err := c.ReplicationTopology(ctx)
		require.NoError(t, err)
		e, ok := topo.Edge("north")
		require.True(t, ok)
		require.Len(t, e.Start, changePChannels, "%s records where north starts", c.Cluster())
		e, _ = topo.Edge("west")
		require.Empty(t, e.Start, "%s: west copies from the first message", c.Cluster())
	}
}
