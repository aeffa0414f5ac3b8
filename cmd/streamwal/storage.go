package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// newCollectionFlushCmd is `streamwal collection flush`.
func newCollectionFlushCmd() *cobra.Command {
	f := &connFlags{}
	var id int64
	cmd := &cobra.Command{
		Use:   "flush",
		Short: "Seal the growing segments of a collection (a ManualFlush to each of its VChannels)",
		Long: "Append a ManualFlush of collection --id to every VChannel of the collection. Each\n" +
			"VChannel's owner seals the collection's growing segments there, and flushes them to\n" +
			"the object store once every insert in them landed (see `streamwal segments`).\n" +
			"A collection that was dropped or never created is refused.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if id <= 0 {
				return fmt.Errorf("a positive --id is required")
			}
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if err := pingCoordinator(ctx, c); err != nil {
					return err
				}
				return runFlush(ctx, cmd.OutOrStdout(), c, id, f.json)
			})
		},
	}
	f.add(cmd)
	cmd.Flags().Int64Var(&id, "id", 0, "collection ID (positive)")
	return cmd
}

// runFlush appends a ManualFlush to every VChannel of collection id.
func runFlush(ctx context.Context, w io.Writer, c *client.Client, id int64, asJSON bool) error {
	vs, err := c.CollectionVChannels(ctx, id)
	if err != nil {
		return err
	}
	msgs := make([]*messages.MutableMessage, len(vs))
	for i, v := range vs {
		if msgs[i], err = c.Codec().NewBody(messages.TypeManualFlush, v, messages.ManualFlushBody{CollectionID: id}); err != nil {
			return err
		}
	}
	res, err := c.Append(ctx, msgs...)
	if err != nil {
		return err
	}
	for i, r := range res {
		if asJSON {
			line := map[string]any{"flushed": id, "vchannel": vs[i].String(), "id": r.ID, "timetick": r.TimeTick, "time": r.TimeTick.String()}
			if err := printJSON(w, line); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(w, "flush of collection %d on %s appended at %d (%s)\n", id, vs[i], r.ID, r.TimeTick)
	}
	return nil
}

// newSegmentsCmd is `streamwal segments`.
func newSegmentsCmd() *cobra.Command {
	f := &connFlags{}
	var vchannel string
	cmd := &cobra.Command{
		Use:   "segments",
		Short: "List a VChannel's segments: growing, sealed and flushed",
		Long: "List the segments of --vchannel by ID. Growing and sealed segments are as the\n" +
			"owner of its PChannel last persisted them (its segment metadata, written every\n" +
			"persist round), so they may lag the live WAL by a round; flushed segments are\n" +
			"read from their manifests in the object store. ROWS is '-' for a flushed segment\n" +
			"the metadata no longer lists (its manifest counts messages, not rows). SOURCE\n" +
			"says where each line was read: metadata or object_store.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := streamwal.ParseVChannel(vchannel)
			if err != nil {
				return fmt.Errorf("--vchannel: %w", err)
			}
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if err := pingCoordinator(ctx, c); err != nil {
					return err
				}
				if err := c.CheckPChannel(ctx, v.PChannel()); err != nil {
					return err
				}
				segs, err := c.Segments(ctx, v)
				if err != nil {
					return err
				}
				if f.json {
					if segs == nil {
						segs = []client.SegmentInfo{}
					}
					return printJSON(cmd.OutOrStdout(), map[string]any{"vchannel": v.String(), "segments": segs})
				}
				return printSegments(cmd.OutOrStdout(), v, segs)
			})
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&vchannel, "vchannel", "", "VChannel whose segments to list (required)")
	return cmd
}

