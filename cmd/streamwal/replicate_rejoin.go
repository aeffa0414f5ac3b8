package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// newReplicateRejoinCmd is `streamwal replicate rejoin`.
func newReplicateRejoinCmd() *cobra.Command {
	f := &connFlags{}
	cmd := &cobra.Command{
		Use:   "rejoin NAME=URL",
		Short: "Make an old primary, superseded by a failover, a secondary of the new primary",
		Long: "After a failover the old primary, when it comes back, still holds its own\n" +
			"topology and takes writes as a primary. rejoin makes it a secondary of the\n" +
			"primary in force: the topology is read from the cluster --server and --cluster\n" +
			"name (a member of it); NAME, reached at URL, must be a primary of an older\n" +
			"topology. Printed per PChannel first: the messages NAME holds past the last one\n" +
			"the new primary replicated of it, which the failover lost (they stay in NAME's\n" +
			"log and are not replicated). NAME is then configured first (it refuses direct\n" +
			"writes with NOT_PRIMARY from then on) and every member reached after it; NAME\n" +
			"copies the new primary's log from where it took its role on.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			eps, err := parseMembers(args[0], nil)
			if err != nil {
				return err
			}
			return f.withoutClient(cmd, func(ctx context.Context, connect memberConnect) error {
				return newChange(cmd, f, connect).rejoin(ctx, f, eps[0])
			})
		},
	}
	f.add(cmd)
	return cmd
}

// rejoin makes the superseded primary at a secondary of the primary of
// the topology in force.
func (ch *change) rejoin(ctx context.Context, f *connFlags, at memberAt) error {
	topo, err := ch.entry(ctx, f)
	if err != nil {
		return err
	}
	if _, ok := topo.Member(at.cluster); ok {
		return fmt.Errorf("cluster %s is a member of the topology already (version %d)", at.cluster, topo.Version)
	}
	old, err := ch.superseded(ctx, at, topo)
	if err != nil {
		return err
	}
	rs, err := ch.reachAll(ctx, topo.Members, false)
	if err != nil {
		return err
	}
	primary := find(rs, topo.Primary)
	if primary == nil {
		return fmt.Errorf("the primary %s cannot be reached", topo.Primary)
	}
	lost, err := ch.lost(ctx, primary, old)
	if err != nil {
		return err
	}
	next := joined(topo, old.member)
	next.Version = nextVersion(topo, append(rs, old))
	if _, err := ch.tell(ctx, old, next); err != nil {
		return err
	}
	ch.say("%s: secondary of %s (version %d)", at.cluster, topo.Primary, next.Version)
	var errs []error
	for _, r := range rs {
		if _, err := ch.tell(ctx, r, next); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		errs = []error{fmt.Errorf("%s follows %s, but not every member could be told (rejoin again): %w", at.cluster, topo.Primary, errors.Join(errs...))}
	}
	return errors.Join(ch.report(changed{Lost: lost}, next), errors.Join(errs...))
}

// superseded reaches the cluster at and checks that it is the primary of
// a topology older than topo.
func (ch *change) superseded(ctx context.Context, at memberAt, topo messages.Topology) (*reached, error) {
	r, err := ch.reach(ctx, messages.ReplicateMember{Cluster: at.cluster, URL: at.url})
	if err != nil {
		return nil, err
	}
	switch {
	case !r.ok || r.topo.Primary != at.cluster:
		return nil, fmt.Errorf("cluster %s is not the primary of a topology of its own: use replicate configure", at.cluster)
	case !r.topo.OlderThan(topo):
		return nil, fmt.Errorf("cluster %s holds topology version %d, not older than version %d: nothing superseded it", at.cluster, r.topo.Version, topo.Version)
	}
	if r.member, err = r.c.ReplicateMember(ctx, at.url); err != nil {
		return nil, fmt.Errorf("cluster %s at %s: %w", at.cluster, at.url, err)
	}
	return r, nil
}

// joined is topo with m a secondary of its primary, starting where the
// primary took its role (the other edges' start; with none, at the
// primary's first message, whose replicas of m's own messages it skips).
func joined(topo messages.Topology, m messages.ReplicateMember) messages.Topology {
	out := topo.Clone()
	out.Members = append(out.Members, m)
	e := messages.ReplicateEdge{Source: topo.Primary, Target: m.Cluster}
	if len(out.Edges) > 0 {
		e.Start = slices.Clone(out.Edges[0].Start)
	}
	out.Edges = append(out.Edges, e)
	return out
}

// lostChannel is what the old primary holds of one PChannel past the
// last message of it the new primary replicated: writes the failover
// lost.
type lostChannel struct {
	PChannel string `json:"pchannel"`
	// After is the last message of the old primary the new one holds (0:
	// none); Messages counts the old primary's messages past it (a
	// transaction counts once), First and Last their TimeTicks.
	After    messages.MessageID `json:"after"`
	Messages int                `json:"messages"`
	First    messages.TimeTick  `json:"first,omitempty"`
	Last     messages.TimeTick  `json:"last,omitempty"`
}

