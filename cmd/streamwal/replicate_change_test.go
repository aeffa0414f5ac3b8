package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// changePChannels is the PChannel count of the clusters of these tests.
const changePChannels = 2

// memberClient is a client of cluster name at url.
func memberClient(t *testing.T, name streamwal.Cluster, url string) *client.Client {
	t.Helper()
	c, err := client.Connect(url, client.WithCluster(name), client.WithoutLocalBypass())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// inserts counts the payloads of the Inserts in c's log, replicas and
// direct writes alike, over every PChannel.
func inserts(t *testing.T, ctx context.Context, c *client.Client) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i := range changePChannels {
		p, err := streamwal.NewPChannel("pchan", i)
		require.NoError(t, err)
		sc, err := c.Read(ctx, client.ReadOptions{PChannel: p, Types: []*messages.Type{messages.TypeInsert}, UntilNow: true})
		require.NoError(t, err)
		for {
			m, err := sc.Next(ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			out[string(m.Payload())]++
		}
		require.NoError(t, sc.Close())
	}
	return out
}

// waitFor polls cond every 50 ms until it holds, failing after 20 s with
// what describe says.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		require.False(t, time.Now().After(deadline), "waiting for %s", what)
		time.Sleep(50 * time.Millisecond)
	}
}

// changeWriter appends inserts to whichever cluster it was last told is
// the primary, following NOT_PRIMARY.
type changeWriter struct {
	clients map[streamwal.Cluster]*client.Client
	v       streamwal.VChannel
	g       int

	mu    sync.Mutex
	at    streamwal.Cluster
	acked map[streamwal.Cluster][]string // payloads acknowledged, by cluster
	told  map[streamwal.Cluster]streamwal.Cluster
}

// run appends until stop is closed; a write refused with NOT_PRIMARY is
// written again on the primary the error names. Any other error is the
// test's failure.
func (w *changeWriter) run(t *testing.T, ctx context.Context, stop <-chan struct{}) {
	for i := 0; ; {
		select {
		case <-stop:
			return
		default:
		}
		w.mu.Lock()
		at := w.at
		w.mu.Unlock()
		payload := fmt.Sprintf("w%d-%d", w.g, i)
		c := w.clients[at]
		m, err := c.Codec().New(messages.TypeInsert, w.v, []byte(payload), messages.WithDML(1, 1))
		if err == nil {
			_, err = c.Append(ctx, m)
		}
		primary, redirected := streamwal.PrimaryOf(err)
		w.mu.Lock()
		switch {
		case err == nil:
			w.acked[at] = append(w.acked[at], payload)
			i++
		case redirected:
			w.told[at], w.at = primary, primary
		}
		w.mu.Unlock()
		if err != nil && !redirected {
			t.Errorf("writer %d on %s: %v", w.g, at, err)
			return
		}
		if redirected {
			time.Sleep(10 * time.Millisecond) // a writer's pause before it writes again elsewhere
		}
	}
}

// ackedOn is how many writes w had acknowledged by cluster c.
func (w *changeWriter) ackedOn(c streamwal.Cluster) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked[c])
}

