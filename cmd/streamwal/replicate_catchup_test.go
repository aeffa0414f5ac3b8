package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// holdsThrough waits until secondary c's checkpoint on every PChannel is
// at or past last (by PChannel index), of source.
func holdsThrough(t *testing.T, ctx context.Context, c *client.Client, source streamwal.Cluster, last []messages.TimeTick) {
	t.Helper()
	waitFor(t, c.Cluster().String()+"'s checkpoints", func() bool {
		st, err := c.ReplicationStatus(ctx)
		require.NoError(t, err)
		n := 0
		for i, ch := range st.Channels {
			if ch.Source == source && ch.TimeTick >= last[i] {
				n++
			}
		}
		return n == len(last)
	})
}

// TestReplicateFailoverBehindSecondary: three clusters, east the
// primary. North's node is down while east takes a second batch, which
// west replicates; east goes down before north is back, so north is
// behind west. After the failover to west, north copies from west what
// it missed of east (west's replicas of it), each message once, and then
// what west takes.
func TestReplicateFailoverBehindSecondary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eastSys, northSys := namedSystem(t, "east", changePChannels), namedSystem(t, "north", changePChannels)
	t.Cleanup(func() {
		if !eastSys.Server.Running() {
			require.NoError(t, eastSys.Server.Restart())
		}
	})
	eastURL, northURL, westURL := eastSys.Server.ClientURL(), northSys.Server.ClientURL(), namedCluster(t, "west", changePChannels)
	east, west, north := memberClient(t, "east", eastURL), memberClient(t, "west", westURL), memberClient(t, "north", northURL)
	_, err := runCmd(t, "", "replicate", "configure", "--primary", "east="+eastURL, "--secondary", "west="+westURL,
		"--secondary", "north="+northURL, "--timeout", "20s")
	require.NoError(t, err)
	vs, err := east.CreateCollection(ctx, client.Collection{DBName: "db", Name: "col", ID: 1, Shards: changePChannels, Partitions: []int64{1}})
	require.NoError(t, err)
	want := map[string]int{}
	last := make([]messages.TimeTick, changePChannels)
	write := func(c *client.Client, batch string, n int) {
		for i := range n {
			v := vs[i%len(vs)]
			payload := fmt.Sprint(batch, " ", i)
			res, err := c.AppendBytes(ctx, v, []byte(payload))
			require.NoError(t, err)
			last[v.PChannel().Index()], want[payload] = res[0].TimeTick, 1
		}
	}
	write(east, "a", 20)
	holdsThrough(t, ctx, west, "east", last)
	holdsThrough(t, ctx, north, "east", last)

	for _, n := range northSys.Nodes() {
		northSys.StopNode(n.ID(), true)
	}
	write(east, "b", 20)
	holdsThrough(t, ctx, west, "east", last)
	eastSys.Server.Shutdown()
	_, err = northSys.AddNode(ctx)
	require.NoError(t, err)
	_, err = northSys.WaitServing(ctx, false)
	require.NoError(t, err)
	require.Less(t, inserts(t, ctx, north)["b 19"], 1, "north is behind west")

	out, err := runCmd(t, "", "replicate", "failover", "--to", "west", "--server", westURL, "--cluster", "west", "--timeout", "30s")
	require.NoError(t, err, out)
	write(west, "c", 20)
	waitFor(t, "north's copy of west", func() bool { return len(inserts(t, ctx, north)) == len(want) })
	require.Equal(t, want, inserts(t, ctx, north), "every message of east and west once")
	require.Equal(t, want, inserts(t, ctx, west))
}
