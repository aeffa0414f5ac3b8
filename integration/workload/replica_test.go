package workload_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/integration/workload"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
)

// replicaCluster is an in-process cluster of two PChannels on a server
// of its own, with a client.
type replicaCluster struct {
	sys *system.System
	c   *client.Client
}

// startReplicaCluster starts cluster name.
func startReplicaCluster(ctx context.Context, t *testing.T, name streamwal.Cluster) *replicaCluster {
	t.Helper()
	s, err := system.Start(ctx, system.Options{Cluster: name, Coord: coord.Config{PChannels: 2},
		ServerOptions: embedded.Options{StoreDir: t.TempDir()}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	_, err = s.WaitServing(ctx, false)
	require.NoError(t, err)
	c, err := client.New(s.Conn(), client.WithCluster(name), client.WithoutLocalBypass())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &replicaCluster{sys: s, c: c}
}

// TestCheckReplica: a secondary that replicated a load of the primary
// converges, and the check finds nothing wrong; then messages forged
// into the secondary's stream (a direct write, a second replica of a
// message, a replica of a rollback) are each found.
func TestCheckReplica(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	prim, sec := startReplicaCluster(ctx, t, "prim"), startReplicaCluster(ctx, t, "sec")
	vs, err := prim.c.CreateCollection(ctx, client.Collection{DBName: "rc", Name: "c", ID: 1, Shards: 2})
	require.NoError(t, err)
	var members []messages.ReplicateMember
	for _, c := range []*replicaCluster{prim, sec} {
		m, err := c.c.ReplicateMember(ctx, c.sys.Server.ClientURL())
		require.NoError(t, err)
		members = append(members, m)
	}
	topo := messages.Star(members[0], members[1])
	for _, c := range []*replicaCluster{prim, sec} {
		_, err := c.c.ConfigureReplication(ctx, topo)
		require.NoError(t, err)
	}
	l, err := workload.New(workload.Config{Client: prim.c, Conn: prim.sys.Conn(), VChannels: vs, Appenders: 2, TxnPercent: 50, Seed: 3})
	require.NoError(t, err)
	require.NoError(t, l.Start())
	require.Eventually(t, func() bool { return l.Ledger().Acknowledged() >= 100 }, testTimeout, 10*time.Millisecond)
	l.Stop()

	cfg := workload.ReplicaConfig{Primary: prim.c, Secondary: sec.c, SecondaryConn: sec.sys.Conn()}
	rep, err := workload.WaitReplica(ctx, cfg)
	require.NoError(t, err)
	t.Log(rep)
	require.NoError(t, rep.Err())
	require.True(t, rep.Converged())
	require.Equal(t, 2, rep.PChannels)
	require.Equal(t, rep.Replicable, rep.Copied)
	require.Greater(t, rep.Replicas, rep.Replicable, "transactions replicate as their parts")
	require.Positive(t, rep.Own, "the secondary's ticks and barriers")

	// Nothing writes the secondary any more; forge into its stream.
	for _, n := range sec.sys.Nodes() {
		sec.sys.StopNode(n.ID(), false)
	}
	p := vs[0].PChannel()
	insert, rollback := firstOf(ctx, t, prim, p, messages.TypeInsert, false), firstOf(ctx, t, prim, p, messages.TypeRollbackTxn, true)
	direct, err := sec.c.Codec().New(messages.TypeInsert, vs[0], []byte("direct"))
	require.NoError(t, err)
	forgeInto(ctx, t, sec, direct)
	again, err := sec.c.Codec().NewReplicate(insert, "prim", p)
	require.NoError(t, err)
	require.NoError(t, again.SetMsgID("forged-again")) // past the stream's deduplication
	forgeInto(ctx, t, sec, again)
	rb, err := sec.c.Codec().NewReplicate(rollback, "prim", p)
	require.NoError(t, err)
	forgeInto(ctx, t, sec, rb)

	rep, err = workload.CheckReplica(ctx, cfg)
	require.NoError(t, err)
	t.Log(rep)
	for _, w := range []string{
		p.String() + ": Insert",            // the direct write, delivered
		"is not a replica: a direct write", // in the stream
		fmt.Sprintf("are both replicas of message %d", insert.ID()),
		"after the primary's last replicable message", // the second copy, delivered
		fmt.Sprintf("is a replica of RollbackTxn %d", rollback.ID()),
	} {
		require.True(t, containsOne(rep.Violations, w), "no violation says %q in:\n%s", w, strings.Join(rep.Violations, "\n"))
	}
	require.False(t, rep.Converged())
	require.Error(t, rep.Err())
	rep, err = workload.WaitReplica(ctx, cfg)
	require.NoError(t, err, "a violation ends the wait at once")
	require.Error(t, rep.Err())
}

// firstOf is the first message of type typ in the primary's stream of p
// (of a transaction if txn, outside one if not).
func firstOf(ctx context.Context, t *testing.T, c *replicaCluster, p streamwal.PChannel, typ *messages.Type, txn bool) *messages.ImmutableMessage {
	t.Helper()
	be, err := jetstream.New(c.sys.Conn(), c.c.Codec(), jetstream.Options{})
	require.NoError(t, err)
	defer func() { _ = be.Close() }()
	sc, err := be.Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	require.NoError(t, err)
	defer func() { _ = sc.Close() }()
	for m, err := range sc.All(ctx) {
		require.NoError(t, err)
		if m.Type() == typ && (m.Txn() != nil) == txn {
			return m
		}
	}
	t.Fatalf("no %s in %s", typ, p)
	return nil
}

// forgeInto publishes m straight into the secondary's stream, past the
// last message's TimeTick, under its term.
func forgeInto(ctx context.Context, t *testing.T, c *replicaCluster, m *messages.MutableMessage) {
	t.Helper()
	be, err := jetstream.New(c.sys.Conn(), c.c.Codec(), jetstream.Options{})
	require.NoError(t, err)
	defer func() { _ = be.Close() }()
	p := m.PChannel()
	st, err := be.State(ctx, p)
	require.NoError(t, err)
	last, err := be.Get(ctx, p, st.Last)
	require.NoError(t, err)
	m.SetTerm(last.Term())
	m.SetTimeTick(last.TimeTick() + 1)
	msg, err := c.c.Codec().Encode(m)
	require.NoError(t, err)
	js, err := njs.New(c.sys.Conn())
	require.NoError(t, err)
	_, err = js.PublishMsg(ctx, msg)
	require.NoError(t, err)
}
