package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// newReplicateSwitchoverCmd is `streamwal replicate switchover`.
func newReplicateSwitchoverCmd() *cobra.Command {
	f := &connFlags{}
	var to string
	var catchUp time.Duration
	cmd := &cobra.Command{
		Use:   "switchover --to NAME",
		Short: "Make a secondary the primary, losing no acknowledged write (planned)",
		Long: "Planned change of primary, every member reachable. The topology is read from the\n" +
			"cluster --server and --cluster name (any member); the members are reached at the\n" +
			"URLs it lists. Three steps: the primary stops taking direct writes (they are\n" +
			"refused with NOT_PRIMARY naming NAME); every secondary catches up with the\n" +
			"primary's log up to the TimeTick where it stopped (progress is printed; within\n" +
			"--catch-up, or the primary takes writes again and nothing changed); then NAME\n" +
			"becomes the primary and every other member, the old primary included, its\n" +
			"secondary, replicating what NAME takes from then on.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			target, err := streamwal.ParseCluster(to)
			if err != nil {
				return fmt.Errorf("--to: %w", err)
			}
			if catchUp <= 0 {
				return fmt.Errorf("--catch-up must be positive")
			}
			return f.withoutClient(cmd, func(ctx context.Context, connect memberConnect) error {
				return newChange(cmd, f, connect).switchover(ctx, f, target, catchUp)
			})
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&to, "to", "", "the secondary that becomes the primary")
	cmd.Flags().DurationVar(&catchUp, "catch-up", 20*time.Second,
		"how long the primary refuses writes while the secondaries catch up, at most, before the switchover is abandoned")
	return cmd
}

// switchover hands the primary role over to the secondary to, waiting
// at most catchUp for the secondaries.
func (ch *change) switchover(ctx context.Context, f *connFlags, to streamwal.Cluster, catchUp time.Duration) error {
	rs, primary, err := ch.switchoverMembers(ctx, f, to)
	if err != nil {
		return err
	}
	v := nextVersion(primary.topo, rs)
	if err := ch.handOver(ctx, primary, rs, to, v, catchUp); err != nil {
		return err
	}
	next := primary.topo.Promote(to)
	next.Version = v + 1
	next, others, err := ch.promote(ctx, find(rs, to), rs, next)
	if err != nil {
		return fmt.Errorf("switchover to %s: %w (run it again)", to, err)
	}
	return errors.Join(ch.report(changed{}, next), others)
}

// switchoverMembers reaches every member of the topology, of which to
// must be a secondary, and returns them and the primary.
func (ch *change) switchoverMembers(ctx context.Context, f *connFlags, to streamwal.Cluster) ([]*reached, *reached, error) {
	topo, err := ch.entry(ctx, f)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := topo.Source(to); !ok {
		return nil, nil, fmt.Errorf("cluster %s is not a secondary of the topology (primary %s)", to, topo.Primary)
	}
	rs, err := ch.reachAll(ctx, topo.Members, true)
	if err != nil {
		return nil, nil, fmt.Errorf("a switchover reaches every member (see failover): %w", err)
	}
	primary := find(rs, topo.Primary)
	if !primary.ok || primary.topo.Primary != topo.Primary {
		return nil, nil, fmt.Errorf("cluster %s does not hold itself the primary: its topology is not the one cluster %s holds (configure them again)", topo.Primary, f.cluster)
	}
	return rs, primary, nil
}

// handOver makes the primary refuse direct writes, naming to, under
// version v, and waits at most catchUp for every secondary to hold its
// log through that point; when either fails, the primary takes writes
// again (version v+1) and the switchover is abandoned.
func (ch *change) handOver(ctx context.Context, primary *reached, rs []*reached, to streamwal.Cluster, v uint64, catchUp time.Duration) error {
	fence := primary.topo.Clone()
	fence.Version, fence.Handover = v, to
	res, err := ch.tell(ctx, primary, fence)
	if err != nil {
		return ch.undoFence(primary, v+1, err)
	}
	last, err := landedAt(primary.member, res)
	if err != nil {
		return ch.undoFence(primary, v+1, err)
	}
	ch.say("%s: takes no direct write, hands over to %s (version %d)", primary.member.Cluster, to, v)
	cctx, cancel := context.WithTimeout(ctx, catchUp)
	defer cancel()
	if err := ch.catchUp(cctx, primary, rs, last); err != nil {
		return ch.undoFence(primary, v+1, err)
	}
	return nil
}

// undoFence gives the primary its role back after a switchover that
// could not finish (cause), under version v.
func (ch *change) undoFence(primary *reached, v uint64, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	back := primary.topo.Clone()
	back.Version, back.Handover = v, ""
	if _, err := ch.tell(ctx, primary, back); err != nil {
		return fmt.Errorf("%w; and %s could not take writes again: %v (run the switchover again, or configure)", cause, primary.member.Cluster, err)
	}
	ch.say("%s: takes writes again (version %d)", primary.member.Cluster, v)
	return fmt.Errorf("switchover abandoned, nothing changed: %w", cause)
}

// catchUpPoll is how often catch-up reads the secondaries' checkpoints;
// progress is printed every second.
const catchUpPoll = 100 * time.Millisecond

// catchUp waits until every secondary of rs holds the primary's log
// through last (by PChannel index), printing progress every second.
func (ch *change) catchUp(ctx context.Context, primary *reached, rs []*reached, last []client.AppendResult) error {
	tick := time.NewTicker(catchUpPoll)
	defer tick.Stop()
	var said time.Time
	for {
		behind, err := ch.behind(ctx, primary, rs, last)
		if err != nil {
			return err
		}
		if len(behind) == 0 {
			ch.say("every secondary holds %s's log through its last write", primary.member.Cluster)
			return nil
		}
		if time.Since(said) >= time.Second {
			said = time.Now()
			for _, b := range behind {
				ch.say("waiting: %s", b)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("catching up with %s: %v: %w", primary.member.Cluster, behind, ctx.Err())
		case <-tick.C:
		}
	}
}

// behind describes each secondary of rs that does not yet hold the
// primary's log through last on every PChannel.
func (ch *change) behind(ctx context.Context, primary *reached, rs []*reached, last []client.AppendResult) ([]string, error) {
	var out []string
	for _, r := range rs {
		if r == primary {
			continue
		}
		st, err := r.c.ReplicationStatus(ctx)
		if err != nil {
			return nil, fmt.Errorf("read the replication of %s: %w", r.member.Cluster, err)
		}
		if n := caughtUp(st, primary.member.Cluster, r.member, last); n < len(last) {
			out = append(out, fmt.Sprintf("%s holds %d of %d pchannels through %s's last write", r.member.Cluster, n, len(last), primary.member.Cluster))
		}
	}
	return out, nil
}

// caughtUp counts the PChannels of m whose replicator holds source's log
// through last (by index), as st records them.
func caughtUp(st client.ReplicationStatus, source streamwal.Cluster, m messages.ReplicateMember, last []client.AppendResult) int {
	n := 0
	for _, c := range st.Channels {
		for i, name := range m.PChannels {
			if c.PChannel == name && i < len(last) && c.Source == source && c.Through >= last[i].TimeTick {
				n++
			}
		}
	}
	return n
}
