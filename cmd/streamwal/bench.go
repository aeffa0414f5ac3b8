package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// workloads are the bench workloads, in run order.
var workloads = []string{"append", "txn", "read", "broadcast"}

// benchFlags are the flags of `streamwal bench`.
type benchFlags struct {
	connFlags
	workloads   []string
	size        int
	concurrency int
	collections int
	duration    time.Duration
	minOps      int
	progress    bool
}

// newBenchCmd is `streamwal bench`.
func newBenchCmd() *cobra.Command {
	f := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure append, txn, read and broadcast against raw JetStream on the same server",
		Long: "Runs each workload with --concurrency workers through streamwal, then the closest raw\n" +
			"JetStream equivalent on the same server: append vs a synchronous publish, txn (begin,\n" +
			"2 bodies, commit) vs an atomic batch of 4, read vs a bare ordered consumer of the same\n" +
			"stored messages (the VChannel's subjects in its PChannel's stream), broadcast (a\n" +
			"CreateDatabase on the CChannel) vs a synchronous publish. Prints msgs/s and latency\n" +
			"percentiles per workload and system (--json: one JSON object per line).\n\n" +
			"Each workload runs on each system for --duration and at least --min-ops operations\n" +
			"(a txn is one operation of 4 messages), whichever takes longer, so that a slow machine\n" +
			"or a slow start (opening readers, the first fetch) gives a low rate, never none.\n" +
			"msgs/s is over the whole run, that start included; what a workload writes before it\n" +
			"runs (the read workload's preload) is not. A run that cannot complete --min-ops\n" +
			"operations ends with the command's --timeout.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBench(cmd, f) },
	}
	f.add(cmd)
	fl := cmd.Flags()
	fl.StringSliceVar(&f.workloads, "workload", workloads, "workloads to run: append, txn, read, broadcast")
	fl.IntVar(&f.size, "size", 1024, "payload bytes")
	fl.IntVar(&f.concurrency, "concurrency", 16, "concurrent workers")
	fl.IntVar(&f.collections, "collections", 4, "collections (one VChannel each, spread over the PChannels)")
	fl.DurationVar(&f.duration, "duration", 5*time.Second, "least duration of each workload and system")
	fl.IntVar(&f.minOps, "min-ops", 100, "least operations of each workload and system (however long they take)")
	fl.BoolVar(&f.progress, "progress", true, "show a progress bar on standard error")
	setFlagDefault(fl, "timeout", "1h")
	return cmd
}

// check validates the flags.
func (f *benchFlags) check() error {
	for _, w := range f.workloads {
		if !slices.Contains(workloads, w) {
			return fmt.Errorf("--workload %q: want %s", w, strings.Join(workloads, ", "))
		}
	}
	switch {
	case f.size < 0 || f.size > messages.DefaultMaxPayload:
		return fmt.Errorf("--size must be 0 to %d", messages.DefaultMaxPayload)
	case f.concurrency <= 0:
		return fmt.Errorf("--concurrency must be positive")
	case f.collections <= 0:
		return fmt.Errorf("--collections must be positive")
	case f.duration <= 0:
		return fmt.Errorf("--duration must be positive")
	case f.minOps <= 0:
		return fmt.Errorf("--min-ops must be positive")
	}
	return nil
}

