package main

import (
	"context"
	"fmt"
	"io"
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
		newReplicateFailoverCmd(), newReplicateRemoveCmd())
	return cmd
}

// newReplicateConfigureCmd is `streamwal replicate configure`.
func newReplicateConfigureCmd() *cobra.Command {
	f := &connFlags{}
	var primary string
	var secondaries []string
	cmd := &cobra.Command{
		Use:   "configure --primary NAME=URL --secondary NAME=URL...",
		Short: "Set the replication topology on every member cluster",
		Long: "Set the replication topology: the primary and its secondaries, each a cluster\n" +
			"NAME reached at URL (its NATS servers; the secondaries' nodes read the primary\n" +
			"there). Every member is asked for its PChannels (the counts must match: PChannel\n" +
			"i replicates into PChannel i) and then configured, the primary first, each by an\n" +
			"AlterReplicateConfig broadcast of its own; the connection flags apply to every\n" +
			"member, --server and --cluster are not used. A new secondary copies the\n" +
			"primary's log from its first message.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			members, err := parseMembers(primary, secondaries)
			if err != nil {
				return err
			}
			return f.withoutClient(cmd, func(ctx context.Context, connect memberConnect) error {
				return configure(ctx, cmd.OutOrStdout(), connect, members, f.json)
			})
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&primary, "primary", "", "the primary cluster, NAME=URL")
	cmd.Flags().StringArrayVar(&secondaries, "secondary", nil, "a secondary cluster, NAME=URL (repeat for each)")
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
}

// configure asks every member for its PChannels and its topology, then
// configures each with a topology of a version above all of theirs.
func configure(ctx context.Context, w io.Writer, connect memberConnect, eps []memberAt, asJSON bool) error {
	clients := make([]*client.Client, len(eps))
	members := make([]messages.ReplicateMember, len(eps))
	var version uint64
	for i, ep := range eps {
		c, err := connect(ep.cluster, ep.url)
		if err != nil {
			return err
		}
		if members[i], err = c.ReplicateMember(ctx, ep.url); err != nil {
			return fmt.Errorf("cluster %s at %s: %w", ep.cluster, ep.url, err)
		}
		cur, _, err := c.ReplicationTopology(ctx)
		if err != nil {
			return fmt.Errorf("cluster %s at %s: %w", ep.cluster, ep.url, err)
		}
		clients[i], version = c, max(version, cur.Version)
	}
	topo := messages.Star(members[0], members[1:]...)
	topo.Version = version + 1
	if err := topo.Validate(); err != nil {
		return err
	}
	for i, c := range clients {
		res, err := c.ConfigureReplication(ctx, topo)
		if err != nil {
			return fmt.Errorf("configure cluster %s: %w (the members before it are configured)", eps[i].cluster, err)
		}
		r := configured{Cluster: eps[i].cluster, Role: topo.Role(eps[i].cluster), PChannels: len(members[i].PChannels), Broadcast: res.ID, Version: topo.Version}
		if asJSON {
			if err := printJSON(w, r); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(w, "%s: %s, %d pchannels (broadcast %d)\n", r.Cluster, r.Role, r.PChannels, r.Broadcast)
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
			"not running) and the error that holds it up, if any.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				st, err := c.ReplicationStatus(ctx)
				if err != nil {
					return err
				}
				if f.json {
					return printJSON(cmd.OutOrStdout(), st)
				}
				return printReplication(cmd.OutOrStdout(), st)
			})
		},
	}
	f.add(cmd)
	return cmd
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
	t := table.NewWriter()
	t.SetOutputMirror(w)
	t.AppendHeader(table.Row{"PChannel", "Source", "Checkpoint", "Checkpoint TimeTick", "Lag", "Replicated", "Error"})
	for _, ch := range st.Channels {
		src, cp, tt, lag := "-", "-", "-", "-"
		if ch.Source != "" {
			src = string(ch.Source) + "/" + ch.SourcePChannel
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
