package replicate_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// replicatorConns are the connections sec's replicators hold to prim's
// server, by name: a replicator that starts again opens a new one.
func replicatorConns(t *testing.T, prim *cluster, sec streamwal.Cluster) map[string]uint64 {
	t.Helper()
	cz, err := prim.sys.Server.NATSServer().Connz(&server.ConnzOptions{Limit: 1024})
	require.NoError(t, err)
	out := map[string]uint64{}
	for _, c := range cz.Conns {
		if strings.HasPrefix(c.Name, "streamwal-replicator-"+string(sec)+"-") {
			out[c.Name] = c.Cid
		}
	}
	return out
}

// startsAt is where a configuration landed on each PChannel, by index.
func startsAt(t *testing.T, m messages.ReplicateMember, res client.BroadcastResult) []messages.MessageID {
	t.Helper()
	out := make([]messages.MessageID, len(m.PChannels))
	for i, name := range m.PChannels {
		require.Contains(t, res.Appended, name)
		out[i] = res.Appended[name].ID
	}
	return out
}

// TestTopologyChangesAndTheReplicator: a secondary whose edge starts at
// the configuration that added it copies only what the primary took
// from there on; a newer topology that leaves its source as it is does
// not restart its replicators, and an older one is refused and changes
// nothing.
func TestTopologyChangesAndTheReplicator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prim, sec := startCluster(t, "prim"), startCluster(t, "sec")
	w := newWorkload(t, ctx, prim.c, 1, 1)
	w.write(t, ctx, "before", 2, 5)

	pm, sm := prim.member(ctx), sec.member(ctx)
	topo := messages.Star(pm, sm)
	topo.Version = 1
	res, err := prim.c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)
	start := startsAt(t, pm, res)
	topo.Edges[0].Start = start
	_, err = sec.c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)

	// Only what follows the configuration: a collection created after it
	// and its writes.
	after := newWorkload(t, ctx, prim.c, 2, 1)
	after.write(t, ctx, "after", 2, 5)
	waitCopyFrom(t, ctx, prim, sec, start)
	conns := replicatorConns(t, prim, "sec")
	require.Len(t, conns, pchannels)

	// A third member joins (it need not exist for this): sec's source
	// stays prim, and its replicators go on as they were.
	third := sm
	third.Cluster, third.URL = "third", "nats://127.0.0.1:1"
	grown := messages.Star(pm, sm, third)
	grown.Version = 2
	grown.Edges[0].Start = start
	_, err = sec.c.ConfigureReplication(ctx, grown)
	require.NoError(t, err)
	after.write(t, ctx, "grown", 1, 5)
	waitCopyFrom(t, ctx, prim, sec, start)

	// The first topology again, late: refused; nothing moves.
	_, err = sec.c.ConfigureReplication(ctx, topo)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.ErrorContains(t, err, "older")
	got, _, err := sec.c.ReplicationTopology(ctx)
	require.NoError(t, err)
	require.Equal(t, grown, got)
	require.Equal(t, conns, replicatorConns(t, prim, "sec"), "a replicator started again")
}

// waitCopyFrom waits until sec holds exactly prim's replicable messages
// from start (by PChannel index) on.
func waitCopyFrom(t *testing.T, ctx context.Context, prim, sec *cluster, start []messages.MessageID) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for i := range pchannels {
		for {
			var want []entry
			for _, e := range prim.log(ctx, i, true) {
				if e.ID >= start[i] {
					want = append(want, e)
				}
			}
			got := sec.log(ctx, i, false)
			if equalEntries(want, got) {
				break
			}
			require.False(t, time.Now().After(deadline), "pchannel %d: want %v, got %v", i, want, got)
			time.Sleep(50 * time.Millisecond)
		}
	}
}