// benchResult is one workload on one system.
type benchResult struct {
	Workload   string  `json:"workload"`
	System     string  `json:"system"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
	Ops        int64   `json:"ops"`
}

// bench holds what the workloads share.
type bench struct {
	f       *benchFlags
	c       *client.Client
	nc      *nats.Conn
	js      njs.JetStream
	vs      []streamwal.VChannel
	payload []byte
	errOut  io.Writer
}

// runBench runs the workloads and prints the results.
func runBench(cmd *cobra.Command, f *benchFlags) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.withClient(cmd, func(ctx context.Context, c *client.Client) error {
		if err := pingCoordinator(ctx, c); err != nil {
			return err
		}
		return benchAll(ctx, cmd, f, c)
	})
}

// benchAll runs every workload on both systems and prints the results.
func benchAll(ctx context.Context, cmd *cobra.Command, f *benchFlags, c *client.Client) error {
	b, err := newBench(ctx, f, c, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer b.nc.Close()
	var results []benchResult
	for _, w := range f.workloads {
		for _, sys := range []string{"streamwal", "jetstream"} {
			r, err := b.run(ctx, w, sys)
			if err != nil {
				return fmt.Errorf("%s on %s: %w", w, sys, err)
			}
			results = append(results, r)
			if f.json {
				if err := printJSON(cmd.OutOrStdout(), r); err != nil {
					return err
				}
			}
		}
	}
	if !f.json {
		printBench(cmd.OutOrStdout(), results)
	}
	return nil
}

// newBench creates the bench collections and a raw connection.
func newBench(ctx context.Context, f *benchFlags, c *client.Client, errOut io.Writer) (*bench, error) {
	nc, err := f.dialRaw("streamwal-bench")
	if err != nil {
		return nil, err
	}
	js, err := njs.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	b := &bench{f: f, c: c, nc: nc, js: js, payload: make([]byte, f.size), errOut: errOut}
	base := time.Now().UnixMilli() % 1_000_000_000 * 1000
	for i := range f.collections {
		col := client.Collection{DBName: "bench", Name: fmt.Sprintf("bench-%d", base+int64(i)), ID: base + int64(i) + 1}
		vs, err := c.CreateCollection(ctx, col)
		if err != nil {
			nc.Close()
			return nil, err
		}
		b.vs = append(b.vs, vs...)
	}
	return b, nil
}

// run measures one workload on one system: after what the workload
// writes first (b.op), its workers run until --duration has passed and
// --min-ops operations have completed, whichever is later, and then the
// operations still in flight are cancelled (and not counted).
func (b *bench) run(ctx context.Context, workload, sys string) (benchResult, error) {
	op, perOp, err := b.op(ctx, workload, sys)
	if err != nil {
		return benchResult{}, err
	}
	hist := hdrhistogram.New(1, int64(time.Minute/time.Microsecond), 3)
	var mu sync.Mutex
	var ops atomic.Int64
	var firstErr atomic.Pointer[error]
	bar := b.progress(workload + " " + sys)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The run ends at whichever comes later, the duration (the timer) or
	// the min-ops-th operation (its worker): each side first says it is
	// done and then looks at the other, so that the later one sees both.
	minOps := int64(b.f.minOps)
	var due atomic.Bool
	start := time.Now()
	timer := time.AfterFunc(b.f.duration, func() {
		due.Store(true)
		if ops.Load() >= minOps {
			cancel()
		}
	})
	defer timer.Stop()
	var wg sync.WaitGroup
	for w := range b.f.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; runCtx.Err() == nil; i++ {
				t0 := time.Now()
				if err := op(runCtx, w, i); err != nil {
					if runCtx.Err() == nil {
						firstErr.CompareAndSwap(nil, &err)
						cancel()
					}
					return
				}
				mu.Lock()
				_ = hist.RecordValue(time.Since(t0).Microseconds())
				mu.Unlock()
				if ops.Add(1) >= minOps && due.Load() {
					cancel()
				}
				_ = bar.Add(1)
			}
		}()
	}
	wg.Wait()
	_ = bar.Finish()
	if e := firstErr.Load(); e != nil {
		return benchResult{}, *e
	}
	if err := ctx.Err(); err != nil {
		// --timeout (or the caller) ended the run, not the bench.
		return benchResult{}, err
	}
	elapsed := time.Since(start).Seconds()
	return benchResult{Workload: workload, System: sys, Ops: ops.Load(),
		MsgsPerSec: float64(ops.Load()*int64(perOp)) / elapsed,
		P50ms:      float64(hist.ValueAtQuantile(50)) / 1000, P99ms: float64(hist.ValueAtQuantile(99)) / 1000}, nil
}

// progress returns a progress bar counting operations (none without
// --progress or with --json).
func (b *bench) progress(name string) progress {
	if !b.f.progress || b.f.json {
		return noProgress{}
	}
	return progressbar.NewOptions(-1, progressbar.OptionSetWriter(b.errOut), progressbar.OptionSetDescription(name),
		progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionClearOnFinish(),
		progressbar.OptionSetSpinnerChangeInterval(0), progressbar.OptionThrottle(100*time.Millisecond))
}

// progress counts operations on screen.
type progress interface {
	Add(n int) error
	Finish() error
}

// noProgress shows nothing (and starts nothing).
type noProgress struct{}

func (noProgress) Add(int) error { return nil }
func (noProgress) Finish() error { return nil }

// benchOp is one operation of a workload by worker w, i-th time.
type benchOp func(ctx context.Context, w, i int) error

// op returns a workload's operation on a system and how many messages one
// operation moves.
func (b *bench) op(ctx context.Context, workload, sys string) (benchOp, int, error) {
	switch workload + "/" + sys {
	case "append/streamwal":
		return b.appendOp, 1, nil
	case "txn/streamwal":
		return b.txnOp, 4, nil
	case "broadcast/streamwal":
		return b.broadcastOp, 1, nil
	case "read/streamwal":
		if err := b.preload(ctx); err != nil {
			return nil, 0, err
		}
		return b.readStreamwal(ctx)
	case "read/jetstream":
		if err := b.preload(ctx); err != nil {
			return nil, 0, err
		}
		return b.readRaw(ctx)
	}
	subj, err := b.rawStream(ctx, workload)
	if err != nil {
		return nil, 0, err
	}
	if workload == "txn" {
		return b.rawBatch(subj), 4, nil
	}
	return b.rawPublish(subj), 1, nil
}

// appendOp appends one insert.
func (b *bench) appendOp(ctx context.Context, w, i int) error {
	m, err := b.c.Codec().New(messages.TypeInsert, b.vs[(w+i)%len(b.vs)], b.payload)
	if err != nil {
		return err
	}
	_, err = b.c.Append(ctx, m)
	return err
}

// txnOp runs a transaction of two bodies.
func (b *bench) txnOp(ctx context.Context, w, i int) error {
	v := b.vs[(w+i)%len(b.vs)]
	t, err := b.c.BeginTxn(ctx, v, 0)
	if err != nil {
		return err
	}
	var body []*messages.MutableMessage
	for range 2 {
		m, err := b.c.Codec().New(messages.TypeInsert, v, b.payload)
		if err != nil {
			return err
		}
		body = append(body, m)
	}
	if _, err := t.Append(ctx, body...); err != nil {
		return err
	}
	_, err = t.Commit(ctx)
	return err
}

// broadcastOp broadcasts a CreateDatabase of a fresh database.
func (b *bench) broadcastOp(ctx context.Context, _, _ int) error {
	name := "benchdb-" + nuid.Next()
	_, err := b.c.Broadcast(ctx, client.BroadcastRequest{Type: messages.TypeCreateDatabase,
		Scope: messages.KeyScope{DBName: name}, Payload: b.payload})
	return err
}

// preloadCount is how many messages the read workload writes per
// VChannel before it reads, on each system.
const preloadCount = 2000

// preload appends what the read workload reads, on either system.
func (b *bench) preload(ctx context.Context) error {
	for _, v := range b.vs {
		for done := 0; done < preloadCount; done += client.DefaultMaxBatch {
			msgs := make([]*messages.MutableMessage, min(client.DefaultMaxBatch, preloadCount-done))
			for i := range msgs {
				m, err := b.c.Codec().New(messages.TypeInsert, v, b.payload)
				if err != nil {
					return err
				}
				msgs[i] = m
			}
			if _, err := b.c.Append(ctx, msgs...); err != nil {
				return err
			}
		}
	}
	return nil
}

// readStreamwal reads the bench VChannels, each worker one VChannel from
// the start through the read pipeline, starting over after the preloaded
// inserts so that no worker waits at the end for more.
func (b *bench) readStreamwal(context.Context) (benchOp, int, error) {
	return rereader(func(ctx context.Context, w int) (func(context.Context) error, func(), error) {
		s, err := b.c.Read(ctx, client.ReadOptions{VChannel: b.vs[w%len(b.vs)], Start: client.Earliest(),
			Types: []*messages.Type{messages.TypeInsert}})
		if err != nil {
			return nil, nil, err
		}
		next := func(ctx context.Context) error { _, err := s.Next(ctx); return err }
		return next, func() { _ = s.Close() }, nil
	}), 1, nil
}

// readRaw is readStreamwal on raw JetStream: each worker reads the same
// stored messages, its VChannel's subjects in its PChannel's stream (the
// filters the read pipeline gives its consumer), with a bare ordered
// consumer that decodes nothing, starting over after preloadCount
// messages. Reading the stored messages, headers and filters included, is
// what makes the ratio the cost of the read pipeline itself: a stream of
// header-less messages on one subject costs the server and nats.go less
// per message whatever reads it.
func (b *bench) readRaw(context.Context) (benchOp, int, error) {
	cl := b.c.Codec().Cluster()
	return rereader(func(ctx context.Context, w int) (func(context.Context) error, func(), error) {
		v := b.vs[w%len(b.vs)]
		cons, err := b.js.OrderedConsumer(ctx, cl.StreamName(v.PChannel()), njs.OrderedConsumerConfig{FilterSubjects: cl.VChannelFilter(v)})
		if err != nil {
			return nil, nil, err
		}
		it, err := cons.Messages()
		if err != nil {
			return nil, nil, err
		}
		next := func(ctx context.Context) error { _, err := it.Next(njs.NextContext(ctx)); return err }
		return next, it.Stop, nil
	}), 1, nil
}

// rereader is a read op: each worker reads one message a call from a
// reader that open starts, and starts over after preloadCount messages; a
// reader still open when the workload's context ends is stopped then.
func rereader(open func(ctx context.Context, w int) (next func(context.Context) error, stop func(), err error)) benchOp {
	type reader struct {
		next func(context.Context) error
		stop func()
		read int
	}
	var mu sync.Mutex
	readers := map[int]*reader{}
	return func(ctx context.Context, w, _ int) error {
		mu.Lock()
		r := readers[w]
		mu.Unlock()
		if r == nil {
			next, stop, err := open(ctx, w)
			if err != nil {
				return err
			}
			unhook := context.AfterFunc(ctx, stop)
			r = &reader{next: next, stop: func() {
				if unhook() {
					stop()
				}
			}}
			mu.Lock()
			readers[w] = r
			mu.Unlock()
		}
		err := r.next(ctx)
		if r.read++; r.read == preloadCount || err != nil {
			r.stop()
			mu.Lock()
			delete(readers, w)
			mu.Unlock()
		}
		return err
	}
}

// rawName is the raw stream of a workload.
func (b *bench) rawName(workload string) string {
	return "BENCH_RAW_" + strings.ToUpper(workload)
}

// rawStream creates (or reuses) the raw stream of a workload.
func (b *bench) rawStream(ctx context.Context, workload string) (string, error) {
	name := b.rawName(workload)
	_, err := b.js.CreateOrUpdateStream(ctx, njs.StreamConfig{Name: name, Subjects: []string{name + ".>"},
		Storage: njs.FileStorage, AllowAtomicPublish: true})
	return name + ".x", err
}

// rawPublish publishes one message and waits for its ack.
func (b *bench) rawPublish(subj string) benchOp {
	return func(ctx context.Context, _, _ int) error {
		_, err := b.js.Publish(ctx, subj, b.payload)
		return err
	}
}

// rawBatch publishes an atomic batch of four messages.
func (b *bench) rawBatch(subj string) benchOp {
	return func(ctx context.Context, _, _ int) error {
		batch := make([]*nats.Msg, 4)
		for i := range batch {
			batch[i] = &nats.Msg{Subject: subj, Data: b.payload, Header: nats.Header{}}
		}
		_, err := jetstreamext.PublishMsgBatch(ctx, b.js, batch)
		return err
	}
}

// printBench renders the results as a table, with streamwal's ratio to
// raw JetStream.
func printBench(w io.Writer, results []benchResult) {
	t := table.NewWriter()
	t.SetOutputMirror(w)
	t.AppendHeader(table.Row{"Workload", "System", "msgs/s", "p50 ms", "p99 ms", "vs jetstream"})
	raw := map[string]float64{}
	for _, r := range results {
		if r.System == "jetstream" {
			raw[r.Workload] = r.MsgsPerSec
		}
	}
	for _, r := range results {
		ratio := ""
		if r.System == "streamwal" && raw[r.Workload] > 0 {
			ratio = fmt.Sprintf("%.2f", r.MsgsPerSec/raw[r.Workload])
		}
		t.AppendRow(table.Row{r.Workload, r.System, formatRate(r.MsgsPerSec), fmt.Sprintf("%.2f", r.P50ms), fmt.Sprintf("%.2f", r.P99ms), ratio})
	}
	t.Render()
}

// formatRate is a msgs/s of the table: whole from 10 up, and two
// significant digits below, so that a run that moved messages, however
// slowly, never shows 0.
func formatRate(v float64) string {
	if v >= 10 {
		return fmt.Sprintf("%.0f", v)
	}
	return strconv.FormatFloat(v, 'g', 2, 64)
}