// printSegments renders segments as a table.
func printSegments(w io.Writer, v streamwal.VChannel, segs []client.SegmentInfo) error {
	if len(segs) == 0 {
		fmt.Fprintf(w, "%s has no segments\n", v)
		return nil
	}
	t := table.NewWriter()
	t.SetOutputMirror(w)
	t.AppendHeader(table.Row{"ID", "Partition", "State", "Rows", "Bytes", "MessageIDs", "TimeTicks", "Reason", "Source"})
	t.SetColumnConfigs([]table.ColumnConfig{{Name: "Rows", Align: text.AlignRight}})
	for _, s := range segs {
		rows := "-"
		if s.Rows != nil {
			rows = strconv.FormatUint(*s.Rows, 10)
		}
		t.AppendRow(table.Row{s.ID, s.Partition, s.State, rows, s.Bytes, idRange(s.FirstID, s.LastID),
			ttRange(s.FirstTimeTick, s.LastTimeTick), dash(s.Reason), s.Source})
	}
	t.Render()
	return nil
}

// idRange renders first-last ("-" while empty).
func idRange(first, last messages.MessageID) string {
	if first == 0 {
		return "-"
	}
	return fmt.Sprintf("%d-%d", first, last)
}

// ttRange renders first..last ("-" while empty).
func ttRange(first, last messages.TimeTick) string {
	if first == 0 {
		return "-"
	}
	return first.String() + ".." + last.String()
}

// dash is s, or "-" when empty.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// newPChannelCmd is `streamwal pchannel`.
func newPChannelCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "pchannel", Short: "Operate on one PChannel"}
	cmd.AddCommand(newAcceptLossCmd())
	return cmd
}

// acceptLossConsequence is what accept-loss tells the operator.
const acceptLossConsequence = "the owner will continue the PChannel above the highest MessageID ever handed out at its next open; messages lost stay lost"

// newAcceptLossCmd is `streamwal pchannel accept-loss`.
func newAcceptLossCmd() *cobra.Command {
	f := &connFlags{}
	var by string
	cmd := &cobra.Command{
		Use:   "accept-loss PCHANNEL",
		Short: "Consent to serve a PChannel whose stream lost acknowledged history (HISTORY_LOST)",
		Long: "A node refuses to open a PChannel whose stream holds less than its checkpoint says\n" +
			"was handed out, or another message at a known MessageID (HISTORY_LOST; `streamwal\n" +
			"status` shows it on the PChannel's error line). accept-loss records your consent in\n" +
			"the PChannel's recovery storage: " + acceptLossConsequence + ".\n" +
			"The consent is used, and removed, by the next open that meets the loss; until then\n" +
			"it stays. It returns at once: the coordinator retries the open by itself.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := streamwal.ParsePChannel(args[0])
			if err != nil {
				return fmt.Errorf("pchannel %q: %w", args[0], err)
			}
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if err := pingCoordinator(ctx, c); err != nil {
					return err
				}
				return runAcceptLoss(ctx, cmd.OutOrStdout(), c, p, by, f.json)
			})
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&by, "by", operator(), "who consents (recorded with the consent)")
	return cmd
}

// runAcceptLoss records the consent and says what follows.
func runAcceptLoss(ctx context.Context, w io.Writer, c *client.Client, p streamwal.PChannel, by string, asJSON bool) error {
	a, err := c.AcceptLoss(ctx, p, by)
	if err != nil {
		return err
	}
	openErr := ""
	if v, err := c.View(ctx); err == nil {
		for _, ch := range v.Channels {
			if ch.PChannel == p.String() {
				openErr = ch.Error
			}
		}
	}
	if asJSON {
		return printJSON(w, map[string]any{"pchannel": p.String(), "accepted": a, "open_error": openErr, "consequence": acceptLossConsequence})
	}
	fmt.Fprintf(w, "recorded the consent of %s to serve %s above its lost history (%s)\n", a.By, p, streamwal.AcceptLossKey(p))
	fmt.Fprintf(w, "%s.\n", acceptLossConsequence)
	if !strings.HasPrefix(openErr, string(streamwal.CodeHistoryLost)) {
		fmt.Fprintf(w, "note: %s is not refused with %s now; the consent stays until an open of it meets a loss\n", p, streamwal.CodeHistoryLost)
	}
	return nil
}

// operator names who runs the command: user@host.
func operator() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	switch {
	case name == "":
		return host
	case host == "":
		return name
	}
	return name + "@" + host
}
