package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// TestReplicateRejoinAfterFailover: east, the primary, takes three
// writes that west, its node down, never replicates; east goes down and
// west is promoted. East comes back a primary of its old topology: its
// status says a newer topology superseded it. rejoin reports the three
// writes the failover lost and makes east a secondary of west: east
// refuses direct writes naming west, copies what west took since its
// promotion once, and keeps its lost writes, which west never gets.
func TestReplicateRejoinAfterFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eastSys, westSys := namedSystem(t, "east", changePChannels), namedSystem(t, "west", changePChannels)
	eastURL, westURL := eastSys.Server.ClientURL(), westSys.Server.ClientURL()
	east, west := memberClient(t, "east", eastURL), memberClient(t, "west", westURL)
	_, err := runCmd(t, "", "replicate", "configure", "--primary", "east="+eastURL, "--secondary", "west="+westURL, "--timeout", "20s")
	require.NoError(t, err)
	vs, err := east.CreateCollection(ctx, client.Collection{DBName: "db", Name: "col", ID: 1, Partitions: []int64{1}})
	require.NoError(t, err)
	res, err := east.AppendBytes(ctx, vs[0], []byte("a"))
	require.NoError(t, err)
	last := make([]messages.TimeTick, changePChannels)
	last[vs[0].PChannel().Index()] = res[0].TimeTick
	holdsThrough(t, ctx, west, "east", last)

	for _, n := range westSys.Nodes() {
		westSys.StopNode(n.ID(), true)
	}
	for i := range 3 {
		_, err = east.AppendBytes(ctx, vs[0], []byte(fmt.Sprint("lost ", i)))
		require.NoError(t, err)
	}
	eastSys.Server.Shutdown()
	_, err = westSys.AddNode(ctx)
	require.NoError(t, err)
	_, err = westSys.WaitServing(ctx, false)
	require.NoError(t, err)
	out, err := runCmd(t, "", "replicate", "failover", "--to", "west", "--server", westURL, "--cluster", "west", "--timeout", "30s")
	require.NoError(t, err, out)
	_, err = west.AppendBytes(ctx, vs[0], []byte("w"))
	require.NoError(t, err)

	require.NoError(t, eastSys.Server.Restart())
	_, err = eastSys.WaitServing(ctx, false)
	require.NoError(t, err)
	out, err = runCmd(t, "", "replicate", "status", "--server", eastURL, "--cluster", "east")
	require.NoError(t, err)
	require.Contains(t, out, "superseded:  west holds topology version")
	require.Contains(t, out, "role:        primary")
	out, err = runCmd(t, "", "replicate", "status", "--server", eastURL, "--cluster", "east", "--json")
	require.NoError(t, err)
	var rep replicationReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.NotNil(t, rep.Superseded)
	require.Equal(t, streamwal.Cluster("west"), rep.Superseded.Primary)

	_, err = runCmd(t, "", "replicate", "rejoin", "west="+westURL, "--server", westURL, "--cluster", "west")
	require.ErrorContains(t, err, "member of the topology already")
	out, err = runCmd(t, "", "replicate", "rejoin", "east="+eastURL, "--server", westURL, "--cluster", "west", "--json", "--timeout", "30s")
	require.NoError(t, err, out)
	var ch changed
	require.NoError(t, json.Unmarshal([]byte(out), &ch), out)
	require.Equal(t, streamwal.Cluster("west"), ch.Primary)
	require.Len(t, ch.Members, 2)
	lost := 0
	for _, l := range ch.Lost {
		lost += l.Messages
	}
	require.Equal(t, 3, lost, "%+v", ch.Lost)

	_, err = east.AppendBytes(ctx, vs[0], []byte("direct"))
	p, ok := streamwal.PrimaryOf(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, streamwal.Cluster("west"), p)
	waitFor(t, "east's copy of west", func() bool { return inserts(t, ctx, east)["w"] == 1 })
	require.Equal(t, map[string]int{"a": 1, "lost 0": 1, "lost 1": 1, "lost 2": 1, "w": 1}, inserts(t, ctx, east))
	require.Equal(t, map[string]int{"a": 1, "w": 1}, inserts(t, ctx, west))
	out, err = runCmd(t, "", "replicate", "status", "--server", eastURL, "--cluster", "east")
	require.NoError(t, err)
	require.NotContains(t, out, "superseded")
	require.Contains(t, out, "role:        secondary")
}
