package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal/client"
)

// runDurableTail prints the messages of the durable subscription name on
// o's VChannel, acknowledging each once printed, so that the next call
// (across restarts of the client and of the servers) resumes after the
// last one printed; until limit or ctx's end.
func runDurableTail(ctx context.Context, w io.Writer, c *client.Client, name string, o client.ReadOptions, limit int, asJSON bool) error {
	if o.VChannel.IsZero() {
		return fmt.Errorf("--durable follows one --vchannel (a durable subscription of a whole PChannel is not supported)")
	}
	if err := c.CheckPChannel(ctx, o.VChannel.PChannel()); err != nil {
		return err
	}
	sub, err := c.Subscribe(ctx, name, client.SubscribeVChannel(o.VChannel), client.SubscribeStart(o.Start))
	if err != nil {
		return fmt.Errorf("--durable %s: %w", name, err)
	}
	defer sub.Close()
	for n := 0; limit == 0 || n < limit; n++ {
		d, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := printMessage(w, d.Message, asJSON); err != nil {
			return err
		}
		if err := d.Ack(ctx); err != nil {
			return fmt.Errorf("--durable %s: acknowledge %d: %w", name, d.Message.ID(), err)
		}
	}
	return nil
}

// newSubscriptionsCmd is `streamwal subscriptions`.
func newSubscriptionsCmd() *cobra.Command {
	f := &connFlags{}
	cmd := &cobra.Command{
		Use:   "subscriptions",
		Short: "List the durable subscriptions and groups with their positions and lag",
		Long: "List the durable subscriptions and groups of the cluster (client.Subscribe, `tail --durable`):\n" +
			"per VChannel the last acknowledged message (ID and TimeTick), where a resume reads from, how\n" +
			"far behind the PChannel's last message it is, the group member that holds it, and whether it\n" +
			"is idle past its expiry (it then no longer holds the log from truncation).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				subs, err := c.Subscriptions(ctx)
				if err != nil {
					return err
				}
				return printSubscriptions(cmd.OutOrStdout(), subs, f.json)
			})
		},
	}
	f.add(cmd)
	cmd.AddCommand(newSubscriptionDeleteCmd())
	return cmd
}

// newSubscriptionDeleteCmd is `streamwal subscriptions delete NAME`.
func newSubscriptionDeleteCmd() *cobra.Command {
	f := &connFlags{}
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a durable subscription or group: its positions stop holding the log",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.DeleteSubscription(ctx, args[0]); err != nil {
					return err
				}
				if f.json {
					return printJSON(cmd.OutOrStdout(), map[string]any{"deleted": args[0]})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "deleted subscription %s\n", args[0])
				return nil
			})
		},
	}
	f.add(cmd)
	return cmd
}

// printSubscriptions prints subs as a table (or JSON lines).
func printSubscriptions(w io.Writer, subs []client.SubscriptionInfo, asJSON bool) error {
	if asJSON {
		for _, s := range subs {
			if err := printJSON(w, s); err != nil {
				return err
			}
		}
		return nil
	}
	if len(subs) == 0 {
		fmt.Fprintln(w, "no durable subscriptions")
		return nil
	}
	tw := table.NewWriter()
	tw.SetOutputMirror(w)
	tw.AppendHeader(table.Row{"subscription", "target", "vchannel", "acked id", "acked at", "from", "lag", "holder", "state"})
	for _, s := range subs {
		target := "vchannel"
		if s.Collection != 0 {
			target = fmt.Sprintf("collection %d", s.Collection)
		}
		if s.Group {
			target = "group, " + target
		}
		if len(s.Positions) == 0 {
			tw.AppendRow(table.Row{s.Name, target, "-", "-", "-", "-", "-", "-", "new"})
		}
		for _, p := range s.Positions {
			state := "holds the log"
			if p.Expired {
				state = "expired"
			}
			acked := "-"
			if p.ID > 0 {
				acked = p.TimeTick.String()
			}
			tw.AppendRow(table.Row{s.Name, target, p.VChannel, p.ID, acked, p.From, p.Lag.Round(time.Millisecond), p.Holder, state})
		}
	}
	tw.Render()
	return nil
}
