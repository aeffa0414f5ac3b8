package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// The changes of a running topology (DESIGN.md §11): switchover,
// failover and the removal of a member. Each reads the topology from the
// cluster the connection flags name, reaches the members at the URLs the
// topology lists (with the same credentials), and configures each member
// by an AlterReplicateConfig broadcast of its own, with a version above
// every version it read (messages.Topology), so that a change that lands
// late never undoes a newer one.

// change is what the commands that change a topology share: how to
// reach a member, where progress goes and whether results are JSON.
type change struct {
	connect  memberConnect
	out      io.Writer // results
	progress io.Writer // progress lines: out in text, stderr with --json
	asJSON   bool
}

// newChange is the change of a command run with f; withoutClient gives
// connect.
func newChange(cmd *cobra.Command, f *connFlags, connect memberConnect) *change {
	ch := &change{connect: connect, out: cmd.OutOrStdout(), progress: cmd.OutOrStdout(), asJSON: f.json}
	if f.json {
		ch.progress = cmd.ErrOrStderr()
	}
	return ch
}

// say writes a progress line.
func (ch *change) say(format string, args ...any) {
	fmt.Fprintf(ch.progress, format+"\n", args...)
}

// reached is a member of the topology, a client of it and its own
// topology (ok false: it has none).
type reached struct {
	member messages.ReplicateMember
	c      *client.Client
	topo   messages.Topology
	ok     bool
}

// entry reads the topology of the cluster the connection flags name.
func (ch *change) entry(ctx context.Context, f *connFlags) (messages.Topology, error) {
	cluster, err := streamwal.ParseCluster(f.cluster)
	if err != nil {
		return messages.Topology{}, fmt.Errorf("--cluster: %w", err)
	}
	r, err := ch.reach(ctx, messages.ReplicateMember{Cluster: cluster, URL: f.server})
	if err != nil {
		return messages.Topology{}, err
	}
	if !r.ok {
		return messages.Topology{}, fmt.Errorf("cluster %s has no replication topology (see replicate configure)", cluster)
	}
	return r.topo, nil
}

// reach connects to member m and reads its topology.
func (ch *change) reach(ctx context.Context, m messages.ReplicateMember) (*reached, error) {
	c, err := ch.connect(m.Cluster, m.URL)
	if err != nil {
		return nil, err
	}
	r := &reached{member: m, c: c}
	if r.topo, r.ok, err = c.ReplicationTopology(ctx); err != nil {
		return nil, fmt.Errorf("read the topology of cluster %s: %w", m.Cluster, err)
	}
	return r, nil
}

// reachAll reaches the members ms; with all false a member that cannot
// be reached is reported and left out, otherwise it is an error.
func (ch *change) reachAll(ctx context.Context, ms []messages.ReplicateMember, all bool) ([]*reached, error) {
	var out []*reached
	for _, m := range ms {
		r, err := ch.reach(ctx, m)
		switch {
		case err != nil && all:
			return nil, err
		case err != nil:
			ch.say("%s: not reached, left as it is: %v", m.Cluster, err)
		default:
			out = append(out, r)
		}
	}
	return out, nil
}

// find is the member c of rs.
func find(rs []*reached, c streamwal.Cluster) *reached {
	for _, r := range rs {
		if r.member.Cluster == c {
			return r
		}
	}
	return nil
}

// nextVersion is one above the version of every topology in rs and of
// topo.
func nextVersion(topo messages.Topology, rs []*reached) uint64 {
	v := topo.Version
	for _, r := range rs {
		v = max(v, r.topo.Version)
	}
	return v + 1
}

// tell configures r's cluster with topo.
func (ch *change) tell(ctx context.Context, r *reached, topo messages.Topology) (client.BroadcastResult, error) {
	res, err := r.c.ConfigureReplication(ctx, topo)
	if err != nil {
		return res, fmt.Errorf("configure cluster %s: %w", r.member.Cluster, err)
	}
	r.topo, r.ok = topo, true
	return res, nil
}

// landedAt is where topo's broadcast landed on each PChannel of m, by
// index.
func landedAt(m messages.ReplicateMember, res client.BroadcastResult) ([]client.AppendResult, error) {
	out := make([]client.AppendResult, len(m.PChannels))
	for i, name := range m.PChannels {
		a, ok := res.Appended[name]
		if !ok || a.ID == 0 {
			return nil, fmt.Errorf("the configuration of cluster %s reports no message on %s", m.Cluster, name)
		}
		out[i] = a
	}
	return out, nil
}

// withStart is topo with every edge starting where the primary's
// configuration landed (at, by PChannel index).
func withStart(topo messages.Topology, at []client.AppendResult) messages.Topology {
	start := startsOf(at)
	out := topo.Clone()
	for i := range out.Edges {
		out.Edges[i].Start = slices.Clone(start)
	}
	return out
}

// startsOf is the message IDs of at, by PChannel index: the start
// positions of an edge.
func startsOf(at []client.AppendResult) []messages.MessageID {
	start := make([]messages.MessageID, len(at))
	for i, a := range at {
		start[i] = a.ID
	}
	return start
}

// promote configures the target with next, in which it is the primary,
// and then every other member of rs (the target again last, so that it
// records where the others start): they replicate from the target's
// messages from where it took its role on. It returns the topology the
// members hold, the errors of the members it could not configure after
// the target, and err when the target itself could not be promoted.
func (ch *change) promote(ctx context.Context, target *reached, rs []*reached, next messages.Topology) (_ messages.Topology, others, err error) {
	res, err := ch.tell(ctx, target, next)
	if err != nil {
		return next, nil, err
	}
	at, err := landedAt(target.member, res)
	if err != nil {
		return next, nil, err
	}
	next = withStart(next, at)
	ch.say("%s: primary (version %d)", target.member.Cluster, next.Version)
	var errs []error
	for _, r := range rs {
		if r == target {
			continue
		}
		if _, err := ch.tell(ctx, r, next); err != nil {
			errs = append(errs, err)
			continue
		}
		ch.say("%s: secondary of %s, from its messages %v on", r.member.Cluster, target.member.Cluster, next.Edges[0].Start)
	}
	if _, err := ch.tell(ctx, target, next); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		others = fmt.Errorf("%s is the primary, but not every member could be told (configure them again): %w", target.member.Cluster, errors.Join(errs...))
	}
	return next, others, nil
}

// changed is what switchover, failover and remove report of the
// topology they set.
type changed struct {
	Version uint64            `json:"version"`
	Primary streamwal.Cluster `json:"primary"`
	Members []configured      `json:"members"`
	// Held is, after a failover, what the new primary holds of the old
	// one's log, per PChannel.
	Held []heldChannel `json:"held,omitempty"`
	// Lost is, after a rejoin, what the old primary holds past what the
	// new one replicated of it, per PChannel.
	Lost []lostChannel `json:"lost,omitempty"`
}

// report prints what a change set: JSON, or a line per member.
func (ch *change) report(res changed, topo messages.Topology) error {
	for _, m := range topo.Members {
		res.Members = append(res.Members, configured{Cluster: m.Cluster, Role: topo.Role(m.Cluster), PChannels: len(m.PChannels), Version: topo.Version})
	}
	res.Version, res.Primary = topo.Version, topo.Primary
	if ch.asJSON {
		return printJSON(ch.out, res)
	}
	fmt.Fprintf(ch.out, "topology version %d: primary %s", topo.Version, topo.Primary)
	for _, m := range topo.Secondaries() {
		fmt.Fprintf(ch.out, ", secondary %s", m.Cluster)
	}
	fmt.Fprintln(ch.out)
	return nil
}
