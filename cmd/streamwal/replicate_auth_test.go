package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/auth"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
)

// TestReplicateFromAPrimaryThatRequiresAuth: the primary east accepts
// only the users `streamwal auth init` wrote. West's replicators log in
// with east's client seed (--replicate-nkey east=client.nk) and copy
// its log; north's, given nothing, are refused and say so in their
// status. Bad --replicate-nkey values are refused.
func TestReplicateFromAPrimaryThatRequiresAuth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := auth.Dir(t.TempDir())
	spec, err := auth.NewSpec("east", "pchan", changePChannels)
	require.NoError(t, err)
	_, err = auth.Init(d, spec, false)
	require.NoError(t, err)
	users, err := d.Users(spec, auth.Roles...)
	require.NoError(t, err)
	roles := map[system.Member]auth.Role{system.MemberCoordinator: auth.RoleCoordinator, system.MemberNode: auth.RoleNode, system.MemberClient: auth.RoleClient}
	east, err := system.Start(ctx, system.Options{Cluster: "east", ServerOptions: embedded.Options{StoreDir: t.TempDir(), Users: users},
		Coord: coord.Config{PChannels: changePChannels}, Node: node.Config{SyncInterval: testSyncInterval},
		ConnectOptions: func(m system.Member) []nats.Option {
			o, err := d.Option(roles[m])
			require.NoError(t, err)
			return []nats.Option{o}
		}})
	require.NoError(t, err)
	t.Cleanup(east.Close)
	_, err = east.WaitServing(ctx, false)
	require.NoError(t, err)

	_, err = (&replicateAuth{nkeys: []string{"east"}}).options()
	require.ErrorContains(t, err, "want NAME=FILE")
	_, err = (&replicateAuth{nkeys: []string{"east=" + d.Seed(auth.RoleClient), "east=" + d.Seed(auth.RoleAdmin)}}).options()
	require.ErrorContains(t, err, "has credentials already")
	repl, err := (&replicateAuth{nkeys: []string{"east=" + d.Seed(auth.RoleClient)}}).options()
	require.NoError(t, err)
	west, err := system.Start(ctx, system.Options{Cluster: "west", ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Coord: coord.Config{PChannels: changePChannels}, Node: node.Config{SyncInterval: testSyncInterval, ReplicateOptions: repl}})
	require.NoError(t, err)
	t.Cleanup(west.Close)
	_, err = west.WaitServing(ctx, false)
	require.NoError(t, err)
	northURL := namedCluster(t, "north", changePChannels)

	admin, err := d.Option(auth.RoleAdmin)
	require.NoError(t, err)
	eastURL, westURL := east.Server.ClientURL(), west.Server.ClientURL()
	ec, err := client.Connect(eastURL, client.WithCluster("east"), client.WithoutLocalBypass(), client.WithNATSOptions(admin))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ec.Close() })
	wc, nc := memberClient(t, "west", westURL), memberClient(t, "north", northURL)
	var members []messages.ReplicateMember
	for _, m := range []struct {
		c   *client.Client
		url string
	}{{ec, eastURL}, {wc, westURL}, {nc, northURL}} {
		rm, err := m.c.ReplicateMember(ctx, m.url)
		require.NoError(t, err)
		members = append(members, rm)
	}
	topo := messages.Star(members[0], members[1:]...)
	topo.Version = 1
	for _, c := range []*client.Client{ec, wc, nc} {
		_, err := c.ConfigureReplication(ctx, topo)
		require.NoError(t, err)
	}
	vs, err := ec.CreateCollection(ctx, client.Collection{DBName: "db", Name: "col", ID: 1, Partitions: []int64{1}})
	require.NoError(t, err)
	_, err = ec.AppendBytes(ctx, vs[0], []byte("secret"))
	require.NoError(t, err)

	waitFor(t, "west's copy of east", func() bool { return inserts(t, ctx, wc)["secret"] == 1 })
	waitFor(t, "north's refusal", func() bool {
		st, err := nc.ReplicationStatus(ctx)
		require.NoError(t, err)
		for _, ch := range st.Channels {
			if strings.Contains(strings.ToLower(ch.Error), "authorization") {
				return true
			}
		}
		return false
	})
	require.Empty(t, inserts(t, ctx, nc))
	for _, cmd := range []string{"serve", "node"} {
		c, _, err := newRootCmd(io.Discard, io.Discard).Find([]string{cmd})
		require.NoError(t, err)
		for _, flag := range []string{"replicate-nkey", "replicate-creds"} {
			require.NotNil(t, c.Flags().Lookup(flag), "%s --%s", cmd, flag)
		}
	}
}
