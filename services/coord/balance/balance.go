// Package balance is the StreamingCoord's balance policy (DESIGN.md §3,
// §9; issue 5 item 4): which StreamingNode owns which PChannel. It is a
// plain, deterministic data structure: no goroutines, no clock, no I/O. The
// coordinator calls Plan on node join and leave, on its balance timer and
// on demand, and executes the moves it returns (close the WAL on the old
// owner, persist the next term, let the new owner open it).
//
// Semantics:
//   - the load of a node is PChannelWeight·pchannels/avgPChannels +
//     VChannelWeight·vchannels/avgVChannels, the averages taken over the
//     live nodes and every listed channel (a term is 0 when its total is
//     0), so a node with few PChannels that carry many VChannels counts as
//     loaded;
//   - the weight of a channel is the load it brings to its owner:
//     PChannelWeight/avgPChannels + VChannelWeight·vchannels/avgVChannels;
//   - the imbalance is the sum over the live nodes of the squared deviation
//     of their load from the mean load. Moving a channel of weight w from a
//     node to one whose load is lower by gap lowers it by 2w(gap−w). A move
//     is worth making only if that exceeds Tolerance·2w², that is, only if
//     gap > (1+Tolerance)·w: the gain is measured against the channel's own
//     weight, so the test means the same at any cluster size (an absolute
//     bound would stop balancing altogether once one PChannel weighs less
//     than the bound, beyond some 80 PChannels per node at the defaults). A
//     move with gap ≤ w would only swap which of the two nodes is heavier:
//     that is the flapping the tolerance rules out;
//   - one round (Plan) first gives every channel without a live owner to
//     the least-loaded node, heaviest channel first; these moves do not
//     count against MaxMoves. Then it makes up to MaxMoves moves of
//     channels that had a live owner, each to the least loaded node from
//     the most loaded node that has a channel worth moving there (the next
//     most loaded only when the channels of those before are all too heavy
//     to move or already moved this round), choosing the channel that
//     lowers the imbalance most. A channel moves at most once a round, and
//     the round ends early when the most loaded node is one that received a
//     channel in this round: its load is left for the next round to judge;
//   - every move lowers the imbalance strictly, so repeated rounds on a
//     fixed cluster (apply the moves, plan again) cannot cycle: they reach a
//     fixed point, a layout where no single move between any two nodes is
//     worth making, and a balanced cluster plans nothing. When every channel
//     weighs the same (for instance no VChannels anywhere, or the same
//     number on every PChannel) and Tolerance < 1, the PChannel counts of the
//     fixed point differ by at most one, every move goes from a most to a
//     least loaded node, and a channel never goes back to a node it left.
//     With unequal weights a channel may return to a node it left, but
//     only when that lowers the imbalance further;
//   - the result depends only on the sets of nodes and channels, not on
//     their order: ties go to the smaller node ID and to the PChannel with
//     the smaller index.
package balance

import (
	"cmp"
	"math"
	"slices"

	"github.com/streamwal/streamwal"
)

// Node is a live StreamingNode.
type Node struct {
	// ID identifies the node; nodes with an empty ID are ignored and a
	// repeated ID counts once.
	ID streamwal.NodeID
}

// Channel is one PChannel with its current owner and how many VChannels it
// carries.
type Channel struct {
	// PChannel is the channel; a PChannel listed more than once counts once
	// (the first in owner, then VChannels order).
	PChannel streamwal.PChannel
	// Owner is the node that owns the channel: "" when it is unassigned or
	// its owner is dead. An owner not among the live nodes counts as dead.
	Owner streamwal.NodeID
	// VChannels is how many VChannels the channel carries; a negative
	// count counts as 0.
	VChannels int
}

// Move assigns PChannel to To.
type Move struct {
	// PChannel is the channel to move.
	PChannel streamwal.PChannel
	// From is the current live owner, "" when the channel has none (it is
	// unassigned or its owner is dead); such moves are not bounded by
	// MaxMoves.
	From streamwal.NodeID
	// To is the new owner, always a live node.
	To streamwal.NodeID
}

// Policy holds the weights and bounds of the balance policy. The
// anti-affinity weight of Milvus (0.01, DESIGN.md §9) has no counterpart:
// it keeps replicas of one channel apart, and a PChannel here has exactly
// one owner. The balance timer (1 min in Milvus) belongs to the caller.
type Policy struct {
	// PChannelWeight weighs a node's PChannel count relative to the
	// average (default 0.4).
	PChannelWeight float64
	// VChannelWeight weighs a node's VChannel count relative to the
	// average (default 0.3).
	VChannelWeight float64
	// MaxMoves bounds the moves of live-owned channels in one round
	// (default 3); 0 only places channels without a live owner.
	MaxMoves int
	// Tolerance is how much a move must lower the imbalance, as a fraction
	// of what moving the channel could at most gain (default 0.01); see the
	// package doc.
	Tolerance float64
}

