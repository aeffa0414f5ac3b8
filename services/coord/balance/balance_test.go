package balance_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/coord/balance"
)

func pchannels(t require.TestingT, n int) []streamwal.PChannel {
	ps, err := streamwal.PChannels("pchan", n)
	require.NoError(t, err)
	return ps
}

func nodesOf(ids ...streamwal.NodeID) []balance.Node {
	out := make([]balance.Node, len(ids))
	for i, id := range ids {
		out[i] = balance.Node{ID: id}
	}
	return out
}

// layout returns n channels with the given owners in turn (owners[i%len]).
func layout(t require.TestingT, n int, owners ...streamwal.NodeID) []balance.Channel {
	var out []balance.Channel
	for i, p := range pchannels(t, n) {
		out = append(out, balance.Channel{PChannel: p, Owner: owners[i%len(owners)]})
	}
	return out
}

func live(nodes []balance.Node) map[streamwal.NodeID]bool {
	out := map[streamwal.NodeID]bool{}
	for _, n := range nodes {
		out[n.ID] = true
	}
	return out
}

// apply checks a plan against the layout and returns the layout after it:
// each channel moves at most once, From is its live owner ("" when it has
// none), To is live and differs from From, and no more than MaxMoves moves
// concern live-owned channels.
func apply(t require.TestingT, p balance.Policy, nodes []balance.Node, channels []balance.Channel, moves []balance.Move) []balance.Channel {
	alive := live(nodes)
	at := map[streamwal.PChannel]int{}
	for i, c := range channels {
		at[c.PChannel] = i
	}
	out := append([]balance.Channel(nil), channels...)
	seen := map[streamwal.PChannel]bool{}
	owned := 0
	for _, m := range moves {
		i, ok := at[m.PChannel]
		require.True(t, ok, "move of unknown %s", m.PChannel)
		require.False(t, seen[m.PChannel], "%s moves twice in one round", m.PChannel)
		seen[m.PChannel] = true
		want := out[i].Owner
		if !alive[want] {
			want = ""
		}
		require.Equal(t, want, m.From, "move of %s", m.PChannel)
		require.True(t, alive[m.To], "move of %s to dead node %q", m.PChannel, m.To)
		require.NotEqual(t, m.From, m.To)
		if m.From != "" {
			owned++
		}
		out[i].Owner = m.To
	}
	require.LessOrEqual(t, owned, p.MaxMoves, "moves of live-owned channels")
	for _, c := range out {
		require.True(t, alive[c.Owner], "%s has no live owner after the plan", c.PChannel)
	}
	return out
}

// converge plans and applies rounds until a plan is empty, checking every
// round with apply and checkMoves and, when every channel weighs the same
// (uniform), that no channel ever goes back to a node it left in an earlier
// round (in particular not in the next one). It returns the fixed point and
// the number of non-empty rounds.
func converge(t require.TestingT, p balance.Policy, nodes []balance.Node, channels []balance.Channel, maxRounds int, uniform bool) ([]balance.Channel, int) {
	left := map[streamwal.PChannel]map[streamwal.NodeID]bool{}
	for round := range maxRounds {
		moves := p.Plan(nodes, channels)
		if len(moves) == 0 {
			return channels, round
		}
		checkMoves(t, p, nodes, channels, moves, uniform)
		for _, m := range moves {
			if uniform {
				require.False(t, left[m.PChannel][m.To], "%s goes back to %s", m.PChannel, m.To)
			}
			if m.From != "" {
				if left[m.PChannel] == nil {
					left[m.PChannel] = map[streamwal.NodeID]bool{}
				}
				left[m.PChannel][m.From] = true
			}
		}
		channels = apply(t, p, nodes, channels, moves)
	}
	require.Fail(t, "no fixed point", "after %d rounds", maxRounds)
	return nil, 0
}

func counts(nodes []balance.Node, channels []balance.Channel) map[streamwal.NodeID]int {
	out := map[streamwal.NodeID]int{}
	for _, n := range nodes {
		out[n.ID] = 0
	}
	for _, c := range channels {
		if _, ok := out[c.Owner]; ok {
			out[c.Owner]++
		}
	}
	return out
}

