package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
)

// connFlags are the flags of every command that talks to a cluster.
type connFlags struct {
	server  string
	cluster string
	timeout time.Duration
	json    bool
}

// add registers the flags on cmd.
func (f *connFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.server, "server", "nats://127.0.0.1:4222", "NATS URL of the cluster")
	fl.StringVar(&f.cluster, "cluster", "local", "streamwal cluster name")
	fl.DurationVar(&f.timeout, "timeout", 30*time.Second, "bound of the whole command")
	fl.BoolVar(&f.json, "json", false, "print JSON instead of text")
}

// withClient runs fn with a client of the cluster and a context bounded
// by --timeout, and closes the client afterwards.
func (f *connFlags) withClient(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	cluster, err := streamwal.ParseCluster(f.cluster)
	if err != nil {
		return err
	}
	if f.timeout <= 0 {
		return fmt.Errorf("--timeout must be positive")
	}
	c, err := client.Connect(f.server, client.WithCluster(cluster), client.WithoutLocalBypass())
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	return fn(ctx, c)
}

// printJSON writes v as one JSON line.
func printJSON(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// newStatusCmd is `streamwal status`.
func newStatusCmd() *cobra.Command {
	f := &connFlags{}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the coordinator, the nodes and every PChannel",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				st, err := c.Status(ctx)
				if err != nil {
					return err
				}
				if f.json {
					return printJSON(cmd.OutOrStdout(), st)
				}
				return printStatus(cmd.OutOrStdout(), st)
			})
		},
	}
	f.add(cmd)
	return cmd
}

// printStatus renders the status as text: a PChannel serves only while
// its owner confirms it (SERVING), a summary line names those that do
// not, and an error line per PChannel says why its last open failed.
// FIRST is the first message its stream keeps; CKPT AGE is the age of its
// owner's last persisted checkpoint ("-" before the first).
func printStatus(w io.Writer, st client.Status) error {
	fmt.Fprintf(w, "coordinator: %s (epoch %d, view version %d)\n", st.View.Leader, st.View.Epoch, st.View.Version)
	fmt.Fprintf(w, "nodes:       %s\n", strings.Join(st.View.Nodes, ", "))
	fmt.Fprintf(w, "cchannel:    %s\n", st.View.CChannel)
	var unserved []string
	for _, ch := range st.Channels {
		if !ch.Serving {
			unserved = append(unserved, ch.PChannel)
		}
	}
	if len(unserved) == 0 {
		fmt.Fprintf(w, "serving:     all %d PChannels\n", len(st.Channels))
	} else {
		fmt.Fprintf(w, "serving:     %d of %d PChannels; NOT SERVING (appends to them wait): %s\n",
			len(st.Channels)-len(unserved), len(st.Channels), strings.Join(unserved, ", "))
	}
	for _, ch := range st.Channels {
		if ch.Error != "" {
			fmt.Fprintf(w, "error:       %s: %s\n", ch.PChannel, ch.Error)
		}
		if ch.StorageError != "" {
			fmt.Fprintf(w, "error:       %s: recovery storage: %s\n", ch.PChannel, ch.StorageError)
		}
	}
	t := table.NewWriter()
	t.SetOutputMirror(w)
	t.AppendHeader(table.Row{"PChannel", "State", "Serving", "Since", "Owner", "Term", "VChannels", "First", "Last MessageID", "Last TimeTick", "Ckpt Age"})
	for _, ch := range st.Channels {
		t.AppendRow(statusRow(ch))
	}
	t.Render()
	return nil
}

// statusRow is one PChannel's row of the status table.
func statusRow(ch client.ChannelStatus) table.Row {
	tt, serving, since, age := "-", "no", "-", "-"
	if ch.LastTimeTick != 0 {
		tt = ch.LastTimeTick.String()
	}
	if ch.Serving {
		serving = "yes"
	}
	if !ch.Since.IsZero() {
		since = ch.Since.UTC().Format("2006-01-02T15:04:05Z")
	}
	if ch.Checkpoint != nil {
		age = ch.Checkpoint.AgeDuration().Round(time.Second).String()
	}
	return table.Row{ch.PChannel, ch.State, serving, since, ch.Node, ch.Term, ch.VChannels, ch.FirstID, ch.LastID, tt, age}
}

