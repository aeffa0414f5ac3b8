package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// newReplicateCmd groups the replication commands (DESIGN.md §11).
func newReplicateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "replicate",
		Short: "Configure and watch replication between streamwal clusters",
		Long: "A star of clusters, each on its own NATS deployment: one primary takes the\n" +
			"writes, each secondary replicates its log PChannel by PChannel and refuses\n" +
			"direct writes (NOT_PRIMARY, naming the primary). configure sets the star;\n" +
			"switchover (planned) and failover (the primary gone) change the primary, remove\n" +
			"takes a secondary out; each change carries a version above the members', and a\n" +
			"cluster never goes back to an older topology.",
	}
	cmd.AddCommand(newReplicateConfigureCmd(), newReplicateStatusCmd(), newReplicateSwitchoverCmd(),
		newReplicateFailoverCmd(), newReplicateRemoveCmd(), newReplicateRejoinCmd())
	return cmd
}

// newReplicateConfigureCmd is `streamwal replicate configure`.
func newReplicateConfigureCmd() *cobra.Command {
	f := &connFlags{}
	var primary string
	var secondaries []string
	var copyHistory bool
	cmd := &cobra.Command{
		Use:   "configure --primary NAME=URL --secondary NAME=URL...",
		Short: "Set the replication topology on every member cluster",
		Long: "Set the replication topology: the primary and its secondaries, each a cluster\n" +
			"NAME reached at URL (its NATS servers; the secondaries' nodes read the primary\n" +
			"there). Every member is asked for its PChannels (the counts must match: PChannel\n" +
			"i replicates into PChannel i) and then configured, the primary first, each by an\n" +
			"AlterReplicateConfig broadcast of its own; the connection flags apply to every\n" +
			"member, --server and --cluster are not used. A secondary new to the primary\n" +
			"starts at the configuration (the primary's AlterReplicateConfig): it must hold\n" +
			"the primary's collections already, and is refused when it has fewer VChannels\n" +
			"than the primary; with --copy-history it copies the primary's whole readable\n" +
			"log instead. A secondary that already follows the primary goes on where it is.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			members, err := parseMembers(primary, secondaries)
			if err != nil {
				return err
			}
			return f.withoutClient(cmd, func(ctx context.Context, connect memberConnect) error {
				return configure(ctx, cmd.OutOrStdout(), connect, members, configureOptions{asJSON: f.json, copyHistory: copyHistory})
			})
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&primary, "primary", "", "the primary cluster, NAME=URL")
	cmd.Flags().StringArrayVar(&secondaries, "secondary", nil, "a secondary cluster, NAME=URL (repeat for each)")
	cmd.Flags().BoolVar(&copyHistory, "copy-history", false,
		"a new secondary copies the primary's whole readable log, rather than starting at this configuration")
	return cmd
}

// memberAt is a cluster named on the command line and where it is.
type memberAt struct {
	cluster streamwal.Cluster
	url     string
}

// parseMembers parses --primary and --secondary; the primary comes first.
func parseMembers(primary string, secondaries []string) ([]memberAt, error) {
	if primary == "" {
		return nil, fmt.Errorf("--primary NAME=URL is required")
	}
	var out []memberAt
	for _, s := range append([]string{primary}, secondaries...) {
		name, url, ok := strings.Cut(s, "=")
		if !ok || url == "" {
			return nil, fmt.Errorf("%q: want NAME=URL", s)
		}
		c, err := streamwal.ParseCluster(name)
		if err != nil {
			return nil, err
		}
		if err := checkServers(url); err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		out = append(out, memberAt{cluster: c, url: url})
	}
	return out, nil
}

// memberConnect opens a client of cluster c at url.
type memberConnect func(c streamwal.Cluster, url string) (*client.Client, error)