func spread(m map[streamwal.NodeID]int) int {
	lo, hi := math.MaxInt, math.MinInt
	for _, v := range m {
		lo, hi = min(lo, v), max(hi, v)
	}
	return hi - lo
}

func TestDefaultPolicy(t *testing.T) {
	p := balance.DefaultPolicy()
	require.Equal(t, balance.Policy{PChannelWeight: 0.4, VChannelWeight: 0.3, MaxMoves: 3, Tolerance: 0.01}, p)
	require.NoError(t, p.Validate())
}

func TestValidate(t *testing.T) {
	d := balance.DefaultPolicy()
	bad := map[string]func(*balance.Policy){
		"negative pchannel weight": func(p *balance.Policy) { p.PChannelWeight = -0.1 },
		"negative vchannel weight": func(p *balance.Policy) { p.VChannelWeight = -1 },
		"NaN weight":               func(p *balance.Policy) { p.VChannelWeight = math.NaN() },
		"infinite weight":          func(p *balance.Policy) { p.PChannelWeight = math.Inf(1) },
		"zero weights":             func(p *balance.Policy) { p.PChannelWeight, p.VChannelWeight = 0, 0 },
		"negative max moves":       func(p *balance.Policy) { p.MaxMoves = -1 },
		"negative tolerance":       func(p *balance.Policy) { p.Tolerance = -0.01 },
		"NaN tolerance":            func(p *balance.Policy) { p.Tolerance = math.NaN() },
	}
	for name, mutate := range bad {
		t.Run(name, func(t *testing.T) {
			p := d
			mutate(&p)
			err := p.Validate()
			require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
			require.Equal(t, streamwal.CodeInvalidArgument, streamwal.CodeOf(err))
		})
	}
	ok := []balance.Policy{
		{PChannelWeight: 1},
		{VChannelWeight: 1, MaxMoves: 0, Tolerance: 0},
		{PChannelWeight: 0.4, VChannelWeight: 0.3, MaxMoves: 100, Tolerance: 2},
	}
	for _, p := range ok {
		require.NoError(t, p.Validate(), "%+v", p)
	}
}

func TestInvalidPolicyPlansAsDefault(t *testing.T) {
	nodes := nodesOf("a", "b")
	channels := layout(t, 16, "a")
	bad := balance.Policy{PChannelWeight: -1, MaxMoves: -5}
	require.Equal(t, balance.DefaultPolicy().Plan(nodes, channels), bad.Plan(nodes, channels))
	require.Equal(t, balance.DefaultPolicy().Load(nodes, channels), bad.Load(nodes, channels))
}

func TestNoNodesNoMoves(t *testing.T) {
	p := balance.DefaultPolicy()
	require.Empty(t, p.Plan(nil, layout(t, 4, "a", "")))
	require.Empty(t, p.Plan(nodesOf(""), layout(t, 4, "")), "a node without an ID is not a node")
	require.Empty(t, p.Load(nil, layout(t, 4, "a")))
}

func TestNoChannelsNoMoves(t *testing.T) {
	p := balance.DefaultPolicy()
	require.Empty(t, p.Plan(nodesOf("a", "b"), nil))
	require.Equal(t, map[streamwal.NodeID]float64{"a": 0, "b": 0}, p.Load(nodesOf("a", "b"), nil))
}