// TestReplicateSwitchover: a switchover whose secondary cannot catch up
// (its node is down) is abandoned and the primary takes writes again.
// Then writers append to the primary while a switchover runs through the
// command. They are refused with NOT_PRIMARY naming the new primary and
// go on there; every write acknowledged by either cluster is in the new
// primary's log exactly once and nothing else is; the old primary is the
// new one's secondary and copies what it takes, and refuses direct
// writes.
func TestReplicateSwitchover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eastURL, westSys := namedCluster(t, "east", changePChannels), namedSystem(t, "west", changePChannels)
	westURL := westSys.Server.ClientURL()
	east, west := memberClient(t, "east", eastURL), memberClient(t, "west", westURL)
	_, err := runCmd(t, "", "replicate", "configure", "--primary", "east="+eastURL, "--secondary", "west="+westURL, "--timeout", "20s")
	require.NoError(t, err)
	vs, err := east.CreateCollection(ctx, client.Collection{DBName: "db", Name: "col", ID: 1, Partitions: []int64{1}})
	require.NoError(t, err)

	_, err = runCmd(t, "", "replicate", "switchover", "--server", eastURL, "--cluster", "east")
	require.ErrorContains(t, err, "--to")
	_, err = runCmd(t, "", "replicate", "switchover", "--to", "east", "--server", eastURL, "--cluster", "east")
	require.ErrorContains(t, err, "not a secondary")
	_, err = runCmd(t, "", "replicate", "failover", "--to", "east", "--server", westURL, "--cluster", "west")
	require.ErrorContains(t, err, "not a secondary")
	for _, n := range westSys.Nodes() {
		westSys.StopNode(n.ID(), true)
	}
	out, err := runCmd(t, "", "replicate", "switchover", "--to", "west", "--server", eastURL, "--cluster", "east", "--catch-up", "1s")
	require.ErrorContains(t, err, "switchover abandoned", out)
	require.Contains(t, out, "waiting: west holds 0 of 2 pchannels through east's last write")
	require.Contains(t, out, "east: takes writes again")
	_, err = east.AppendBytes(ctx, vs[0], []byte("after the abandoned switchover"))
	require.NoError(t, err)
	_, err = westSys.AddNode(ctx)
	require.NoError(t, err)

	clients := map[streamwal.Cluster]*client.Client{"east": east, "west": west}
	var writers []*changeWriter
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		w := &changeWriter{clients: clients, v: vs[g%len(vs)], g: g, at: "east",
			acked: map[streamwal.Cluster][]string{}, told: map[streamwal.Cluster]streamwal.Cluster{}}
		writers = append(writers, w)
		wg.Go(func() { w.run(t, ctx, stop) })
	}
	waitFor(t, "writes on east", func() bool { return writers[0].ackedOn("east") > 5 })

	out, err = runCmd(t, "", "replicate", "switchover", "--to", "west", "--server", eastURL, "--cluster", "east", "--timeout", "30s")
	require.NoError(t, err, out)
	require.Contains(t, out, "east: takes no direct write, hands over to west")
	require.Contains(t, out, "every secondary holds east's log through its last write")
	require.Regexp(t, `(?m)^topology version \d+: primary west, secondary east$`, out)

	for _, w := range writers {
		waitFor(t, "writes on west", func() bool { return w.ackedOn("west") > 5 })
	}
	close(stop)
	wg.Wait()

	// Every acknowledged write is in west's log once, and nothing else.
	want := map[string]int{"after the abandoned switchover": 1}
	for _, w := range writers {
		require.Equal(t, streamwal.Cluster("west"), w.told["east"], "writer %d: east's refusal names west", w.g)
		for _, c := range []streamwal.Cluster{"east", "west"} {
			for _, p := range w.acked[c] {
				want[p]++
			}
		}
	}
	require.Equal(t, want, inserts(t, ctx, west))

	// East follows west now: it copies what west took, and refuses
	// direct writes naming it.
	waitFor(t, "east's copy of west", func() bool { return fmt.Sprint(inserts(t, ctx, east)) == fmt.Sprint(want) })
	m, err := east.Codec().New(messages.TypeInsert, vs[0], []byte("direct"))
	require.NoError(t, err)
	_, err = east.Append(ctx, m)
	p, ok := streamwal.PrimaryOf(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, streamwal.Cluster("west"), p)
	waitFor(t, "east's replicators' records", func() bool {
		out, err = runCmd(t, "", "replicate", "status", "--server", eastURL, "--cluster", "east")
		require.NoError(t, err)
		require.Contains(t, out, "role:        secondary")
		return strings.Contains(out, "west/pchan-0") && strings.Contains(out, "west/pchan-1")
	})
}