// withoutClient runs fn with a way to reach any cluster with the
// connection flags' credentials, within --timeout.
func (f *connFlags) withoutClient(cmd *cobra.Command, fn func(ctx context.Context, connect memberConnect) error) error {
	f.flags = cmd.Flags()
	if err := applyEnv(f.flags, connEnv); err != nil {
		return err
	}
	if f.timeout <= 0 {
		return fmt.Errorf("--timeout must be positive")
	}
	opts, err := f.natsOptions(f.flags)
	if err != nil {
		return err
	}
	var opened []*client.Client
	defer func() {
		for _, c := range opened {
			_ = c.Close()
		}
	}()
	connect := func(c streamwal.Cluster, url string) (*client.Client, error) {
		cl, err := client.Connect(url, client.WithCluster(c), client.WithoutLocalBypass(), client.WithNATSOptions(opts...))
		if err != nil {
			return nil, fmt.Errorf("cluster %s at %s: %w (%s)%s", c, url, err, f.authDesc(), authHint(err))
		}
		opened = append(opened, cl)
		return cl, nil
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	return fn(ctx, connect)
}

// configured is what configure reports of one member.
type configured struct {
	Cluster   streamwal.Cluster      `json:"cluster"`
	Role      messages.ReplicateRole `json:"role"`
	PChannels int                    `json:"pchannels"`
	Broadcast uint64                 `json:"broadcast,omitempty"`
	Version   uint64                 `json:"version"`
	// Start says where a secondary starts in the primary's log:
	// "configuration", "history" (its first readable message) or
	// "where it is" (it followed the primary already).
	Start string `json:"start,omitempty"`
}

// configureOptions are configure's choices.
type configureOptions struct {
	asJSON bool
	// copyHistory: a new secondary copies the primary's whole readable
	// log instead of starting at the configuration.
	copyHistory bool
}

// Where a secondary starts (configured.Start).
const (
	startConfiguration = "configuration"
	startHistory       = "history"
	startWhereItIs     = "where it is"
)

// configure asks every member for its PChannels and its topology, then
// configures each with a topology of a version above all of theirs: the
// primary first, whose configuration is where each new secondary starts
// (unless it copies the history), then the secondaries, then the primary
// again, with the starts.
func configure(ctx context.Context, w io.Writer, connect memberConnect, eps []memberAt, o configureOptions) error {
	rs := make([]*reached, len(eps))
	var version uint64
	for i, ep := range eps {
		c, err := connect(ep.cluster, ep.url)
		if err != nil {
			return err
		}
		m, err := c.ReplicateMember(ctx, ep.url)
		if err != nil {
			return fmt.Errorf("cluster %s at %s: %w", ep.cluster, ep.url, err)
		}
		rs[i] = &reached{member: m, c: c}
		if rs[i].topo, rs[i].ok, err = c.ReplicationTopology(ctx); err != nil {
			return fmt.Errorf("cluster %s at %s: %w", ep.cluster, ep.url, err)
		}
		version = max(version, rs[i].topo.Version)
	}
	members := make([]messages.ReplicateMember, len(rs))
	for i, r := range rs {
		members[i] = r.member
	}
	topo := messages.Star(members[0], members[1:]...)
	topo.Version = version + 1
	if err := topo.Validate(); err != nil {
		return err
	}
	starts, err := secondaryStarts(ctx, rs, o.copyHistory)
	if err != nil {
		return err
	}
	return configureMembers(ctx, w, rs, topo, starts, o.asJSON)
}

// secondaryStarts says where each secondary of rs (rs[0] is the
// primary) starts, by cluster. A secondary that follows the primary
// already goes on where it is; a new one copies the history when asked,
// or starts at the configuration, which is refused when it has fewer
// VChannels than the primary: it lacks collections whose messages it
// could not take.
func secondaryStarts(ctx context.Context, rs []*reached, copyHistory bool) (map[streamwal.Cluster]string, error) {
	primary := rs[0]
	out := map[streamwal.Cluster]string{}
	have := -1 // the primary's count, once read
	for _, r := range rs[1:] {
		if src, ok := r.topo.Source(r.member.Cluster); r.ok && ok && src.Cluster == primary.member.Cluster {
			out[r.member.Cluster] = startWhereItIs
			continue
		}
		if copyHistory {
			out[r.member.Cluster] = startHistory
			continue
		}
		if have < 0 {
			n, err := vchannelCount(ctx, primary)
			if err != nil {
				return nil, err
			}
			have = n
		}
		n, err := vchannelCount(ctx, r)
		if err != nil {
			return nil, err
		}
		if n < have {
			return nil, fmt.Errorf("cluster %s has %d vchannels, the primary %s %d: starting at this configuration it would lack collections of %s "+
				"whose messages it cannot take; pass --copy-history to copy %s's whole readable log", r.member.Cluster, n, primary.member.Cluster, have,
				primary.member.Cluster, primary.member.Cluster)
		}
		out[r.member.Cluster] = startConfiguration
	}
	return out, nil
}

// vchannelCount is how many VChannels r's coordinator placed.
func vchannelCount(ctx context.Context, r *reached) (int, error) {
	v, err := r.c.View(ctx)
	if err != nil {
		return 0, fmt.Errorf("the view of cluster %s: %w", r.member.Cluster, err)
	}
	n := 0
	for _, a := range v.Channels {
		n += a.VChannels
	}
	return n, nil
}

// configureMembers configures the primary rs[0], then each secondary
// with the edge into it starting as starts says (at the primary's
// configuration, at its first message, or kept from its topology), then
// the primary again so that every member records the same topology.
func configureMembers(ctx context.Context, w io.Writer, rs []*reached, topo messages.Topology, starts map[streamwal.Cluster]string, asJSON bool) error {
	res, err := rs[0].c.ConfigureReplication(ctx, topo)
	if err != nil {
		return fmt.Errorf("configure cluster %s: %w", rs[0].member.Cluster, err)
	}
	at, err := landedAt(rs[0].member, res)
	if err != nil {
		return err
	}
	report := []configured{{Cluster: rs[0].member.Cluster, Role: messages.RolePrimary, PChannels: len(rs[0].member.PChannels), Broadcast: res.ID, Version: topo.Version}}
	for i := range topo.Edges {
		e := &topo.Edges[i]
		switch starts[e.Target] {
		case startConfiguration:
			e.Start = startsOf(at)
		case startWhereItIs:
			r := find(rs, e.Target)
			old, _ := r.topo.Edge(e.Target)
			e.Start = slices.Clone(old.Start)
		}
	}
	for _, r := range rs[1:] {
		res, err := r.c.ConfigureReplication(ctx, topo)
		if err != nil {
			return fmt.Errorf("configure cluster %s: %w (the members before it are configured)", r.member.Cluster, err)
		}
		report = append(report, configured{Cluster: r.member.Cluster, Role: messages.RoleSecondary, PChannels: len(r.member.PChannels),
			Broadcast: res.ID, Version: topo.Version, Start: starts[r.member.Cluster]})
	}
	if len(rs) > 1 {
		if _, err := rs[0].c.ConfigureReplication(ctx, topo); err != nil {
			return fmt.Errorf("configure cluster %s again with the secondaries' starts: %w", rs[0].member.Cluster, err)
		}
	}
	return printConfigured(w, report, asJSON)
}

// printConfigured prints what configure set: JSON, or a line per member.
func printConfigured(w io.Writer, report []configured, asJSON bool) error {
	for _, r := range report {
		if asJSON {
			if err := printJSON(w, r); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(w, "%s: %s, %d pchannels (broadcast %d)", r.Cluster, r.Role, r.PChannels, r.Broadcast)
		switch r.Start {
		case startConfiguration:
			fmt.Fprint(w, ", starts at this configuration")
		case startHistory:
			fmt.Fprint(w, ", copies the primary's whole readable log")
		case startWhereItIs:
			fmt.Fprint(w, ", goes on where it is")
		}
		fmt.Fprintln(w)
	}
	return nil
}

// newReplicateStatusCmd is `streamwal replicate status`.
func newReplicateStatusCmd() *cobra.Command {
	f := &connFlags{}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's replication: role, and per PChannel source, checkpoint and lag",
		Long: "Show the cluster's replication topology and role and, on a secondary, each\n" +
			"PChannel's replicator: the source PChannel, the checkpoint (last message of the\n" +
			"source replicated), the lag (time since the source TimeTick through which the\n" +
			"secondary holds everything: it grows while replication is stuck, disconnected or\n" +
			"not running) and the error that holds it up, if any. A primary asks the other\n" +
			"members of its topology for theirs and says it was superseded when one holds a\n" +
			"newer topology with another primary (a failover while it was away: see rejoin).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				st, err := c.ReplicationStatus(ctx)
				if err != nil {
					return err
				}
				sup := f.findSuperseding(ctx, c.Cluster(), st)
				if f.json {
					return printJSON(cmd.OutOrStdout(), replicationReport{ReplicationStatus: st, Superseded: sup})
				}
				if sup != nil {
					printSuperseded(cmd.OutOrStdout(), c.Cluster(), sup)
				}
				return printReplication(cmd.OutOrStdout(), st)
			})
		},
	}
	f.add(cmd)
	return cmd
}

