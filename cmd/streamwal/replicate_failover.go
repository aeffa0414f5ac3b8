package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// newReplicateFailoverCmd is `streamwal replicate failover`.
func newReplicateFailoverCmd() *cobra.Command {
	f := &connFlags{}
	var to string
	var force bool
	cmd := &cobra.Command{
		Use:   "failover --to NAME",
		Short: "Promote a secondary when the primary is unreachable",
		Long: "Unplanned change of primary: the primary is gone. The topology is read from the\n" +
			"cluster --server and --cluster name (a secondary, NAME say). The primary is\n" +
			"asked first: if it answers, failover refuses (use switchover; --force promotes\n" +
			"anyway). NAME becomes the primary of a topology without the old primary, and\n" +
			"every other secondary that can be reached its secondary. Printed per PChannel:\n" +
			"what NAME holds of the old primary's log, the last message replicated and the\n" +
			"TimeTick through which it holds everything, with its time (as its replicator\n" +
			"last recorded it, every second): what the old primary took after that may be\n" +
			"missing. The old primary, when it comes back, still takes writes as a primary\n" +
			"(its status says it was superseded): make it a secondary of NAME with replicate\n" +
			"rejoin, which reports the writes it took that NAME never got, before its writers\n" +
			"return.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			target, err := streamwal.ParseCluster(to)
			if err != nil {
				return fmt.Errorf("--to: %w", err)
			}
			return f.withoutClient(cmd, func(ctx context.Context, connect memberConnect) error {
				return newChange(cmd, f, connect).failover(ctx, f, target, force)
			})
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&to, "to", "", "the secondary that becomes the primary")
	cmd.Flags().BoolVar(&force, "force", false, "promote even if the primary answers")
	return cmd
}

// probeTimeout bounds failover's question to the primary.
const probeTimeout = 2 * time.Second

// failover promotes the secondary to in place of an unreachable primary.
func (ch *change) failover(ctx context.Context, f *connFlags, to streamwal.Cluster, force bool) error {
	topo, err := ch.entry(ctx, f)
	if err != nil {
		return err
	}
	if _, ok := topo.Source(to); !ok {
		return fmt.Errorf("cluster %s is not a secondary of the topology (primary %s)", to, topo.Primary)
	}
	old, _ := topo.Member(topo.Primary)
	if !force && ch.answers(ctx, old) {
		return fmt.Errorf("the primary %s answers at %s: use replicate switchover (or --force)", old.Cluster, old.URL)
	}
	rest := topo.Without(old.Cluster)
	rs, err := ch.reachAll(ctx, rest.Members, false)
	if err != nil {
		return err
	}
	target := find(rs, to)
	if target == nil {
		return fmt.Errorf("cluster %s cannot be reached", to)
	}
	held, err := ch.held(ctx, target, old.Cluster)
	if err != nil {
		return err
	}
	next := rest.Promote(to)
	next.Version = nextVersion(topo, rs)
	next, others, err := ch.promote(ctx, target, rs, next)
	if err != nil {
		return err
	}
	return errors.Join(ch.report(changed{Held: held}, next), others)
}

