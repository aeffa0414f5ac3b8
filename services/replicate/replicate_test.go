package replicate_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/read"
	"github.com/streamwal/streamwal/services/replicate"
)

// TestMain checks for leaked goroutines (see embedded.VerifyNoLeaks).
func TestMain(m *testing.M) { embedded.VerifyNoLeaks(m) }

// pchannels is the PChannel count of the clusters of these tests.
const pchannels = 2

// cluster is one streamwal cluster on its own embedded server, with a
// client.
type cluster struct {
	t   *testing.T
	sys *system.System
	c   *client.Client
}

// startCluster starts cluster name on a server of its own.
func startCluster(t *testing.T, name streamwal.Cluster) *cluster {
	t.Helper()
	return startClusterWith(t, name, func(*system.Options) {})
}

// startClusterWith starts cluster name on a server of its own, with the
// options edit sets.
func startClusterWith(t *testing.T, name streamwal.Cluster, edit func(*system.Options)) *cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := system.Options{Cluster: name, ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Coord: coord.Config{PChannels: pchannels}, Node: node.Config{SyncInterval: 50 * time.Millisecond}}
	edit(&o)
	s, err := system.Start(ctx, o)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	_, err = s.WaitServing(ctx, false)
	require.NoError(t, err)
	nc, err := s.Server.Connect()
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	c, err := client.New(nc, client.WithCluster(name), client.WithLocal(s.Local()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &cluster{t: t, sys: s, c: c}
}

// member is the cluster as a member of a topology.
func (c *cluster) member(ctx context.Context) messages.ReplicateMember {
	c.t.Helper()
	m, err := c.c.ReplicateMember(ctx, c.sys.Server.ClientURL())
	require.NoError(c.t, err)
	return m
}

// entry is what a reader compares of one replicable message: where it
// comes from in the primary's log and what it says.
type entry struct {
	ID       messages.MessageID
	TimeTick messages.TimeTick
	Type     string
	Target   string
	Payload  string
}

// String is the entry for failure messages.
func (e entry) String() string {
	return fmt.Sprintf("%d@%d %s %s %q", e.ID, e.TimeTick, e.Type, e.Target, e.Payload)
}

// describe is m's entry: payloads of a transaction's bodies joined.
func describe(m *messages.ImmutableMessage, id messages.MessageID, tt messages.TimeTick) entry {
	e := entry{ID: id, TimeTick: tt, Type: m.Type().Name, Payload: string(m.Payload())}
	if v := m.VChannel(); !v.IsZero() {
		e.Target = v.Suffix()
	}
	if m.Type() == messages.TypeTxn {
		var parts []string
		for _, b := range m.TxnBody() {
			parts = append(parts, string(b.Payload()))
		}
		e.Payload = strings.Join(parts, "|")
	}
	return e
}

// log reads PChannel index i of the cluster to its tail as of now,
// through the read pipeline (TimeTick order, transactions assembled).
// From the primary it keeps what replicates (each at its own ID and
// TimeTick); from a secondary the replicas (at their source's).
func (c *cluster) log(ctx context.Context, i int, primary bool) []entry {
	c.t.Helper()
	codec := c.sys.Codec
	be, err := jetstream.New(c.sys.Conn(), codec, jetstream.Options{})
	require.NoError(c.t, err)
	defer func() { _ = be.Close() }()
	p, err := streamwal.NewPChannel("pchan", i)
	require.NoError(c.t, err)
	last, err := be.Last(ctx, p)
	require.NoError(c.t, err)
	sc, err := read.Open(ctx, read.Options{Backend: be, Codec: codec, PChannel: p, Start: read.Earliest(), Until: last})
	require.NoError(c.t, err)
	defer func() { _ = sc.Close() }()
	var out []entry
	for {
		m, err := sc.Next(ctx)
		if err != nil {
			require.ErrorIs(c.t, err, io.EOF)
			return out
		}
		h := m.Replicate()
		switch {
		case primary && (m.Type().Is(messages.FlagSelfControlled) || m.Unreplicable() || h != nil):
		case primary:
			out = append(out, describe(m, m.ID(), m.TimeTick()))
		case h != nil:
			out = append(out, describe(m, h.MessageID, h.TimeTick))
		}
	}
}

// workload writes to the primary: collections, inserts from several
// writers, committed and rolled-back transactions, partition DDL.
type workload struct {
	c   *client.Client
	col []client.Collection
	vs  []streamwal.VChannel
}

// newWorkload creates n collections, one per PChannel at most.
func newWorkload(t *testing.T, ctx context.Context, c *client.Client, first int64, n int) *workload {
	w := &workload{c: c}
	for i := range n {
		col := client.Collection{DBName: "db", Name: fmt.Sprint("col", first+int64(i)), ID: first + int64(i), Partitions: []int64{1}}
		vs, err := c.CreateCollection(ctx, col)
		require.NoError(t, err)
		w.col, w.vs = append(w.col, col), append(w.vs, vs...)
	}
	return w
}

// write runs writers goroutines, each appending rounds inserts and, every
// few, a transaction (committed, or rolled back).
func (w *workload) write(t *testing.T, ctx context.Context, tag string, writers, rounds int) {
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range rounds {
				v := w.vs[(g+i)%len(w.vs)]
				m, err := w.c.Codec().New(messages.TypeInsert, v, []byte(fmt.Sprintf("%s w%d r%d", tag, g, i)), messages.WithDML(1, 1))
				if !assertNoError(t, err) {
					return
				}
				if _, err := w.c.Append(ctx, m); !assertNoError(t, err) {
					return
				}
				if i%10 == 9 {
					if !assertNoError(t, w.txn(ctx, v, fmt.Sprintf("%s w%d t%d", tag, g, i), i%20 == 19)) {
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// assertNoError reports err as a test failure from any goroutine.
func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Errorf("workload: %v", err)
		return false
	}
	return true
}

// txn appends a transaction of three inserts on v, rolled back if told.
func (w *workload) txn(ctx context.Context, v streamwal.VChannel, tag string, rollback bool) error {
	tx, err := w.c.BeginTxn(ctx, v, 0)
	if err != nil {
		return err
	}
	for j := range 3 {
		m, err := w.c.Codec().New(messages.TypeInsert, v, []byte(fmt.Sprintf("%s b%d", tag, j)), messages.WithDML(1, 1),
			messages.WithTxn(tx.Context()))
		if err != nil {
			return err
		}
		if _, err := tx.Append(ctx, m); err != nil {
			return err
		}
	}
	if rollback {
		return tx.Rollback(ctx)
	}
	_, err = tx.Commit(ctx)
	return err
}

// waitCopy waits until every PChannel of sec holds exactly the
// replicable messages of prim's, in order (it fails with the difference),
// and returns them.
func waitCopy(t *testing.T, ctx context.Context, prim, sec *cluster) []entry {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var all []entry
	for i := range pchannels {
		for {
			want, got := prim.log(ctx, i, true), sec.log(ctx, i, false)
			if equalEntries(want, got) {
				all = append(all, got...)
				break
			}
			if time.Now().After(deadline) {
				require.Equal(t, want, got, "pchannel %d: the secondary's copy differs from the primary's log", i)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return all
}

// equalEntries compares two logs.
func equalEntries(a, b []entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSecondaryCopiesPrimary: two clusters, each on its own server; the
// primary has history before replication is configured and takes writes
// from several writers while it runs, and the secondary's node crashes
// and comes back in the middle. The secondary ends with every replicable
// message of the primary exactly once, in order, transactions whole and
// rolled-back ones never; a direct write to it is refused with the
// primary's name.
func TestSecondaryCopiesPrimary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prim, sec := startCluster(t, "prim"), startCluster(t, "sec")
	w := newWorkload(t, ctx, prim.c, 1, 3)
	w.write(t, ctx, "before", 4, 20)

	topo := messages.Star(prim.member(ctx), sec.member(ctx))
	_, err := prim.c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)
	_, err = sec.c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)

	var wg sync.WaitGroup
	wg.Go(func() { w.write(t, ctx, "during", 4, 40) })
	// Meanwhile, crash the secondary's node and start another: its
	// PChannels, and their replicators, move there.
	time.Sleep(200 * time.Millisecond)
	for _, n := range sec.sys.Nodes() {
		sec.sys.StopNode(n.ID(), true)
	}
	_, err = sec.sys.AddNode(ctx)
	require.NoError(t, err)
	wg.Wait()
	more := newWorkload(t, ctx, prim.c, 10, 2)
	require.NoError(t, prim.c.DropPartition(ctx, w.col[0], 1))
	more.write(t, ctx, "after", 2, 10)
	copied := waitCopy(t, ctx, prim, sec)
	count := map[string]int{}
	for _, e := range copied {
		count[e.Type]++
		require.NotRegexp(t, `t(19|39) `, e.Payload, "a rolled-back transaction was replicated")
	}
	// 4x20 + 4x40 + 2x10 inserts; transactions at rounds 9, 29 committed
	// and 19, 39 rolled back; five collections on their VChannel and the
	// CChannel, one partition dropped on both.
	require.Equal(t, map[string]int{"Insert": 260, "Txn": 4 + 8 + 2, "CreateCollection": 10, "DropPartition": 2}, count)

	// What the secondary replicated is all it holds: direct writes are
	// refused, naming the primary.
	m, err := sec.c.Codec().New(messages.TypeInsert, w.vs[1], []byte("direct"))
	require.NoError(t, err)
	_, err = sec.c.Append(ctx, m)
	require.ErrorIs(t, err, streamwal.ErrNotPrimary)
	p, ok := streamwal.PrimaryOf(err)
	require.True(t, ok)
	require.Equal(t, streamwal.Cluster("prim"), p)
}

// channels reads sec's replication status until every PChannel's record
// satisfies ok, and returns them; it fails after 30 s with the last.
func channels(t *testing.T, ctx context.Context, sec *cluster, what string, ok func(client.ReplicationChannel) bool) []client.ReplicationChannel {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := sec.c.ReplicationStatus(ctx)
		require.NoError(t, err)
		require.Equal(t, messages.RoleSecondary, st.Role)
		require.Len(t, st.Channels, pchannels)
		all := true
		for _, ch := range st.Channels {
			all = all && ok(ch)
		}
		if all {
			return st.Channels
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %+v", what, st.Channels)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLagTellsTheTruth: the lag of an idle, caught-up secondary stays
// small while its records keep being written; it grows while the
// primary is unreachable, also across a restart of the secondary's node
// (which carries it on instead of resetting it), and falls once the
// primary is back.
func TestLagTellsTheTruth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prim, sec := startCluster(t, "prim"), startCluster(t, "sec")
	topo := messages.Star(prim.member(ctx), sec.member(ctx))
	_, err := prim.c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)
	_, err = sec.c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)
	w := newWorkload(t, ctx, prim.c, 1, 2)
	w.write(t, ctx, "first", 2, 10)
	waitCopy(t, ctx, prim, sec)

	const small = 1500 * time.Millisecond
	caughtUp := func(ch client.ReplicationChannel) bool { return ch.LagKnown && ch.Lag < small && ch.Error == "" }
	seen := channels(t, ctx, sec, "a small lag", caughtUp)
	for range 3 {
		// Idle: the records are written again and again (the primary's
		// live ticks move Through), and the lag stays small.
		last := seen
		seen = channels(t, ctx, sec, "newer records", func(ch client.ReplicationChannel) bool {
			for _, prev := range last {
				if prev.PChannel == ch.PChannel {
					return ch.Updated.After(prev.Updated)
				}
			}
			return false
		})
		for i, ch := range seen {
			require.True(t, caughtUp(ch), "idle and caught up, %s lags %v", ch.PChannel, ch.Lag)
			if prev := last[i]; prev.PChannel == ch.PChannel && prev.Replicated == ch.Replicated && prev.MessageID == ch.MessageID {
				// Only the watermark moved: written at the idle pace.
				require.GreaterOrEqual(t, ch.Updated.Sub(prev.Updated), replicate.DefaultIdleCheckpointInterval-50*time.Millisecond,
					"%s: an idle record written again too soon", ch.PChannel)
			}
		}
	}

	// The primary goes away: nothing moves Through any more, and the lag
	// read from the records grows.
	prim.sys.Server.Shutdown()
	before := channels(t, ctx, sec, "a growing lag", func(ch client.ReplicationChannel) bool { return ch.Lag > 2*small })

	// The secondary's node restarts meanwhile: its replicators start from
	// the records, so the lag goes on growing instead of starting again.
	restarted := time.Now()
	for _, n := range sec.sys.Nodes() {
		sec.sys.StopNode(n.ID(), true)
	}
	_, err = sec.sys.AddNode(ctx)
	require.NoError(t, err)
	after := channels(t, ctx, sec, "records of the new node", func(ch client.ReplicationChannel) bool {
		return ch.Updated.After(restarted) && ch.Error != ""
	})
	for i, ch := range after {
		require.True(t, ch.LagKnown, "%s: the lag was forgotten across the restart", ch.PChannel)
		require.Equal(t, before[i].Through, ch.Through, "%s: Through changed across the restart", ch.PChannel)
		require.Greater(t, ch.Lag, before[i].Lag)
	}

	// The primary comes back: replication resumes and the lag falls.
	require.NoError(t, prim.sys.Server.Restart())
	w.write(t, ctx, "back", 2, 10)
	waitCopy(t, ctx, prim, sec)
	channels(t, ctx, sec, "a small lag again", caughtUp)
}
