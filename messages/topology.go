package messages

import (
	"fmt"
	"slices"

	"github.com/streamwal/streamwal"
)

// Topology is the replication topology an AlterReplicateConfig carries:
// the member clusters, the primary and the edges along which logs
// replicate. Only a star is valid: one primary, an edge from it to every
// other member (each a secondary), no other edge, and the same PChannel
// count everywhere.
//
// Topologies are ordered by Version: each change the command line makes
// (configure, switchover, failover, remove) carries a version above that
// of every member it reads, and a cluster never goes back to an older
// one (its coordinator refuses to broadcast it, its WALs ignore it where
// it lands anyway), so that a change that arrives late, or is retried
// after a newer one, never stops or redirects a replicator. Version 0 is
// unversioned: it is ordered before every other and after none, so that
// an unversioned topology replaces an unversioned one.
type Topology struct {
	// Version orders topologies (see above).
	Version uint64            `json:"version,omitempty"`
	Members []ReplicateMember `json:"members"`
	Primary streamwal.Cluster `json:"primary"`
	Edges   []ReplicateEdge   `json:"edges,omitempty"`
	// Handover, set on the primary's own topology during a switchover,
	// names the secondary that takes over: the primary takes no direct
	// write any more (they are refused with NOT_PRIMARY naming it) while
	// the secondaries catch up with its log.
	Handover streamwal.Cluster `json:"handover,omitempty"`
}

// OlderThan reports whether t is older than cur, which a cluster holding
// cur never goes back to.
func (t Topology) OlderThan(cur Topology) bool { return t.Version < cur.Version }

// Promote is the star of t's members around c, with t's version: c the
// primary, every other member its secondary, replicating from c's first
// message (set the edges' Start to begin elsewhere).
func (t Topology) Promote(c streamwal.Cluster) Topology {
	out := Topology{Version: t.Version, Members: t.Clone().Members, Primary: c}
	for _, m := range out.Members {
		if m.Cluster != c {
			out.Edges = append(out.Edges, ReplicateEdge{Source: c, Target: m.Cluster})
		}
	}
	return out
}

// Without is t without member c and its edges.
func (t Topology) Without(c streamwal.Cluster) Topology {
	out := t.Clone()
	out.Members = slices.DeleteFunc(out.Members, func(m ReplicateMember) bool { return m.Cluster == c })
	out.Edges = slices.DeleteFunc(out.Edges, func(e ReplicateEdge) bool { return e.Source == c || e.Target == c })
	if out.Handover == c {
		out.Handover = ""
	}
	return out
}

// Secondaries are the members other than the primary, in member order.
func (t Topology) Secondaries() []ReplicateMember {
	var out []ReplicateMember
	for _, m := range t.Members {
		if m.Cluster != t.Primary {
			out = append(out, m)
		}
	}
	return out
}

// Star is the star topology of primary and secondaries, with an edge
// from the primary to each secondary.
func Star(primary ReplicateMember, secondaries ...ReplicateMember) Topology {
	t := Topology{Members: append([]ReplicateMember{primary}, secondaries...), Primary: primary.Cluster}
	for _, s := range secondaries {
		t.Edges = append(t.Edges, ReplicateEdge{Source: primary.Cluster, Target: s.Cluster})
	}
	return t
}

// Clone is a deep copy of t.
func (t Topology) Clone() Topology {
	out := Topology{Version: t.Version, Primary: t.Primary, Handover: t.Handover, Members: slices.Clone(t.Members), Edges: slices.Clone(t.Edges)}
	for i := range out.Members {
		out.Members[i].PChannels = slices.Clone(out.Members[i].PChannels)
	}
	for i := range out.Edges {
		out.Edges[i].Start = slices.Clone(out.Edges[i].Start)
	}
	return out
}

// Validate checks that t is a star whose members all have the same
// PChannel count (streamwal.ErrPChannelCountMismatch otherwise) and
// well-formed names; every other refusal is streamwal.ErrInvalidArgument.
func (t Topology) Validate() error {
	if len(t.Members) == 0 {
		return invalidTopology("no member cluster")
	}
	seen := map[streamwal.Cluster]bool{}
	for _, m := range t.Members {
		if err := m.validate(len(t.Members) > 1); err != nil {
			return err
		}
		if seen[m.Cluster] {
			return invalidTopology("cluster %s is listed twice", m.Cluster)
		}
		seen[m.Cluster] = true
	}
	for _, m := range t.Members[1:] {
		if len(m.PChannels) != len(t.Members[0].PChannels) {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "cluster %s has %d pchannels, cluster %s %d: %w",
				t.Members[0].Cluster, len(t.Members[0].PChannels), m.Cluster, len(m.PChannels), streamwal.ErrPChannelCountMismatch)
		}
	}
	if !seen[t.Primary] {
		return invalidTopology("the primary %q is not a member", t.Primary)
	}
	if err := t.validateEdges(seen); err != nil {
		return err
	}
	if _, ok := t.Source(t.Handover); t.Handover != "" && !ok {
		return invalidTopology("the primary hands over to %q, which is not one of its secondaries", t.Handover)
	}
	return nil
}