// DefaultPolicy returns the Milvus defaults (DESIGN.md §9): weights 0.4
// (PChannel count) and 0.3 (VChannel count), at most 3 moves a round,
// tolerance 0.01.
func DefaultPolicy() Policy {
	return Policy{PChannelWeight: 0.4, VChannelWeight: 0.3, MaxMoves: 3, Tolerance: 0.01}
}

// Validate reports an invalid argument when a weight or the tolerance is
// negative or not finite, both weights are zero, or MaxMoves is negative.
func (p Policy) Validate() error {
	for _, f := range []struct {
		name  string
		value float64
	}{{"pchannel weight", p.PChannelWeight}, {"vchannel weight", p.VChannelWeight}, {"tolerance", p.Tolerance}} {
		if math.IsNaN(f.value) || math.IsInf(f.value, 0) || f.value < 0 {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "balance policy: %s %v must be finite and not negative", f.name, f.value)
		}
	}
	if p.PChannelWeight == 0 && p.VChannelWeight == 0 {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "balance policy: pchannel and vchannel weights are both zero")
	}
	if p.MaxMoves < 0 {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "balance policy: max moves %d must not be negative", p.MaxMoves)
	}
	return nil
}

// effective is p, or DefaultPolicy when p is invalid.
func (p Policy) effective() Policy {
	if p.Validate() != nil {
		return DefaultPolicy()
	}
	return p
}

// epsilon keeps floating-point noise from passing for a gain when
// Tolerance is 0.
const epsilon = 1e-9

// Plan returns the moves of one balance round, in the order they should be
// executed: first every channel without a live owner goes to the
// least-loaded node (heaviest channel first; these moves have From "" and
// do not count against MaxMoves), then up to MaxMoves moves of live-owned
// channels, each from the most to the least loaded node and each only if
// it lowers the imbalance by more than Tolerance (see the package doc), so
// that a balanced cluster plans nothing and rounds never flap. No nodes, no
// moves. A policy that fails Validate plans as DefaultPolicy.
func (p Policy) Plan(nodes []Node, channels []Channel) []Move {
	p = p.effective()
	l := newLayout(p, nodes, channels)
	if len(l.nodes) == 0 {
		return nil
	}
	var moves []Move
	moved := make([]bool, len(l.channels))
	var orphans []int
	for c, o := range l.owner {
		if o < 0 {
			orphans = append(orphans, c)
		}
	}
	slices.SortStableFunc(orphans, func(a, b int) int { return cmp.Compare(l.weight(b), l.weight(a)) })
	for _, c := range orphans {
		to := l.least()
		moves = append(moves, Move{PChannel: l.channels[c].PChannel, To: l.nodes[to]})
		l.assign(c, to)
		moved[c] = true
	}
	for range p.MaxMoves {
		c, from, to, ok := l.best(p.Tolerance, moved)
		if !ok {
			break
		}
		moves = append(moves, Move{PChannel: l.channels[c].PChannel, From: l.nodes[from], To: l.nodes[to]})
		l.assign(c, to)
		moved[c] = true
	}
	return moves
}

// Load returns the weighted load of every live node, for status output:
// PChannelWeight·pchannels/avgPChannels + VChannelWeight·vchannels/avgVChannels
// over the channels it owns (a term is 0 when its total is 0). The averages
// count every listed channel, including those without a live owner, so the
// loads are those Plan balances. A policy that fails Validate weighs as
// DefaultPolicy.
func (p Policy) Load(nodes []Node, channels []Channel) map[streamwal.NodeID]float64 {
	l := newLayout(p.effective(), nodes, channels)
	out := make(map[streamwal.NodeID]float64, len(l.nodes))
	for n, id := range l.nodes {
		out[id] = l.load(n)
	}
	return out
}

// layout is the working state of one round: nodes and channels in their
// canonical order, owners as node indices, and per-node counts.
type layout struct {
	nodes    []streamwal.NodeID // sorted, distinct, not empty
	channels []Channel          // sorted by PChannel, distinct, VChannels >= 0
	owner    []int              // per channel: index into nodes, -1 for no live owner
	pchans   []int              // per node: PChannels owned
	vchans   []int              // per node: VChannels carried
	wp, wv   float64            // load of one PChannel, of one VChannel
}

