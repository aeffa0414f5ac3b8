package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
)

// TestReplicateAcrossThePrimarysTruncation: the primary truncates as
// soon as it may (serve's --retain 0s, with short intervals) while the
// secondary's node is down; once back, the secondary reads what the
// truncation removed from the primary's archive and holds every message
// of the primary once.
func TestReplicateAcrossThePrimarysTruncation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	east, err := system.Start(ctx, system.Options{Cluster: "east", ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Coord: coord.Config{PChannels: changePChannels},
		Node: node.Config{SyncInterval: testSyncInterval, Recovery: retention(0, storageIntervals{checkpoint: time.Second, truncate: time.Second}),
			Backend: jetstream.Options{DuplicateWindow: 2 * time.Second}}})
	require.NoError(t, err)
	t.Cleanup(east.Close)
	_, err = east.WaitServing(ctx, false)
	require.NoError(t, err)
	eastURL, westSys := east.Server.ClientURL(), namedSystem(t, "west", changePChannels)
	westURL := westSys.Server.ClientURL()
	ec, wc := memberClient(t, "east", eastURL), memberClient(t, "west", westURL)
	_, err = runCmd(t, "", "replicate", "configure", "--primary", "east="+eastURL, "--secondary", "west="+westURL, "--timeout", "20s")
	require.NoError(t, err)
	vs, err := ec.CreateCollection(ctx, client.Collection{DBName: "db", Name: "col", ID: 1, Partitions: []int64{1}})
	require.NoError(t, err)
	want := map[string]int{}
	var lastID messages.MessageID
	write := func(batch string, n int) {
		for i := range n {
			payload := fmt.Sprint(batch, " ", i)
			res, err := ec.AppendBytes(ctx, vs[0], []byte(payload))
			require.NoError(t, err)
			want[payload], lastID = 1, res[0].ID
		}
	}
	write("a", 10)
	waitFor(t, "west's copy of a", func() bool { return len(inserts(t, ctx, wc)) == len(want) })

	for _, n := range westSys.Nodes() {
		westSys.StopNode(n.ID(), true)
	}
	write("b", 50)
	out, err := runCmd(t, "", "collection", "flush", "--server", eastURL, "--cluster", "east", "--id", "1", "--timeout", "30s")
	require.NoError(t, err, out)
	p := vs[0].PChannel().String()
	waitFor(t, "east's truncation past b", func() bool {
		st, err := ec.Status(ctx)
		require.NoError(t, err)
		for _, ch := range st.Channels {
			if ch.PChannel == p {
				return ch.FirstID > lastID
			}
		}
		return false
	})

	_, err = westSys.AddNode(ctx)
	require.NoError(t, err)
	waitFor(t, "west's copy of b", func() bool { return len(inserts(t, ctx, wc)) == len(want) })
	require.Equal(t, want, inserts(t, ctx, wc), "every message of east once, read from its archive")
}
