package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// connFlags are the flags of every command that talks to a cluster: the
// connection flags (connect.go), the cluster, a bound and the output.
type connFlags struct {
	natsFlags
	cluster string
	timeout time.Duration
	json    bool
	// flags is the command's flag set, once withClient resolved it.
	flags *pflag.FlagSet
}

// add registers the flags on cmd and explains the connection flags and
// their environment variables in its help.
func (f *connFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	f.natsFlags.add(fl)
	fl.StringVar(&f.cluster, flagCluster, "local", "streamwal cluster name (env STREAMWAL_CLUSTER)")
	fl.DurationVar(&f.timeout, "timeout", 30*time.Second, "bound of the whole command")
	fl.BoolVar(&f.json, "json", false, "print JSON instead of text")
	addConnHelp(cmd)
}

// withClient runs fn with a client of the cluster and a context bounded
// by --timeout, and closes the client afterwards. Flags not given on the
// command line are taken from the environment first (connEnv).
func (f *connFlags) withClient(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	f.flags = cmd.Flags()
	if err := applyEnv(f.flags, connEnv); err != nil {
		return err
	}
	cluster, err := streamwal.ParseCluster(f.cluster)
	if err != nil {
		return fmt.Errorf("%s: %w", origin(f.flags, flagCluster), err)
	}
	if f.timeout <= 0 {
		return fmt.Errorf("--timeout must be positive")
	}
	opts, err := f.natsOptions(f.flags)
	if err != nil {
		return err
	}
	c, err := client.Connect(f.server, client.WithCluster(cluster), client.WithoutLocalBypass(), client.WithNATSOptions(opts...))
	if err != nil {
		return fmt.Errorf("%w (%s)%s", err, f.authDesc(), authHint(err))
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
	wf := &watchFlags{}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the coordinator, the nodes and every PChannel",
		Long: "Show the coordinator, the nodes and every PChannel once; with --watch, refresh\n" +
			"every --interval (in place on a terminal) with each PChannel's owner, term,\n" +
			"serving, messages per second since the last refresh, the age of its last\n" +
			"TimeTick and of its checkpoint, until Ctrl-C (--timeout then bounds each refresh).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := wf.check(); err != nil {
				return err
			}
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if err := pingCoordinator(ctx, c); err != nil {
					return err
				}
				if wf.watch {
					return watchStatus(cmd.Context(), cmd.OutOrStdout(), c, *wf, f.timeout, f.json)
				}
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
	cmd.Flags().BoolVar(&wf.watch, "watch", false, "refresh until Ctrl-C")
	cmd.Flags().DurationVar(&wf.interval, "interval", time.Second, "with --watch: time between refreshes")
	cmd.Flags().IntVar(&wf.count, "count", 0, "with --watch: stop after this many refreshes (0: until Ctrl-C)")
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
			Long:  collectionHelp[op],
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if col.DBName == "" || col.Name == "" || col.ID <= 0 {
					return fmt.Errorf("--db, --name and a positive --id are required")
				}
				if op == "create" && col.Shards < 1 {
					return fmt.Errorf("--shards must be at least 1 (the collection's VChannels, each on its own PChannel), got %d", col.Shards)
				}
				return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
					if err := pingCoordinator(ctx, c); err != nil {
						return err
					}
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

// collectionHelp is the long help of collection create and drop.
var collectionHelp = map[string]string{
	"create": "Create the collection --db.--name under --id: allocate its --shards VChannels (each on its\n" +
		"own PChannel) and broadcast its CreateCollection to them and to the CChannel.\n" +
		"Creating a collection again under the same ID and name succeeds and changes nothing (a retry\n" +
		"is safe). A name belongs to one live collection: another ID under a taken name is refused,\n" +
		"and so is an ID taken by another name or by a dropped collection (IDs are never reused).",
	"drop": "Drop the collection --db.--name of --id: broadcast its DropCollection to its VChannels and\n" +
		"the CChannel, then release them. Appends to it are refused afterwards; its history stays\n" +
		"readable (`streamwal tail --from-start`).",
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
	var vchannel, typ, file string
	types := strings.Join(appendTypes(messages.NewRegistry()), ", ")
	cmd := &cobra.Command{
		Use:   "append [payload...]",
		Short: "Append messages to a VChannel (payloads from arguments, lines of standard input, or a file)",
		Long: "Append messages to --vchannel: each argument is one message, or, without arguments,\n" +
			"each line of standard input (without its newline), or, with --file, the file's bytes as\n" +
			"one message, whatever they hold (--file - reads all of standard input as one). A payload\n" +
			"may be as large as the cluster's payload limit and the server's max_payload allow; a\n" +
			"larger one is refused, with the limit. --type is one of " + types + ",\n" +
			"in any case. Every message is built first, so bad input appends nothing.\n" +
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
			if _, err := appendType(messages.NewRegistry(), typ); err != nil {
				return err
			}
			src := payloadSource{args: args, file: file, stdin: cmd.InOrStdin()}
			if err := src.check(); err != nil {
				return err
			}
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				t, err := appendType(c.Codec().Registry(), typ)
				if err != nil {
					return err
				}
				if err := pingCoordinator(ctx, c); err != nil {
					return err
				}
				payloads, err := src.read(c.MaxPayload())
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
	cmd.Flags().StringVar(&typ, "type", messages.TypeInsert.Name, "message type, in any case: "+types)
	cmd.Flags().StringVar(&file, "file", "", "append this file's bytes as one message (- for standard input)")
	return cmd
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
	var vchannel, pchannel, durable string
	var fromStart, wait bool
	var limit int
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Follow a VChannel or PChannel in TimeTick order (transactions assembled)",
		Long: "Print the messages of --vchannel (or of every VChannel of --pchannel) in TimeTick order,\n" +
			"a committed transaction as one Txn message with its bodies: new ones as they land, or\n" +
			"all of them from the first with --from-start; until --limit messages were printed, or\n" +
			"--timeout ends, or Ctrl-C. A VChannel of a collection that does not exist is refused at\n" +
			"once (with --wait, tail follows it until the collection is created and what lands on it\n" +
			"arrives), and so is one of a dropped collection without --from-start (nothing new lands\n" +
			"on it). --json prints one object per message; a payload that is not UTF-8 text is given\n" +
			"in base64, with \"payload_encoding\":\"base64\".\n\n" +
			"--durable NAME keeps the position in the cluster as the durable subscription NAME: each\n" +
			"message is acknowledged once printed, and the next `tail --durable NAME` (after any restart\n" +
			"of the client or the servers) resumes after the last one printed; --from-start or not says\n" +
			"where a new subscription starts. `streamwal subscriptions` lists them.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return fmt.Errorf("--limit must be 0 (no limit: follow until --timeout or Ctrl-C) or a positive count, got %d", limit)
			}
			o, err := tailOptions(vchannel, pchannel, fromStart)
			if err != nil {
				return err
			}
			return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if err := pingCoordinator(ctx, c); err != nil {
					return err
				}
				if !o.VChannel.IsZero() {
					if err := checkTailVChannel(ctx, c, o.VChannel, fromStart, wait); err != nil {
						return err
					}
				}
				if durable != "" {
					return runDurableTail(ctx, cmd.OutOrStdout(), c, durable, o, limit, f.json)
				}
				return runTail(ctx, cmd.OutOrStdout(), c, o, limit, f.json)
			})
		},
	}
	f.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&vchannel, "vchannel", "", "VChannel to follow")
	fl.StringVar(&pchannel, "pchannel", "", "PChannel to follow (every VChannel)")
	fl.BoolVar(&fromStart, "from-start", false, "start at the first message instead of new ones")
	fl.IntVar(&limit, "limit", 0, "stop after this many messages (0: no limit, follow until --timeout or Ctrl-C)")
	fl.BoolVar(&wait, "wait", false, "follow a VChannel whose collection does not exist yet, until it is created")
	fl.StringVar(&durable, "durable", "", "keep the position in the cluster as durable subscription `NAME` (resume after the last message printed)")
	setFlagDefault(fl, "timeout", "87600h")
	return cmd
}