// TestReplicateFailoverAndRemove: three clusters, east the primary. A
// failover is refused while east answers; with east's server stopped it
// promotes west and reports, per PChannel, the last TimeTick of east it
// holds; north follows west from there. Removing north makes it a
// standalone cluster that takes writes; the primary cannot be removed.
func TestReplicateFailoverAndRemove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eastSys := namedSystem(t, "east", changePChannels)
	t.Cleanup(func() {
		// Back up before its system closes, which it does at once then.
		if !eastSys.Server.Running() {
			require.NoError(t, eastSys.Server.Restart())
		}
	})
	eastURL := eastSys.Server.ClientURL()
	westURL, northURL := namedCluster(t, "west", changePChannels), namedCluster(t, "north", changePChannels)
	east, west, north := memberClient(t, "east", eastURL), memberClient(t, "west", westURL), memberClient(t, "north", northURL)
	_, err := runCmd(t, "", "replicate", "configure", "--primary", "east="+eastURL, "--secondary", "west="+westURL,
		"--secondary", "north="+northURL, "--timeout", "20s")
	require.NoError(t, err)
	vs, err := east.CreateCollection(ctx, client.Collection{DBName: "db", Name: "col", ID: 1, Partitions: []int64{1}})
	require.NoError(t, err)
	last := make([]messages.TimeTick, changePChannels) // east's last write, by PChannel index
	for i := range 20 {
		v := vs[i%len(vs)]
		res, err := east.AppendBytes(ctx, v, []byte(fmt.Sprint("east ", i)))
		require.NoError(t, err)
		last[v.PChannel().Index()] = res[0].TimeTick
	}
	for _, c := range []*client.Client{west, north} {
		waitFor(t, "the secondaries' checkpoints", func() bool {
			st, err := c.ReplicationStatus(ctx)
			require.NoError(t, err)
			n := 0
			for i, ch := range st.Channels {
				if ch.TimeTick >= last[i] {
					n++
				}
			}
			return n == changePChannels
		})
	}

	_, err = runCmd(t, "", "replicate", "failover", "--to", "west", "--server", westURL, "--cluster", "west")
	require.ErrorContains(t, err, "the primary east answers")

	eastSys.Server.Shutdown()
	out, err := runCmd(t, "", "replicate", "failover", "--to", "west", "--server", westURL, "--cluster", "west", "--json", "--timeout", "30s")
	require.NoError(t, err)
	var res changed
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, streamwal.Cluster("west"), res.Primary)
	require.Len(t, res.Members, 2, "east is out of the topology")
	require.Len(t, res.Held, changePChannels)
	for i, h := range res.Held {
		require.Equal(t, streamwal.Cluster("east"), h.Source)
		require.GreaterOrEqual(t, h.TimeTick, last[i], "%s: west holds east's last write", h.PChannel)
		require.Equal(t, h.TimeTick.Physical(), h.Time)
	}
	// West's records of east are old now: what it held, not a lag.
	st, err := west.ReplicationStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, messages.RolePrimary, st.Role)
	require.Len(t, st.Channels, changePChannels)
	for _, ch := range st.Channels {
		require.True(t, ch.Old, "%+v", ch)
		require.False(t, ch.LagKnown, "%+v", ch)
	}
	out, err = runCmd(t, "", "replicate", "status", "--server", westURL, "--cluster", "west")
	require.NoError(t, err)
	require.Contains(t, out, "east/pchan-0 (old)")

	// West takes writes; north copies them.
	_, err = west.AppendBytes(ctx, vs[0], []byte("west 1"))
	require.NoError(t, err)
	waitFor(t, "north's copy of west", func() bool { return inserts(t, ctx, north)["west 1"] == 1 })
	_, err = north.AppendBytes(ctx, vs[0], []byte("north 1"))
	p, ok := streamwal.PrimaryOf(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, streamwal.Cluster("west"), p)

	_, err = runCmd(t, "", "replicate", "remove", "west", "--server", westURL, "--cluster", "west")
	require.ErrorContains(t, err, "is the primary")
	_, err = runCmd(t, "", "replicate", "remove", "east", "--server", westURL, "--cluster", "west")
	require.ErrorContains(t, err, "not a member", "east left the topology at the failover")
	out, err = runCmd(t, "", "replicate", "remove", "north", "--server", westURL, "--cluster", "west")
	require.NoError(t, err)
	require.Contains(t, out, "north: removed, a standalone primary")
	require.Regexp(t, `(?m)^topology version \d+: primary west$`, out)
	_, err = north.AppendBytes(ctx, vs[0], []byte("north 2"))
	require.NoError(t, err, "a removed secondary takes writes")
	topo, _, err := west.ReplicationTopology(ctx)
	require.NoError(t, err)
	require.Len(t, topo.Members, 1)
	topo, _, err = north.ReplicationTopology(ctx)
	require.NoError(t, err)
	require.Equal(t, streamwal.Cluster("north"), topo.Primary)
	require.Len(t, topo.Members, 1)
}