// validateEdges checks that the edges are exactly those of a star around
// the primary.
func (t Topology) validateEdges(members map[streamwal.Cluster]bool) error {
	into := map[streamwal.Cluster]bool{}
	for _, e := range t.Edges {
		switch {
		case !members[e.Source] || !members[e.Target]:
			return invalidTopology("edge %s -> %s names a cluster that is not a member", e.Source, e.Target)
		case e.Source != t.Primary || e.Target == t.Primary:
			return invalidTopology("edge %s -> %s: only a star is supported, every edge goes from the primary %s to a secondary", e.Source, e.Target, t.Primary)
		case into[e.Target]:
			return invalidTopology("edge %s -> %s is listed twice", e.Source, e.Target)
		case len(e.Start) > 0 && len(e.Start) != len(t.Members[0].PChannels):
			return invalidTopology("edge %s -> %s starts %d pchannels of %d", e.Source, e.Target, len(e.Start), len(t.Members[0].PChannels))
		case slices.Contains(e.Start, 0):
			return invalidTopology("edge %s -> %s starts a pchannel at message 0", e.Source, e.Target)
		}
		into[e.Target] = true
	}
	for _, m := range t.Members {
		if m.Cluster != t.Primary && !into[m.Cluster] {
			return invalidTopology("cluster %s has no edge from the primary %s", m.Cluster, t.Primary)
		}
	}
	return nil
}

// validate checks one member; a member of a topology of several needs a
// URL, since the others may have to read from it.
func (m ReplicateMember) validate(needURL bool) error {
	if _, err := streamwal.ParseCluster(string(m.Cluster)); err != nil {
		return invalidTopology("member: %v", err)
	}
	if needURL && m.URL == "" {
		return invalidTopology("cluster %s has no url", m.Cluster)
	}
	if len(m.PChannels) == 0 {
		return invalidTopology("cluster %s lists no pchannel", m.Cluster)
	}
	for i, name := range m.PChannels {
		p, err := streamwal.ParsePChannel(name)
		if err != nil {
			return invalidTopology("cluster %s: %v", m.Cluster, err)
		}
		if p.Index() != i {
			return invalidTopology("cluster %s lists %s at position %d: pchannels go in index order", m.Cluster, name, i)
		}
	}
	return nil
}

// CheckFor validates t as the topology cluster c, with the PChannels
// pchannels, is given: c must be a member listing exactly those
// PChannels (a count that differs is streamwal.ErrPChannelCountMismatch).
func (t Topology) CheckFor(c streamwal.Cluster, pchannels []string) error {
	if err := t.Validate(); err != nil {
		return err
	}
	m, ok := t.Member(c)
	if !ok {
		return invalidTopology("cluster %s is not a member of the topology", c)
	}
	if len(m.PChannels) != len(pchannels) {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "the topology gives cluster %s %d pchannels, it has %d: %w",
			c, len(m.PChannels), len(pchannels), streamwal.ErrPChannelCountMismatch)
	}
	if !slices.Equal(m.PChannels, pchannels) {
		return invalidTopology("the topology names the pchannels of cluster %s %v, they are %v", c, m.PChannels, pchannels)
	}
	return nil
}

// Member returns the member c, if it is one.
func (t Topology) Member(c streamwal.Cluster) (ReplicateMember, bool) {
	for _, m := range t.Members {
		if m.Cluster == c {
			return m, true
		}
	}
	return ReplicateMember{}, false
}

// Role is c's role: RolePrimary for the primary (and for a cluster outside
// the topology, which takes writes as before), RoleSecondary for the
// target of an edge.
func (t Topology) Role(c streamwal.Cluster) ReplicateRole {
	if _, ok := t.Source(c); ok {
		return RoleSecondary
	}
	return RolePrimary
}

// Source returns the member whose log replicates into c, if any.
func (t Topology) Source(c streamwal.Cluster) (ReplicateMember, bool) {
	if e, ok := t.Edge(c); ok {
		return t.Member(e.Source)
	}
	return ReplicateMember{}, false
}

// Edge returns the edge into c, if any.
func (t Topology) Edge(c streamwal.Cluster) (ReplicateEdge, bool) {
	for _, e := range t.Edges {
		if e.Target == c {
			return e, true
		}
	}
	return ReplicateEdge{}, false
}

// invalidTopology is the refusal of a topology that is not a valid star.
func invalidTopology(format string, args ...any) error {
	return streamwal.Errorf(streamwal.CodeInvalidArgument, "replication topology: %s", fmt.Sprintf(format, args...))
}