// newCollectionCmd is `streamwal collection create|drop|flush`.
func newCollectionCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "collection", Short: "Create, drop or flush a collection"}
	cmd.AddCommand(newCollectionFlushCmd())
	for _, op := range []string{"create", "drop"} {
		f := &connFlags{}
		col := &client.Collection{}
		sub := &cobra.Command{
			Use:   op,
			Short: op + " a collection (a broadcast to its VChannels and the CChannel)",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if col.DBName == "" || col.Name == "" || col.ID <= 0 {
					return fmt.Errorf("--db, --name and a positive --id are required")
				}
				return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
					return runCollection(ctx, cmd.OutOrStdout(), c, op, *col, f.json)
				})
			},
		}
		f.add(sub)
		fl := sub.Flags()
		fl.StringVar(&col.DBName, "db", "default", "database name")
		fl.StringVar(&col.Name, "name", "", "collection name")
		fl.Int64Var(&col.ID, "id", 0, "collection ID (positive)")
		if op == "create" {
			fl.IntVar(&col.Shards, "shards", 1, "VChannels of the collection")
			fl.Int64SliceVar(&col.Partitions, "partitions", nil, "partitions it starts with")
		}
		cmd.AddCommand(sub)
	}
	return cmd
}

// runCollection creates or drops a collection.
func runCollection(ctx context.Context, w io.Writer, c *client.Client, op string, col client.Collection, asJSON bool) error {
	if op == "drop" {
		if err := c.DropCollection(ctx, col); err != nil {
			return err
		}
		if asJSON {
			return printJSON(w, map[string]any{"dropped": col.ID})
		}
		fmt.Fprintf(w, "dropped collection %d (%s.%s)\n", col.ID, col.DBName, col.Name)
		return nil
	}
	vs, err := c.CreateCollection(ctx, col)
	if err != nil {
		return err
	}
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = v.String()
	}
	if asJSON {
		return printJSON(w, map[string]any{"created": col.ID, "vchannels": names})
	}
	fmt.Fprintf(w, "created collection %d (%s.%s) on %s\n", col.ID, col.DBName, col.Name, strings.Join(names, ", "))
	return nil
}

// newAppendCmd is `streamwal append`.
func newAppendCmd() *cobra.Command {
	f := &connFlags{}
	var vchannel, typ string
	cmd := &cobra.Command{
		Use:   "append [payload...]",
		Short: "Append messages to a VChannel (payloads from arguments, or one per line of standard input)",
		Long: "Append messages to --vchannel: each argument is one message, or, without arguments,\n" +
			"each line of standard input. Every message is built first, so bad input appends nothing.\n" +
			"The messages of one append land in the order given, however many there are and\n" +
			"however often a fault makes the client retry (each keeps its message ID, so a retry\n" +
			"of one that landed is not stored twice); other writers' messages may come between\n" +
			"them. A message whose outcome is unknown when --timeout ends is reported as\n" +
			"UNKNOWN_OUTCOME: it may have landed, at most once.",
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := streamwal.ParseVChannel(vchannel)
			if err != nil {
				return fmt.Errorf("--vchannel: %w", err)
			}
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				t, err := c.Codec().Registry().Lookup(typ)
				if err != nil {
					return fmt.Errorf("--type: %w", err)
				}
				payloads, err := appendPayloads(cmd.InOrStdin(), args)
				if err != nil {
					return err
				}
				if err := c.CheckPChannel(ctx, v.PChannel()); err != nil {
					return err
				}
				return runAppend(ctx, cmd.OutOrStdout(), c, v, t, payloads, f.json)
			})
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&vchannel, "vchannel", "", "target VChannel (required)")
	cmd.Flags().StringVar(&typ, "type", messages.TypeInsert.Name, "message type")
	return cmd
}

// appendPayloads are the arguments, or the lines of standard input.
func appendPayloads(in io.Reader, args []string) ([][]byte, error) {
	var out [][]byte
	for _, a := range args {
		out = append(out, []byte(a))
	}
	if len(out) > 0 {
		return out, nil
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), messages.DefaultMaxPayload)
	for sc.Scan() {
		out = append(out, append([]byte(nil), sc.Bytes()...))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read standard input: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no payload: give arguments or lines on standard input")
	}
	return out, nil
}

