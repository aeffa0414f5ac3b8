package messages_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// member is a cluster of n PChannels named pchan-0...
func member(name string, n int) messages.ReplicateMember {
	m := messages.ReplicateMember{Cluster: streamwal.Cluster(name), URL: "nats://" + name + ":4222"}
	for i := range n {
		p, err := streamwal.NewPChannel("pchan", i)
		if err != nil {
			panic(err)
		}
		m.PChannels = append(m.PChannels, p.String())
	}
	return m
}

func TestTopologyStar(t *testing.T) {
	topo := messages.Star(member("a", 4), member("b", 4), member("c", 4))
	require.NoError(t, topo.Validate())
	require.Equal(t, messages.RolePrimary, topo.Role("a"))
	require.Equal(t, messages.RoleSecondary, topo.Role("b"))
	require.Equal(t, messages.RoleSecondary, topo.Role("c"))
	src, ok := topo.Source("c")
	require.True(t, ok)
	require.Equal(t, streamwal.Cluster("a"), src.Cluster)
	_, ok = topo.Source("a")
	require.False(t, ok, "the primary replicates from nobody")
	require.NoError(t, topo.CheckFor("b", member("b", 4).PChannels))

	// A lone primary needs no URL nor edge.
	alone := messages.Topology{Members: []messages.ReplicateMember{{Cluster: "a", PChannels: member("a", 2).PChannels}}, Primary: "a"}
	require.NoError(t, alone.Validate())
	require.Equal(t, messages.RolePrimary, alone.Role("a"))
}

func TestTopologyRefusals(t *testing.T) {
	star := func() messages.Topology { return messages.Star(member("a", 4), member("b", 4), member("c", 4)) }
	cases := map[string]struct {
		edit     func(*messages.Topology)
		mismatch bool
	}{
		"no member":    {edit: func(t *messages.Topology) { t.Members = nil }},
		"bad name":     {edit: func(t *messages.Topology) { t.Members[1].Cluster = "b.x" }},
		"listed twice": {edit: func(t *messages.Topology) { t.Members[2].Cluster = "b" }},
		"no url":       {edit: func(t *messages.Topology) { t.Members[1].URL = "" }},
		"no pchannel":  {edit: func(t *messages.Topology) { t.Members[0].PChannels = nil }},
		"pchannel order": {edit: func(t *messages.Topology) {
			t.Members[1].PChannels[0], t.Members[1].PChannels[1] = "pchan-1", "pchan-0"
		}},
		"bad pchannel":       {edit: func(t *messages.Topology) { t.Members[1].PChannels[3] = "pchan" }},
		"count mismatch":     {edit: func(t *messages.Topology) { t.Members[2] = member("c", 3) }, mismatch: true},
		"primary not member": {edit: func(t *messages.Topology) { t.Primary = "z" }},
		"no primary":         {edit: func(t *messages.Topology) { t.Primary = "" }},
		"secondary edge":     {edit: func(t *messages.Topology) { t.Edges[1].Source = "b" }},
		"edge into primary": {edit: func(t *messages.Topology) {
			t.Edges = append(t.Edges, messages.ReplicateEdge{Source: "a", Target: "a"})
		}},
		"edge twice":           {edit: func(t *messages.Topology) { t.Edges = append(t.Edges, t.Edges[0]) }},
		"edge to outsider":     {edit: func(t *messages.Topology) { t.Edges[0].Target = "z" }},
		"missing edge":         {edit: func(t *messages.Topology) { t.Edges = t.Edges[:1] }},
		"chain":                {edit: func(t *messages.Topology) { t.Edges[1] = messages.ReplicateEdge{Source: "b", Target: "c"} }},
		"handover to primary":  {edit: func(t *messages.Topology) { t.Handover = "a" }},
		"handover to outsider": {edit: func(t *messages.Topology) { t.Handover = "z" }},
		"start of other count": {edit: func(t *messages.Topology) { t.Edges[0].Start = []messages.MessageID{1, 2} }},
		"start at zero":        {edit: func(t *messages.Topology) { t.Edges[0].Start = []messages.MessageID{1, 2, 0, 4} }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			topo := star()
			tc.edit(&topo)
			err := topo.Validate()
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			require.Equal(t, tc.mismatch, errors.Is(err, streamwal.ErrPChannelCountMismatch), "%v", err)
		})
	}
}