// lost reads, per PChannel, the messages old holds past the last one of
// it primary replicated, and prints them.
func (ch *change) lost(ctx context.Context, primary, old *reached) ([]lostChannel, error) {
	st, err := primary.c.ReplicationStatus(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the replication of %s: %w", primary.member.Cluster, err)
	}
	out := make([]lostChannel, len(old.member.PChannels))
	for i, name := range old.member.PChannels {
		out[i].PChannel = name
		if i < len(st.Channels) && st.Channels[i].Source == old.member.Cluster {
			out[i].After = st.Channels[i].MessageID
		}
		if err := countPast(ctx, old.c, name, &out[i]); err != nil {
			return nil, fmt.Errorf("read %s of %s: %w", name, old.member.Cluster, err)
		}
	}
	if !ch.asJSON {
		printLost(ch.out, old.member.Cluster, primary.member.Cluster, out)
	}
	return out, nil
}

// countPast counts the messages of PChannel name that c's cluster wrote
// itself past l.After (none of its own internal ones).
func countPast(ctx context.Context, c *client.Client, name string, l *lostChannel) error {
	p, err := streamwal.ParsePChannel(name)
	if err != nil {
		return err
	}
	start := client.Earliest()
	if l.After > 0 {
		start = client.After(l.After)
	}
	sc, err := c.Read(ctx, client.ReadOptions{PChannel: p, Start: start, UntilNow: true})
	if err != nil {
		return err
	}
	defer func() { _ = sc.Close() }()
	for {
		m, err := sc.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if m.Type().Is(messages.FlagSelfControlled) || m.Unreplicable() || m.Replicate() != nil {
			continue
		}
		l.Messages++
		if l.First == 0 {
			l.First = m.TimeTick()
		}
		l.Last = m.TimeTick()
	}
}

// printLost renders what old holds that primary does not.
func printLost(w io.Writer, old, primary streamwal.Cluster, lost []lostChannel) {
	fmt.Fprintf(w, "%s holds past what %s replicated of it (writes the failover lost; they stay in %s's log, not replicated):\n", old, primary, old)
	t := table.NewWriter()
	t.SetOutputMirror(w)
	t.AppendHeader(table.Row{"PChannel", "After", "Messages", "First", "Last"})
	for _, l := range lost {
		first, last := "-", "-"
		if l.Messages > 0 {
			first, last = l.First.Physical().Format(time.RFC3339Nano), l.Last.Physical().Format(time.RFC3339Nano)
		}
		t.AppendRow(table.Row{l.PChannel, l.After, l.Messages, first, last})
	}
	t.Render()
}

// supersededBy is what `replicate status` reports of a primary whose
// topology another member has replaced: that member, its version and
// its primary.
type supersededBy struct {
	Cluster streamwal.Cluster `json:"cluster"`
	Version uint64            `json:"version"`
	Primary streamwal.Cluster `json:"primary"`
}

// supersededProbe bounds how long status waits for each other member.
const supersededProbe = 2 * time.Second

// findSuperseding asks the other members of st's topology, with the
// connection flags' credentials, for theirs: the first that holds a
// newer one whose primary is not self supersedes it (nil: none reached
// does).
func (f *connFlags) findSuperseding(ctx context.Context, self streamwal.Cluster, st client.ReplicationStatus) *supersededBy {
	if !st.Configured || st.Role != messages.RolePrimary {
		return nil
	}
	opts, err := f.natsOptions(f.flags)
	if err != nil {
		return nil
	}
	for _, m := range st.Topology.Members {
		if m.Cluster == self {
			continue
		}
		c, err := client.Connect(m.URL, client.WithCluster(m.Cluster), client.WithoutLocalBypass(), client.WithNATSOptions(opts...))
		if err != nil {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, supersededProbe)
		topo, ok, err := c.ReplicationTopology(pctx)
		cancel()
		_ = c.Close()
		if err == nil && ok && st.Topology.OlderThan(topo) && topo.Primary != self {
			return &supersededBy{Cluster: m.Cluster, Version: topo.Version, Primary: topo.Primary}
		}
	}
	return nil
}

// printSuperseded tells that self, a primary, was superseded.
func printSuperseded(w io.Writer, self streamwal.Cluster, s *supersededBy) {
	fmt.Fprintf(w, "superseded:  %s holds topology version %d, primary %s: this cluster still takes writes as the primary of an older one\n",
		s.Cluster, s.Version, s.Primary)
	fmt.Fprintf(w, "             (after a failover: run `streamwal replicate rejoin %s=URL --server <%s's URL> --cluster %s`)\n",
		self, s.Cluster, s.Cluster)
}