// newLayout puts nodes and channels in canonical order (dropping empty and
// repeated node IDs, repeated PChannels and negative VChannel counts) and
// counts what each live node owns.
func newLayout(p Policy, nodes []Node, channels []Channel) *layout {
	l := &layout{}
	for _, n := range nodes {
		if n.ID != "" {
			l.nodes = append(l.nodes, n.ID)
		}
	}
	slices.Sort(l.nodes)
	l.nodes = slices.Compact(l.nodes)
	index := make(map[streamwal.NodeID]int, len(l.nodes))
	for n, id := range l.nodes {
		index[id] = n
	}

	l.channels = slices.Clone(channels)
	for c := range l.channels {
		l.channels[c].VChannels = max(l.channels[c].VChannels, 0)
	}
	slices.SortFunc(l.channels, func(a, b Channel) int {
		return cmp.Or(comparePChannel(a.PChannel, b.PChannel), cmp.Compare(a.Owner, b.Owner), cmp.Compare(a.VChannels, b.VChannels))
	})
	l.channels = slices.CompactFunc(l.channels, func(a, b Channel) bool { return a.PChannel == b.PChannel })

	l.owner = make([]int, len(l.channels))
	l.pchans = make([]int, len(l.nodes))
	l.vchans = make([]int, len(l.nodes))
	totalV := 0
	for c, ch := range l.channels {
		totalV += ch.VChannels
		l.owner[c] = -1
		if n, ok := index[ch.Owner]; ok {
			l.owner[c] = n
			l.pchans[n]++
			l.vchans[n] += ch.VChannels
		}
	}
	// X/avg with avg = total/len(nodes) is X·len(nodes)/total.
	if len(l.nodes) > 0 && len(l.channels) > 0 {
		l.wp = p.PChannelWeight * float64(len(l.nodes)) / float64(len(l.channels))
	}
	if len(l.nodes) > 0 && totalV > 0 {
		l.wv = p.VChannelWeight * float64(len(l.nodes)) / float64(totalV)
	}
	return l
}

// comparePChannel orders PChannels by index, then prefix.
func comparePChannel(a, b streamwal.PChannel) int {
	return cmp.Or(cmp.Compare(a.Index(), b.Index()), cmp.Compare(a.Prefix(), b.Prefix()))
}

// load is node n's weighted load, computed from its counts so that equal
// counts give equal loads exactly.
func (l *layout) load(n int) float64 {
	return l.wp*float64(l.pchans[n]) + l.wv*float64(l.vchans[n])
}

// weight is the load channel c brings to its owner.
func (l *layout) weight(c int) float64 {
	return l.wp + l.wv*float64(l.channels[c].VChannels)
}

// excess is gap−w for moving channel c from node from to node to, where
// gap is load(from)−load(to) and w the channel's weight, computed from
// integer count differences so that an exact tie is exactly 0.
func (l *layout) excess(c, from, to int) float64 {
	dp := l.pchans[from] - l.pchans[to] - 1
	dv := l.vchans[from] - l.vchans[to] - l.channels[c].VChannels
	return l.wp*float64(dp) + l.wv*float64(dv)
}

// assign gives channel c to node n.
func (l *layout) assign(c, n int) {
	if o := l.owner[c]; o >= 0 {
		l.pchans[o]--
		l.vchans[o] -= l.channels[c].VChannels
	}
	l.owner[c] = n
	l.pchans[n]++
	l.vchans[n] += l.channels[c].VChannels
}

// least is the least-loaded node, the smallest ID among equals.
func (l *layout) least() int {
	best := 0
	for n := 1; n < len(l.nodes); n++ {
		if l.load(n) < l.load(best) {
			best = n
		}
	}
	return best
}

// byLoad returns the node indices by descending load, ties by ID.
func (l *layout) byLoad() []int {
	order := make([]int, len(l.nodes))
	for n := range order {
		order[n] = n
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(l.load(b), l.load(a)), cmp.Compare(a, b))
	})
	return order
}

// best finds the next move: to the least loaded node, from the most
// loaded node that has an unmoved channel worth moving there, the channel
// that lowers the imbalance most (the first in PChannel order among
// equals). A more loaded target would never help: the gap to it is
// smaller. There is no move when the most loaded node received a channel
// in this round.
func (l *layout) best(tolerance float64, moved []bool) (c, from, to int, ok bool) {
	desc := l.byLoad()
	for ch, o := range l.owner {
		if o == desc[0] && moved[ch] {
			return 0, 0, 0, false
		}
	}
	t := l.least()
	for _, s := range desc {
		if s == t || l.load(s) <= l.load(t) {
			break
		}
		bestGain := 0.0
		for ch, o := range l.owner {
			if o != s || moved[ch] {
				continue
			}
			w := l.weight(ch)
			ex := l.excess(ch, s, t)
			if w <= 0 || ex <= (tolerance+epsilon)*w {
				continue
			}
			if gain := w * ex; !ok || gain > bestGain {
				c, from, to, ok, bestGain = ch, s, t, true, gain
			}
		}
		if ok {
			return c, from, to, true
		}
	}
	return 0, 0, 0, false
}