// answers reports whether member m's coordinator answers within
// probeTimeout.
func (ch *change) answers(ctx context.Context, m messages.ReplicateMember) bool {
	c, err := ch.connect(m.Cluster, m.URL)
	if err != nil {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return c.Ping(pctx) == nil
}

// heldChannel is what a secondary holds of a PChannel of its source.
type heldChannel struct {
	PChannel       string            `json:"pchannel"`
	Source         streamwal.Cluster `json:"source"`
	SourcePChannel string            `json:"source_pchannel"`
	// MessageID and TimeTick: the last message of the source replicated
	// (or skipped) with everything before it; Time is TimeTick's.
	MessageID messages.MessageID `json:"message_id"`
	TimeTick  messages.TimeTick  `json:"timetick"`
	Time      time.Time          `json:"time"`
	// Through: everything of the source up to this TimeTick is held.
	Through     messages.TimeTick `json:"through"`
	ThroughTime time.Time         `json:"through_time"`
}

// held reads what r holds of source's log, per PChannel, and prints it.
func (ch *change) held(ctx context.Context, r *reached, source streamwal.Cluster) ([]heldChannel, error) {
	st, err := r.c.ReplicationStatus(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the replication of %s: %w", r.member.Cluster, err)
	}
	var out []heldChannel
	for _, c := range st.Channels {
		h := heldChannel{PChannel: c.PChannel, Source: c.Source, SourcePChannel: c.SourcePChannel,
			MessageID: c.MessageID, TimeTick: c.TimeTick, Through: c.Through}
		if c.Source != source {
			h.Source, h.SourcePChannel, h.MessageID, h.TimeTick, h.Through = source, "", 0, 0, 0
		}
		if h.TimeTick != 0 {
			h.Time, h.ThroughTime = h.TimeTick.Physical(), h.Through.Physical()
		}
		out = append(out, h)
	}
	if !ch.asJSON {
		printHeld(ch.out, r.member.Cluster, source, out)
	}
	return out, nil
}

// printHeld renders what cluster c holds of source's log.
func printHeld(w io.Writer, c, source streamwal.Cluster, held []heldChannel) {
	fmt.Fprintf(w, "%s holds of %s's log (what %s took after Through may be missing):\n", c, source, source)
	t := table.NewWriter()
	t.SetOutputMirror(w)
	t.AppendHeader(table.Row{"PChannel", "Source", "Last message", "Last TimeTick", "Time", "Through", "Through time"})
	for _, h := range held {
		if h.TimeTick == 0 {
			t.AppendRow(table.Row{h.PChannel, string(source), "nothing", "-", "-", "-", "-"})
			continue
		}
		t.AppendRow(table.Row{h.PChannel, string(h.Source) + "/" + h.SourcePChannel, h.MessageID, h.TimeTick,
			h.Time.Format(time.RFC3339Nano), h.Through, h.ThroughTime.Format(time.RFC3339Nano)})
	}
	t.Render()
}

// newReplicateRemoveCmd is `streamwal replicate remove`.
func newReplicateRemoveCmd() *cobra.Command {
	f := &connFlags{}
	cmd := &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a secondary from the topology",
		Long: "Remove the secondary NAME. The topology is read from the cluster --server and\n" +
			"--cluster name (any member). Every other member that can be reached is given\n" +
			"the topology without NAME; NAME is given a topology of its own, where it is the\n" +
			"only member and so its own primary: its replicators stop, it keeps its copy and\n" +
			"takes writes as a standalone cluster. The primary cannot be removed (switch\n" +
			"over first). Members that cannot be reached are listed and left as they are.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := streamwal.ParseCluster(args[0])
			if err != nil {
				return err
			}
			return f.withoutClient(cmd, func(ctx context.Context, connect memberConnect) error {
				return newChange(cmd, f, connect).remove(ctx, f, name)
			})
		},
	}
	f.add(cmd)
	return cmd
}

// remove takes the secondary name out of the topology.
func (ch *change) remove(ctx context.Context, f *connFlags, name streamwal.Cluster) error {
	topo, err := ch.entry(ctx, f)
	if err != nil {
		return err
	}
	m, ok := topo.Member(name)
	switch {
	case !ok:
		return fmt.Errorf("cluster %s is not a member of the topology", name)
	case name == topo.Primary:
		return fmt.Errorf("cluster %s is the primary: switch over to another member before removing it", name)
	}
	rs, err := ch.reachAll(ctx, topo.Members, false)
	if err != nil {
		return err
	}
	next := topo.Without(name)
	next.Version = nextVersion(topo, rs)
	var errs []error
	for _, r := range rs {
		if r.member.Cluster == name {
			continue
		}
		if _, err := ch.tell(ctx, r, next); err != nil {
			errs = append(errs, err)
		}
	}
	alone := messages.Topology{Version: next.Version, Members: []messages.ReplicateMember{m}, Primary: name}
	if r := find(rs, name); r == nil {
		errs = append(errs, fmt.Errorf("cluster %s was not reached: it still replicates from %s", name, topo.Primary))
	} else if _, err := ch.tell(ctx, r, alone); err != nil {
		errs = append(errs, err)
	} else {
		ch.say("%s: removed, a standalone primary (version %d)", name, next.Version)
	}
	return errors.Join(ch.report(changed{}, next), errors.Join(errs...))
}