// runAppend builds every message first (so bad input appends nothing),
// then appends them.
func runAppend(ctx context.Context, w io.Writer, c *client.Client, v streamwal.VChannel, t *messages.Type, payloads [][]byte, asJSON bool) error {
	msgs := make([]*messages.MutableMessage, len(payloads))
	for i, p := range payloads {
		m, err := c.Codec().New(t, v, p)
		if err != nil {
			return err
		}
		msgs[i] = m
	}
	res, err := c.Append(ctx, msgs...)
	if err != nil {
		return err
	}
	for _, r := range res {
		if asJSON {
			if err := printJSON(w, map[string]any{"id": r.ID, "timetick": r.TimeTick, "time": r.TimeTick.String()}); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(w, "appended %d at %s\n", r.ID, r.TimeTick)
	}
	return nil
}

// newTailCmd is `streamwal tail`.
func newTailCmd() *cobra.Command {
	f := &connFlags{}
	var vchannel, pchannel string
	var fromStart bool
	var limit int
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Follow a VChannel or PChannel in TimeTick order (transactions assembled)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := tailOptions(vchannel, pchannel, fromStart)
			if err != nil {
				return err
			}
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				return runTail(ctx, cmd.OutOrStdout(), c, o, limit, f.json)
			})
		},
	}
	f.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&vchannel, "vchannel", "", "VChannel to follow")
	fl.StringVar(&pchannel, "pchannel", "", "PChannel to follow (every VChannel)")
	fl.BoolVar(&fromStart, "from-start", false, "start at the first message instead of new ones")
	fl.IntVar(&limit, "limit", 0, "stop after this many messages (0: follow until --timeout or Ctrl-C)")
	cmd.Flags().Lookup("timeout").DefValue = "87600h"
	_ = cmd.Flags().Set("timeout", "87600h")
	return cmd
}

// tailOptions checks the tail flags.
func tailOptions(vchannel, pchannel string, fromStart bool) (client.ReadOptions, error) {
	o := client.ReadOptions{Start: read.Latest()}
	if fromStart {
		o.Start = read.Earliest()
	}
	switch {
	case (vchannel == "") == (pchannel == ""):
		return o, fmt.Errorf("give exactly one of --vchannel and --pchannel")
	case vchannel != "":
		v, err := streamwal.ParseVChannel(vchannel)
		if err != nil {
			return o, fmt.Errorf("--vchannel: %w", err)
		}
		o.VChannel = v
	default:
		p, err := streamwal.ParsePChannel(pchannel)
		if err != nil {
			return o, fmt.Errorf("--pchannel: %w", err)
		}
		o.PChannel = p
	}
	return o, nil
}

// runTail prints messages until limit, ctx's end or Ctrl-C.
func runTail(ctx context.Context, w io.Writer, c *client.Client, o client.ReadOptions, limit int, asJSON bool) error {
	p := o.PChannel
	if !o.VChannel.IsZero() {
		p = o.VChannel.PChannel()
	}
	if err := c.CheckPChannel(ctx, p); err != nil {
		return err
	}
	s, err := c.Read(ctx, o)
	if err != nil {
		return err
	}
	defer s.Close()
	n := 0
	for m, err := range s.All(ctx) {
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := printMessage(w, m, asJSON); err != nil {
			return err
		}
		if n++; limit > 0 && n >= limit {
			return nil
		}
	}
	return nil
}

// tailLine is a message as `tail --json` prints it.
type tailLine struct {
	ID       messages.MessageID `json:"id"`
	TimeTick messages.TimeTick  `json:"timetick"`
	Time     string             `json:"time"`
	Type     string             `json:"type"`
	VChannel string             `json:"vchannel,omitempty"`
	Payload  string             `json:"payload,omitempty"`
	Txn      []tailLine         `json:"txn,omitempty"`
}

// lineOf describes a message.
func lineOf(m *messages.ImmutableMessage) tailLine {
	l := tailLine{ID: m.ID(), TimeTick: m.TimeTick(), Time: m.TimeTick().String(), Type: m.Type().Name, Payload: string(m.Payload())}
	if !m.VChannel().IsZero() {
		l.VChannel = m.VChannel().String()
	}
	for _, b := range m.TxnBody() {
		l.Txn = append(l.Txn, lineOf(b))
	}
	return l
}

// printMessage prints one message.
func printMessage(w io.Writer, m *messages.ImmutableMessage, asJSON bool) error {
	l := lineOf(m)
	if asJSON {
		return printJSON(w, l)
	}
	fmt.Fprintf(w, "%d %s %s %s %q\n", l.ID, l.Time, l.Type, l.VChannel, l.Payload)
	for _, b := range l.Txn {
		fmt.Fprintf(w, "    %d %s %s %q\n", b.ID, b.Time, b.Type, b.Payload)
	}
	return nil
}
