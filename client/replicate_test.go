package client_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// tails are the last MessageID of every PChannel of s, by name.
func tails(t *testing.T, be *jetstream.JetStream, names []string) map[string]messages.MessageID {
	t.Helper()
	out := map[string]messages.MessageID{}
	for _, name := range names {
		p, err := streamwal.ParsePChannel(name)
		require.NoError(t, err)
		last, err := be.Last(context.Background(), p)
		require.NoError(t, err)
		out[name] = last
	}
	return out
}

func TestConfigureReplication(t *testing.T) {
	s := newSystemOf(t, 4)
	ctx := testCtx(t)
	c, err := client.New(s.Conn())
	require.NoError(t, err)
	defer c.Close()
	be, err := jetstream.New(s.Conn(), s.Codec, jetstream.Options{})
	require.NoError(t, err)
	defer func() { _ = be.Close() }()

	_, ok, err := c.ReplicationTopology(ctx)
	require.NoError(t, err)
	require.False(t, ok, "never configured")

	self, err := c.ReplicateMember(ctx, "nats://local:4222")
	require.NoError(t, err)
	require.Equal(t, []string{"pchan-0", "pchan-1", "pchan-2", "pchan-3"}, self.PChannels)
	other := messages.ReplicateMember{Cluster: "west", URL: "nats://west:4222", PChannels: self.PChannels}

	// Refused before anything lands: a topology of another PChannel count,
	// and one that does not name this cluster.
	before := tails(t, be, self.PChannels)
	short := self
	short.PChannels = self.PChannels[:3]
	shortOther := other
	shortOther.PChannels = other.PChannels[:3]
	_, err = c.ConfigureReplication(ctx, messages.Star(short, shortOther))
	require.ErrorIs(t, err, streamwal.ErrPChannelCountMismatch, "the coordinator checks its own count")
	third := messages.ReplicateMember{Cluster: "north", URL: "nats://north:4222", PChannels: self.PChannels}
	_, err = c.ConfigureReplication(ctx, messages.Star(other, third))
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	_, err = c.ConfigureReplication(ctx, messages.Star(self, shortOther))
	require.ErrorIs(t, err, streamwal.ErrPChannelCountMismatch, "the client checks the members against each other")
	for name, last := range tails(t, be, self.PChannels) {
		p, err := streamwal.ParsePChannel(name)
		require.NoError(t, err)
		for id := before[name] + 1; id <= last; id++ {
			m, err := be.Get(ctx, p, id)
			require.NoError(t, err)
			require.Same(t, messages.TypeTimeTick, m.Type(), "a refused topology changes nothing (only the sync loop writes)")
		}
	}

	// Accepted: it lands on every PChannel and becomes the cluster's.
	topo := messages.Star(other, self)
	res, err := c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)
	require.Len(t, res.Appended, len(self.PChannels))
	for _, name := range self.PChannels {
		p, err := streamwal.ParsePChannel(name)
		require.NoError(t, err)
		m, err := be.Get(ctx, p, res.Appended[name].ID)
		require.NoError(t, err)
		require.Same(t, messages.TypeAlterReplicateConfig, m.Type())
		require.True(t, m.Unreplicable())
		var got messages.Topology
		require.NoError(t, m.Body(&got))
		require.Equal(t, topo, got)
	}
	got, ok, err := c.ReplicationTopology(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, topo, got)
	require.Equal(t, messages.RoleSecondary, got.Role("local"))

	// A new topology replaces it.
	topo = messages.Star(self, other)
	_, err = c.ConfigureReplication(ctx, topo)
	require.NoError(t, err)
	got, _, err = c.ReplicationTopology(ctx)
	require.NoError(t, err)
	require.Equal(t, topo, got)
}

// TestSecondaryRefusesDirectWrites: once configured as a secondary, the
// cluster refuses a client's appends and DDL with NOT_PRIMARY naming the
// primary, through NATS as through the local bypass; unreplicable
// messages still land.
func TestSecondaryRefusesDirectWrites(t *testing.T) {
	s := newSystemOf(t, 2)
	ctx := testCtx(t)
	admin := newClient(t, s)
	col, v := createCollection(t, ctx, admin)
	self, err := admin.ReplicateMember(ctx, "nats://local:4222")
	require.NoError(t, err)
	west := messages.ReplicateMember{Cluster: "west", URL: "nats://west:4222", PChannels: self.PChannels}
	_, err = admin.ConfigureReplication(ctx, messages.Star(west, self))
	require.NoError(t, err)

	forModes(t, func(t *testing.T, m mode) {
		c := newClient(t, s, m.opts...)
		_, err := c.Append(ctx, insert(t, c, v, "direct"))
		require.ErrorIs(t, err, streamwal.ErrNotPrimary)
		primary, ok := streamwal.PrimaryOf(err)
		require.True(t, ok, "%v", err)
		require.Equal(t, streamwal.Cluster("west"), primary)
		_, err = c.Append(ctx, insert(t, c, v, "stays here", messages.WithUnreplicable()))
		require.NoError(t, err)
	})

	_, err = admin.CreateCollection(ctx, client.Collection{DBName: "db", Name: "refused", ID: collectionIDs.Add(1)})
	require.ErrorIs(t, err, streamwal.ErrNotPrimary, "DDL too")
	primary, ok := streamwal.PrimaryOf(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, streamwal.Cluster("west"), primary)
	require.ErrorIs(t, admin.DropCollection(ctx, col), streamwal.ErrNotPrimary)
}