// tailOptions checks the tail flags.
func tailOptions(vchannel, pchannel string, fromStart bool) (client.ReadOptions, error) {
	o := client.ReadOptions{Start: client.Latest()}
	if fromStart {
		o.Start = client.Earliest()
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
	// PayloadEncoding is "base64" when the payload is not UTF-8 text and
	// Payload is its standard base64 (absent otherwise).
	PayloadEncoding string     `json:"payload_encoding,omitempty"`
	Txn             []tailLine `json:"txn,omitempty"`
}

// lineOf describes a message.
func lineOf(m *messages.ImmutableMessage) tailLine {
	l := tailLine{ID: m.ID(), TimeTick: m.TimeTick(), Time: m.TimeTick().String(), Type: m.Type().Name}
	l.Payload, l.PayloadEncoding = jsonPayload(m.Payload())
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
	// Payloads quoted as Go strings: bytes that are not text are escaped.
	fmt.Fprintf(w, "%d %s %s %s %q\n", l.ID, l.Time, l.Type, l.VChannel, m.Payload())
	for i, b := range m.TxnBody() {
		fmt.Fprintf(w, "    %d %s %s %q\n", l.Txn[i].ID, l.Txn[i].Time, l.Txn[i].Type, b.Payload())
	}
	return nil
}
