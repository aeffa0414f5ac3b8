package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"golang.org/x/term"

	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// watchFlags are the flags of `streamwal status --watch`.
type watchFlags struct {
	watch    bool
	interval time.Duration
	count    int
}

// check refuses a watch that cannot run.
func (f *watchFlags) check() error {
	if !f.watch {
		if f.count != 0 {
			return fmt.Errorf("--count needs --watch")
		}
		return nil
	}
	if f.interval < 10*time.Millisecond {
		return fmt.Errorf("--interval must be at least 10ms, got %s", f.interval)
	}
	if f.count < 0 {
		return fmt.Errorf("--count must not be negative, got %d", f.count)
	}
	return nil
}

// clearScreen moves a terminal's cursor home and clears the screen.
const clearScreen = "\x1b[H\x1b[2J"

// watcher renders the status again and again, with rates from the
// difference between two refreshes.
type watcher struct {
	w        io.Writer
	inPlace  bool // a terminal: redraw in place
	json     bool
	interval time.Duration
	prev     map[string]messages.MessageID
	prevAt   time.Time
}

// watchStatus refreshes the status every interval until ctx ends (or
// count refreshes were shown, when count > 0); each refresh is bounded by
// timeout. A refresh that fails is shown as an error line and the watch
// goes on.
func watchStatus(ctx context.Context, out io.Writer, c *client.Client, f watchFlags, timeout time.Duration, asJSON bool) error {
	wt := &watcher{w: out, inPlace: isTerminal(out) && !asJSON, json: asJSON, interval: f.interval}
	tick := time.NewTicker(f.interval)
	defer tick.Stop()
	for n := 1; ; n++ {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		st, err := c.Status(rctx)
		cancel()
		if err := wt.show(st, err, time.Now()); err != nil {
			return err
		}
		if f.count > 0 && n >= f.count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// show renders one refresh.
func (wt *watcher) show(st client.Status, err error, now time.Time) error {
	if wt.json {
		if err != nil {
			return printJSON(wt.w, map[string]string{"error": err.Error()})
		}
		return printJSON(wt.w, st)
	}
	if wt.inPlace {
		fmt.Fprint(wt.w, clearScreen)
	} else if !wt.prevAt.IsZero() {
		fmt.Fprintln(wt.w)
	}
	fmt.Fprintf(wt.w, "%s  (every %s; Ctrl-C to stop)\n", now.UTC().Format(time.RFC3339), wt.interval)
	if err != nil {
		fmt.Fprintf(wt.w, "error:       %v\n", err)
		return nil
	}
	fmt.Fprintf(wt.w, "coordinator: %s (epoch %d)  nodes: %d\n", st.View.Leader, st.View.Epoch, len(st.View.Nodes))
	t := table.NewWriter()
	t.SetOutputMirror(wt.w)
	t.AppendHeader(table.Row{"PChannel", "Owner", "Term", "Serving", "Msgs/s", "TimeTick Lag", "Ckpt Age"})
	last := make(map[string]messages.MessageID, len(st.Channels))
	for _, ch := range st.Channels {
		last[ch.PChannel] = ch.LastID
		t.AppendRow(wt.row(ch, now))
	}
	t.Render()
	wt.prev, wt.prevAt = last, now
	return nil
}

// row is one PChannel's row: its message rate since the last refresh,
// how old its last TimeTick is, and its checkpoint's age.
func (wt *watcher) row(ch client.ChannelStatus, now time.Time) table.Row {
	serving, rate, lag, age := "no", "-", "-", "-"
	if ch.Serving {
		serving = "yes"
	}
	if before, ok := wt.prev[ch.PChannel]; ok && ch.LastID >= before {
		if secs := now.Sub(wt.prevAt).Seconds(); secs > 0 {
			rate = fmt.Sprintf("%.1f", float64(ch.LastID-before)/secs)
		}
	}
	if ch.LastTimeTick != 0 {
		lag = max(now.Sub(ch.LastTimeTick.Physical()), 0).Round(time.Millisecond).String()
	}
	if ch.Checkpoint != nil {
		age = ch.Checkpoint.AgeDuration().Round(time.Second).String()
	}
	return table.Row{ch.PChannel, ch.Node, ch.Term, serving, rate, lag, age}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