// replicationReport is what `replicate status --json` prints.
type replicationReport struct {
	client.ReplicationStatus
	// Superseded names the member holding a newer topology with another
	// primary, when this cluster is a primary that a failover replaced.
	Superseded *supersededBy `json:"superseded,omitempty"`
}

// printReplication renders the replication status as text.
func printReplication(w io.Writer, st client.ReplicationStatus) error {
	if !st.Configured {
		fmt.Fprintln(w, "replication: not configured (the cluster takes writes as a primary)")
		return nil
	}
	fmt.Fprintf(w, "role:        %s\n", st.Role)
	fmt.Fprintf(w, "primary:     %s\n", st.Topology.Primary)
	if st.Topology.Handover != "" {
		fmt.Fprintf(w, "handover:    to %s (switchover: the primary takes no direct write)\n", st.Topology.Handover)
	}
	fmt.Fprintf(w, "version:     %d\n", st.Topology.Version)
	for _, m := range st.Topology.Members {
		fmt.Fprintf(w, "member:      %s %s (%s, %d pchannels)\n", m.Cluster, m.URL, st.Topology.Role(m.Cluster), len(m.PChannels))
	}
	if len(st.Channels) == 0 {
		return nil
	}
	for _, ch := range st.Channels {
		if ch.Old {
			fmt.Fprintln(w, "(old): the record of a source the cluster no longer replicates from (before a change of topology): what it held of it")
			break
		}
	}
	t := table.NewWriter()
	t.SetOutputMirror(w)
	t.AppendHeader(table.Row{"PChannel", "Source", "Checkpoint", "Checkpoint TimeTick", "Lag", "Replicated", "Error"})
	for _, ch := range st.Channels {
		src, cp, tt, lag := "-", "-", "-", "-"
		if ch.Source != "" {
			src = string(ch.Source) + "/" + ch.SourcePChannel
		}
		if ch.Old {
			src += " (old)"
		}
		if ch.MessageID != 0 {
			cp, tt = fmt.Sprint(ch.MessageID), ch.TimeTick.String()
		}
		if ch.LagKnown {
			lag = ch.Lag.Round(time.Millisecond).String()
		}
		t.AppendRow(table.Row{ch.PChannel, src, cp, tt, lag, ch.Replicated, ch.Error})
	}
	t.Render()
	return nil
}
