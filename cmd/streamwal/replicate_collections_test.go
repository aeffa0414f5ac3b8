package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
)

// waitAllocated waits until c's coordinator holds collection id with
// the VChannels want (nil: dropped).
func waitAllocated(t *testing.T, ctx context.Context, c *client.Client, id int64, want []streamwal.VChannel) {
	t.Helper()
	var got []streamwal.VChannel
	var err error
	waitFor(t, "the allocation of collection "+c.Cluster().String(), func() bool {
		got, err = c.CollectionVChannels(ctx, id)
		if want == nil {
			return errors.Is(err, streamwal.ErrCollectionDropped)
		}
		return err == nil && equalVChannels(got, want)
	})
}

// equalVChannels reports whether a and b name the same VChannels.
func equalVChannels(a, b []streamwal.VChannel) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].String() != b[i].String() {
			return false
		}
	}
	return true
}

// TestReplicatedCollectionsAfterSwitchover: the collections the
// primary creates and drops reach the secondary's coordinator with the
// replicated DDL, so that once the secondary is promoted, DDL and
// appends on them work there, a dropped ID stays dropped, a name stays
// taken, and a new collection goes to the PChannel with the fewest
// VChannels as the primary counted them. The old primary, now a
// secondary, learns the new primary's collections the same way.
func TestReplicatedCollectionsAfterSwitchover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eastURL, westURL := namedCluster(t, "east", changePChannels), namedCluster(t, "west", changePChannels)
	east, west := memberClient(t, "east", eastURL), memberClient(t, "west", westURL)
	_, err := runCmd(t, "", "replicate", "configure", "--primary", "east="+eastURL, "--secondary", "west="+westURL, "--timeout", "20s")
	require.NoError(t, err)

	one := client.Collection{DBName: "db", Name: "one", ID: 1, Partitions: []int64{1}}
	two := client.Collection{DBName: "db", Name: "two", ID: 2, Partitions: []int64{1}}
	gone := client.Collection{DBName: "db", Name: "gone", ID: 4, Partitions: []int64{1}}
	vs1, err := east.CreateCollection(ctx, one)
	require.NoError(t, err)
	vs2, err := east.CreateCollection(ctx, two)
	require.NoError(t, err)
	require.NotEqual(t, vs1[0].PChannel(), vs2[0].PChannel(), "one collection on each pchannel")
	_, err = east.CreateCollection(ctx, gone)
	require.NoError(t, err)
	require.NoError(t, east.DropCollection(ctx, gone))
	_, err = east.AppendBytes(ctx, vs1[0], []byte("east 1"))
	require.NoError(t, err)

	waitAllocated(t, ctx, west, 1, vs1)
	waitAllocated(t, ctx, west, 2, vs2)
	waitAllocated(t, ctx, west, 4, nil)

	out, err := runCmd(t, "", "replicate", "switchover", "--to", "west", "--server", eastURL, "--cluster", "east", "--timeout", "30s")
	require.NoError(t, err, out)

	// West takes DDL and appends on east's collections.
	require.NoError(t, west.CreatePartition(ctx, one, 2))
	_, err = west.AppendBytes(ctx, vs1[0], []byte("west 1"))
	require.NoError(t, err)
	again, err := west.CreateCollection(ctx, one)
	require.NoError(t, err, "creating it again is idempotent")
	require.True(t, equalVChannels(vs1, again), "%v, not %v", again, vs1)
	require.NoError(t, west.DropCollection(ctx, two))
	_, err = west.CreateCollection(ctx, client.Collection{DBName: "db", Name: "one", ID: 5})
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "the name of a live collection is taken")
	_, err = west.CreateCollection(ctx, client.Collection{DBName: "db", Name: "gone", ID: 4})
	require.ErrorIs(t, err, streamwal.ErrCollectionDropped, "a dropped ID is never reused")
	three := client.Collection{DBName: "db", Name: "three", ID: 3, Partitions: []int64{1}}
	vs3, err := west.CreateCollection(ctx, three)
	require.NoError(t, err)
	require.Equal(t, vs2[0].PChannel(), vs3[0].PChannel(), "the new collection goes where the dropped one was, the pchannel with fewest")
	_, err = west.AppendBytes(ctx, vs3[0], []byte("west 3"))
	require.NoError(t, err)

	// East, now west's secondary, follows west's allocation.
	waitAllocated(t, ctx, east, 3, vs3)
	waitAllocated(t, ctx, east, 2, nil)
	waitAllocated(t, ctx, east, 1, vs1)
	waitFor(t, "east's copy of west's appends", func() bool {
		got := inserts(t, ctx, east)
		return got["west 1"] == 1 && got["west 3"] == 1
	})
}