func TestTopologyCheckFor(t *testing.T) {
	topo := messages.Star(member("a", 4), member("b", 4))
	err := topo.CheckFor("b", member("b", 16).PChannels)
	require.ErrorIs(t, err, streamwal.ErrPChannelCountMismatch, "a cluster of 16 pchannels in a topology of 4")
	err = topo.CheckFor("z", member("z", 4).PChannels)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.NotErrorIs(t, err, streamwal.ErrPChannelCountMismatch)
	other := member("b", 4)
	other.PChannels[2] = "other-2"
	err = topo.CheckFor("b", other.PChannels)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "same count, other names")
	require.NotErrorIs(t, err, streamwal.ErrPChannelCountMismatch)
}

func TestTopologyRoundTrip(t *testing.T) {
	c, err := messages.NewCodec("a", nil)
	require.NoError(t, err)
	topo := messages.Star(member("a", 2), member("b", 2))
	p, err := streamwal.NewPChannel("pchan", 1)
	require.NoError(t, err)
	m, err := c.NewPChannelBody(messages.TypeAlterReplicateConfig, p, topo)
	require.NoError(t, err)
	require.True(t, m.Unreplicable(), "each member is configured by its own broadcast")
	var back messages.Topology
	require.NoError(t, m.Body(&back))
	require.Equal(t, topo, back)
}

func TestTopologyClone(t *testing.T) {
	topo := messages.Star(member("a", 2), member("b", 2))
	topo.Version, topo.Handover = 7, "b"
	topo.Edges[0].Start = []messages.MessageID{5, 6}
	c := topo.Clone()
	require.Equal(t, topo, c)
	c.Members[1].PChannels[0] = "changed-0"
	c.Edges[0].Target = "z"
	c.Edges[0].Start[1] = 9
	require.Equal(t, "pchan-0", topo.Members[1].PChannels[0])
	require.Equal(t, streamwal.Cluster("b"), topo.Edges[0].Target)
	require.Equal(t, []messages.MessageID{5, 6}, topo.Edges[0].Start)
}

// TestTopologyChanges: the topologies a switchover, a failover and a
// removal set are valid stars, and versions order them.
func TestTopologyChanges(t *testing.T) {
	topo := messages.Star(member("a", 2), member("b", 2), member("c", 2))
	topo.Version = 3

	fence := topo.Clone()
	fence.Handover = "b"
	require.NoError(t, fence.Validate())

	swapped := fence.Promote("b")
	require.NoError(t, swapped.Validate())
	require.Equal(t, uint64(3), swapped.Version)
	require.Empty(t, swapped.Handover, "the new primary hands over to nobody")
	require.Equal(t, messages.RolePrimary, swapped.Role("b"))
	for _, c := range []streamwal.Cluster{"a", "c"} {
		src, ok := swapped.Source(c)
		require.True(t, ok)
		require.Equal(t, streamwal.Cluster("b"), src.Cluster)
	}
	require.Equal(t, []streamwal.Cluster{"a", "c"}, clusters(swapped.Secondaries()))

	failed := topo.Without("a").Promote("c")
	require.NoError(t, failed.Validate())
	require.Equal(t, []streamwal.Cluster{"b", "c"}, clusters(failed.Members))
	require.Equal(t, []messages.ReplicateEdge{{Source: "c", Target: "b"}}, failed.Edges)

	removed := fence.Without("b")
	require.NoError(t, removed.Validate())
	require.Empty(t, removed.Handover, "no handover to a member removed")
	require.Equal(t, []streamwal.Cluster{"a", "c"}, clusters(removed.Members))
	require.Len(t, topo.Members, 3, "Without leaves its topology as it was")

	newer := topo.Clone()
	newer.Version++
	require.True(t, topo.OlderThan(newer))
	require.False(t, newer.OlderThan(topo))
	require.False(t, topo.OlderThan(topo), "the same version again is no older")
	require.False(t, messages.Topology{}.OlderThan(messages.Topology{}), "unversioned after unversioned")
}

// clusters are the names of ms.
func clusters(ms []messages.ReplicateMember) []streamwal.Cluster {
	var out []streamwal.Cluster
	for _, m := range ms {
		out = append(out, m.Cluster)
	}
	return out
}