// TestNodesJoin: 16 PChannels on one node, then one or two nodes join;
// rounds of at most MaxMoves moves converge to 8/8 and 6/5/5.
func TestNodesJoin(t *testing.T) {
	p := balance.DefaultPolicy()
	for _, tc := range []struct {
		nodes []balance.Node
		want  []int
	}{
		{nodesOf("a", "b"), []int{8, 8}},
		{nodesOf("a", "b", "c"), []int{6, 5, 5}},
	} {
		t.Run(fmt.Sprint(len(tc.nodes)), func(t *testing.T) {
			start := layout(t, 16, "a")
			first := p.Plan(tc.nodes, start)
			require.Len(t, first, p.MaxMoves, "a round is bounded")
			for _, m := range first {
				require.Equal(t, streamwal.NodeID("a"), m.From)
			}
			final, rounds := converge(t, p, tc.nodes, start, 50, true)
			moved := 16 - tc.want[0]
			require.Equal(t, (moved+p.MaxMoves-1)/p.MaxMoves, rounds, "as few rounds as MaxMoves allows")
			c := counts(tc.nodes, final)
			var got []int
			for _, n := range tc.nodes {
				got = append(got, c[n.ID])
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// TestDeadNode: the PChannels of a node that left are all reassigned in
// one round, spread over the survivors, beyond MaxMoves.
func TestDeadNode(t *testing.T) {
	p := balance.DefaultPolicy()
	before := layout(t, 16, "a", "b", "c") // 6/5/5
	survivors := nodesOf("b", "c")
	moves := p.Plan(survivors, before)
	require.Len(t, moves, 6)
	for _, m := range moves {
		require.Empty(t, m.From, "a dead owner is no owner")
	}
	after := apply(t, p, survivors, before, moves)
	require.Equal(t, map[streamwal.NodeID]int{"b": 8, "c": 8}, counts(survivors, after))
	require.Empty(t, p.Plan(survivors, after))

	// Orphans and a rebalance in one round: 4 unassigned channels and 12
	// on a; the orphans all go to the empty node b, then MaxMoves more.
	channels := layout(t, 16, "a")
	for i := range 4 {
		channels[12+i].Owner = ""
	}
	two := nodesOf("a", "b")
	moves = p.Plan(two, channels)
	require.Len(t, moves, 4+p.MaxMoves)
	for i, m := range moves {
		if i < 4 {
			require.Equal(t, balance.Move{PChannel: channels[12+i].PChannel, To: "b"}, m, "orphans first, in PChannel order")
		} else {
			require.Equal(t, streamwal.NodeID("a"), m.From)
			require.Equal(t, streamwal.NodeID("b"), m.To)
		}
	}
	after = apply(t, p, two, channels, moves)
	require.Equal(t, map[streamwal.NodeID]int{"a": 9, "b": 7}, counts(two, after))
	final, rounds := converge(t, p, two, after, 10, true)
	require.Equal(t, 1, rounds)
	require.Equal(t, map[streamwal.NodeID]int{"a": 8, "b": 8}, counts(two, final))
}

// TestBalancedPlansNothing: balanced clusters, and clusters off by one
// channel, plan nothing.
func TestBalancedPlansNothing(t *testing.T) {
	p := balance.DefaultPolicy()
	require.Empty(t, p.Plan(nodesOf("a", "b"), layout(t, 16, "a", "b")))
	require.Empty(t, p.Plan(nodesOf("a", "b"), layout(t, 17, "a", "b")))
	require.Empty(t, p.Plan(nodesOf("a", "b", "c"), layout(t, 16, "a", "b", "c")))
	require.Empty(t, p.Plan(nodesOf("a"), layout(t, 16, "a")))
	for _, tol := range []float64{0, 0.5, 0.99} {
		q := p
		q.Tolerance = tol
		require.Empty(t, q.Plan(nodesOf("a", "b"), layout(t, 17, "a", "b")), "tolerance %v", tol)
		require.Len(t, q.Plan(nodesOf("a", "b"), layout(t, 18, "a", "a", "b")), 3, "12/6 wants three moves, tolerance %v", tol)
	}
	// Even far beyond an absolute bound's reach: 400 PChannels, one
	// weighs 0.4/200 = 0.002 < Tolerance, and still 201/199 is evened out.
	channels := layout(t, 400, "a", "b")
	channels[1].Owner = "a"
	moves := p.Plan(nodesOf("a", "b"), channels)
	require.Len(t, moves, 1)
	require.Equal(t, balance.Move{PChannel: channels[0].PChannel, From: "a", To: "b"}, moves[0], "the first of equals in PChannel order")
}

// TestTolerance: a move must lower the imbalance by more than Tolerance
// relative to the channel's own weight w, that is gap > (1+Tolerance)·w.
func TestTolerance(t *testing.T) {
	ps := pchannels(t, 3)
	channels := []balance.Channel{
		{PChannel: ps[0], Owner: "a", VChannels: 5},
		{PChannel: ps[1], Owner: "a"},
		{PChannel: ps[2], Owner: "b", VChannels: 4},
	}
	nodes := nodesOf("a", "b")
	// One PChannel weighs 2/3, one VChannel 2/9: a is 22/9, b 14/9, the gap
	// 8/9; ps[1] weighs 6/9, so the gap exceeds it by a third of it.
	p := balance.Policy{PChannelWeight: 1, VChannelWeight: 1, MaxMoves: 3, Tolerance: 0.3}
	load := p.Load(nodes, channels)
	require.InDelta(t, 8.0/9, load["a"]-load["b"], 1e-12)
	require.Equal(t, []balance.Move{{PChannel: ps[1], From: "a", To: "b"}}, p.Plan(nodes, channels))
	p.Tolerance = 0.34
	require.Empty(t, p.Plan(nodes, channels))
}

// TestVChannelWeight: a node with few PChannels but many VChannels counts
// as loaded, and the policy moves away from it, not towards it.
func TestVChannelWeight(t *testing.T) {
	p := balance.DefaultPolicy()
	nodes := nodesOf("a", "b")
	ps := pchannels(t, 8)
	channels := make([]balance.Channel, 8)
	for i, pc := range ps {
		channels[i] = balance.Channel{PChannel: pc, Owner: "b", VChannels: 2}
		if i < 2 {
			channels[i] = balance.Channel{PChannel: pc, Owner: "a", VChannels: 40}
		}
	}
	load := p.Load(nodes, channels)
	// avg 4 PChannels, 46 VChannels per node.
	require.InDelta(t, 0.4*2/4+0.3*80/46.0, load["a"], 1e-12)
	require.InDelta(t, 0.4*6/4+0.3*12/46.0, load["b"], 1e-12)
	require.Greater(t, load["a"], load["b"], "2 PChannels with 80 VChannels outweigh 6 with 12")
	require.Empty(t, p.Plan(nodes, channels), "a pure PChannel count would move two channels to a")

	// Equal PChannel counts, a carries every VChannel: a gives one away.
	for i := range channels {
		channels[i] = balance.Channel{PChannel: ps[i], Owner: "b"}
		if i%2 == 0 {
			channels[i] = balance.Channel{PChannel: ps[i], Owner: "a", VChannels: 20}
		}
	}
	moves := p.Plan(nodes, channels)
	require.Equal(t, []balance.Move{{PChannel: ps[0], From: "a", To: "b"}}, moves)
	after := apply(t, p, nodes, channels, moves)
	require.Empty(t, p.Plan(nodes, after))
	load = p.Load(nodes, after)
	require.InDelta(t, 0.75, load["a"], 1e-12)
	require.InDelta(t, 0.65, load["b"], 1e-12)

	// Orphans go heaviest first to the least loaded node.
	for i := range channels {
		channels[i] = balance.Channel{PChannel: ps[i], VChannels: i}
	}
	moves = p.Plan(nodes, channels)
	require.Len(t, moves, 8)
	require.Equal(t, ps[7], moves[0].PChannel)
	require.Equal(t, ps[6], moves[1].PChannel)
	after = apply(t, p, nodes, channels, moves)
	load = p.Load(nodes, after)
	require.InDelta(t, 1.4, load["a"]+load["b"], 1e-12, "loads sum to (PChannelWeight+VChannelWeight)·nodes")
	require.InDelta(t, load["a"], load["b"], 0.05)
}

// TestRoundEndsAtReceiver: once the most loaded node is one that received
// a channel in this round, the round ends instead of shuffling channels
// around it (which could send one straight back in the next round).
func TestRoundEndsAtReceiver(t *testing.T) {
	p := balance.DefaultPolicy()
	nodes := nodesOf("n0", "n1", "n2")
	ps := pchannels(t, 7)
	owners := []streamwal.NodeID{"n2", "", "", "n2", "n2", "n2", ""}
	vchannels := []int{0, 0, 0, 0, 3, 6, 2}
	var channels []balance.Channel
	for i := range ps {
		channels = append(channels, balance.Channel{PChannel: ps[i], Owner: owners[i], VChannels: vchannels[i]})
	}
	moves := p.Plan(nodes, channels)
	require.Equal(t, []balance.Move{
		{PChannel: ps[6], To: "n0"}, {PChannel: ps[1], To: "n1"}, {PChannel: ps[2], To: "n1"},
		{PChannel: ps[5], From: "n2", To: "n0"},
	}, moves, "n0 is now the most loaded")
	channels = apply(t, p, nodes, channels, moves)
	moves = p.Plan(nodes, channels)
	require.Equal(t, []balance.Move{{PChannel: ps[6], From: "n0", To: "n1"}}, moves)
	channels = apply(t, p, nodes, channels, moves)
	require.Empty(t, p.Plan(nodes, channels))
}

func TestLoad(t *testing.T) {
	p := balance.DefaultPolicy()
	nodes := nodesOf("a", "b", "c", "a")
	channels := layout(t, 6, "a", "a", "b", "b", "b", "gone")
	load := p.Load(nodes, channels)
	// 6 channels over 3 nodes: 2 per node on average; no VChannels at all.
	require.Len(t, load, 3)
	require.InDelta(t, 0.4, load["a"], 1e-12)
	require.InDelta(t, 0.6, load["b"], 1e-12)
	require.Zero(t, load["c"])
}

// TestDeterministic: the same input in any order gives the same plan.
func TestDeterministic(t *testing.T) {
	p := balance.DefaultPolicy()
	r := rand.New(rand.NewPCG(1, 2))
	nodes := nodesOf("n3", "n1", "n2", "n4")
	var channels []balance.Channel
	owners := []streamwal.NodeID{"n1", "n1", "n1", "n2", "", "dead", "n1", "n3"}
	for i, pc := range pchannels(t, 24) {
		channels = append(channels, balance.Channel{PChannel: pc, Owner: owners[i%len(owners)], VChannels: r.IntN(10)})
	}
	want := p.Plan(nodes, channels)
	require.NotEmpty(t, want)
	wantLoad := p.Load(nodes, channels)
	for range 20 {
		n := append([]balance.Node(nil), nodes...)
		c := append([]balance.Channel(nil), channels...)
		r.Shuffle(len(n), func(i, j int) { n[i], n[j] = n[j], n[i] })
		r.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
		require.Equal(t, want, p.Plan(n, c))
		require.Equal(t, wantLoad, p.Load(n, c))
	}
}

// TestDuplicates: repeated nodes and channels count once.
func TestDuplicates(t *testing.T) {
	p := balance.DefaultPolicy()
	channels := layout(t, 8, "a")
	doubled := append(append([]balance.Channel(nil), channels...), channels...)
	nodes := nodesOf("a", "b", "b", "")
	require.Equal(t, p.Plan(nodesOf("a", "b"), channels), p.Plan(nodes, doubled))
	require.Equal(t, p.Load(nodesOf("a", "b"), channels), p.Load(nodes, doubled))
}

var pool = []streamwal.NodeID{"n0", "n1", "n2", "n3", "n4", "n5", "n6"}

// TestPlanProperties: random clusters (1–5 live nodes, 1–32 channels with
// live, dead and no owners and 0–20 VChannels) and random valid policies.
// Every plan leaves every channel with a live owner and moves at most
// MaxMoves live-owned channels; rounds reach a fixed point within 50; the
// fixed point admits no move worth making; with equal channel weights its
// PChannel counts differ by at most one and no channel ever returned to a
// node it left; shuffling the input changes nothing.
func TestPlanProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := balance.DefaultPolicy()
		if rapid.Bool().Draw(t, "custom policy") {
			p = balance.Policy{
				PChannelWeight: rapid.Float64Range(0.05, 1).Draw(t, "pw"),
				VChannelWeight: rapid.Float64Range(0, 1).Draw(t, "vw"),
				MaxMoves:       rapid.IntRange(1, 5).Draw(t, "max moves"),
				Tolerance:      rapid.SampledFrom([]float64{0, 0.01, 0.3, 0.9}).Draw(t, "tolerance"),
			}
		}
		ids := rapid.Permutation(pool).Draw(t, "ids")
		nodes := nodesOf(ids[:rapid.IntRange(1, 5).Draw(t, "nodes")]...)
		owners := append([]streamwal.NodeID{""}, pool...)
		uniform := rapid.IntRange(0, 2).Draw(t, "vchannel mode") // 0: all zero, 1: all equal, 2: random
		same := rapid.IntRange(0, 20).Draw(t, "same vchannels")
		var channels []balance.Channel
		for i, pc := range pchannels(t, rapid.IntRange(1, 32).Draw(t, "channels")) {
			c := balance.Channel{PChannel: pc, Owner: rapid.SampledFrom(owners).Draw(t, fmt.Sprint("owner", i))}
			switch uniform {
			case 1:
				c.VChannels = same
			case 2:
				c.VChannels = rapid.IntRange(0, 20).Draw(t, fmt.Sprint("vchannels", i))
			}
			channels = append(channels, c)
		}

		moves := p.Plan(nodes, channels)
		require.Equal(t, moves, p.Plan(rapid.Permutation(nodes).Draw(t, "shuffled nodes"), rapid.Permutation(channels).Draw(t, "shuffled channels")))

		final, _ := converge(t, p, nodes, channels, 50, uniform < 2)
		checkFixedPoint(t, p, nodes, final)
		if uniform < 2 {
			require.LessOrEqual(t, spread(counts(nodes, final)), 1, "pchannel counts at the fixed point")
		}
	})
}

// checkFixedPoint restates the stopping rule independently: no channel
// weighing w > 0 sits on a node whose load exceeds another's by more than
// (1+Tolerance)·w, with a margin for rounding.
func checkFixedPoint(t *rapid.T, p balance.Policy, nodes []balance.Node, channels []balance.Channel) {
	load := p.Load(nodes, channels)
	for _, c := range channels {
		w := weight(p, nodes, channels, c)
		if w <= 0 {
			continue // moving it gains nothing
		}
		for _, n := range nodes {
			gap := load[c.Owner] - load[n.ID]
			require.LessOrEqual(t, gap, (1+p.Tolerance)*w+1e-6, "%s on %s could go to %s", c.PChannel, c.Owner, n.ID)
		}
	}
}

// checkMoves replays a plan one move at a time: a channel without a live
// owner goes to a least loaded node; every other move is worth making (the
// gap exceeds (1+Tolerance)·w for the channel's weight w) and goes to a
// least loaded node and, when every channel weighs the same, from a most
// loaded one.
func checkMoves(t require.TestingT, p balance.Policy, nodes []balance.Node, channels []balance.Channel, moves []balance.Move, uniform bool) {
	channels = append([]balance.Channel(nil), channels...)
	for _, m := range moves {
		load := p.Load(nodes, channels)
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, l := range load {
			lo, hi = min(lo, l), max(hi, l)
		}
		require.InDelta(t, lo, load[m.To], 1e-9, "move %v: target not least loaded", m)
		for i := range channels {
			if channels[i].PChannel != m.PChannel {
				continue
			}
			if m.From != "" {
				w := weight(p, nodes, channels, channels[i])
				require.Greater(t, load[m.From]-load[m.To], (1+p.Tolerance)*w-1e-9, "move %v is not worth making", m)
				if uniform {
					require.InDelta(t, hi, load[m.From], 1e-9, "move %v: source not most loaded", m)
				}
			}
			channels[i].Owner = m.To
		}
	}
}

// weight is the load c brings to its owner: PChannelWeight/avgPChannels +
// VChannelWeight·vchannels/avgVChannels.
func weight(p balance.Policy, nodes []balance.Node, channels []balance.Channel, c balance.Channel) float64 {
	totalV := 0
	for _, c := range channels {
		totalV += c.VChannels
	}
	w := p.PChannelWeight / (float64(len(channels)) / float64(len(nodes)))
	if totalV > 0 {
		w += p.VChannelWeight * float64(c.VChannels) / (float64(totalV) / float64(len(nodes)))
	}
	return w
}
