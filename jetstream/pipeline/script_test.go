package pipeline

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/streamwal/streamwal"
)

// TestScripts runs the scripts in testdata: events in, what the pipeline
// decided out. Requests are named; a request's messages have IDs
// "w-<name>.<i>" (given by the writer, IDPrefix "w-") or "<name>.<i>"
// (the caller's). The barrier's message ID is "barrier", the writer's
// term 1. After every command the invariants must hold. Rewrite the
// expected output after a deliberate change with -rewrite.
//
// Commands (the clock starts at t0 and moves only by tick):
//
//	new [replicas=N] [group-commit=B] [max-batch=N] [max-in-flight=N]
//	    [max-in-flight-msgs=N] [barrier=N] [plain-up-to=N]
//	enqueue NAME[=N | =(N,caller)]...   requests of N messages (default 1)
//	send                 publish every unit the pipeline forms
//	ack unit=U [seq=S] [count=C] [refused=(wrong-seq|dup|permanent|busy)] [duplicate]
//	                     by default the success the unit expects
//	refuse unit=U req=K  the client refused request K of unit U (sent last)
//	send-fails unit=U    the connection failed while unit U went out
//	tick [d=D]           move the clock (default 0), then Tick
//	reconnect
//	scan [last=L] [end=E] [error=(unavailable|fenced|unrecoverable)]
//	                     input: the tail, "<seq> <id> [term=T] [barrier]"
//	close | halt | stop
//	state                the pipeline's state
func TestScripts(t *testing.T) {
	paths, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no scripts (%v)", err)
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			h := &harness{now: t0}
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				out := h.run(t, d)
				if h.p != nil {
					if err := h.p.CheckInvariants(); err != nil {
						t.Fatalf("%s: invariants: %v\n%s", d.Pos, err, out)
					}
				}
				return out
			})
		})
	}
}

// t0 is the scripts' origin of time.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// harness steps a pipeline of named requests.
type harness struct {
	p     *Pipeline[string]
	now   time.Time
	units map[uint64]*Unit[string]
	last  *Unit[string] // the unit sent last
	b     strings.Builder
}

// run runs one command and returns what the pipeline decided.
func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	h.b.Reset()
	switch d.Cmd {
	case "new":
		h.new(t, d)
	case "enqueue":
		h.enqueue(t, d)
	case "send":
		h.send()
	case "ack":
		h.p.Ack(h.now, h.ack(t, d))
	case "refuse":
		u := h.unit(t, d)
		if u != h.last {
			t.Fatalf("%s: refuse names unit %d, not the unit sent last", d.Pos, u.Num)
		}
		h.p.Refused(h.now, u, intArg(t, d, "req", 0), streamwal.Errorf(streamwal.CodeInvalidArgument, "refused by the client"))
	case "send-fails":
		h.p.SendFailed(h.now, h.unit(t, d), streamwal.Errorf(streamwal.CodeUnavailable, "connection lost"))
	case "tick":
		if d.HasArg("d") {
			var s string
			d.ScanArgs(t, "d", &s)
			h.now = h.now.Add(duration(t, s))
		}
		h.p.Tick(h.now)
	case "reconnect":
		h.p.Reconnected(h.now)
	case "scan":
		h.scan(t, d)
	case "close":
		h.p.Close(h.now)
	case "halt":
		h.p.Halt(streamwal.Errorf(streamwal.CodeUnavailable, "connection closed"))
	case "stop":
		fmt.Fprintf(&h.b, "reason: %v\n", h.p.Stop(streamwal.Errorf(streamwal.CodeClosed, "closed")))
	case "state":
		h.state()
		return h.b.String()
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
	h.ready()
	return h.b.String()
}

// new starts a pipeline.
func (h *harness) new(t *testing.T, d *datadriven.TestData) {
	cfg := Config{
		PChannel: "pchan-0", Term: 1, IDPrefix: "w-", BarrierID: "barrier",
		Barrier: uint64(intArg(t, d, "barrier", 1)), Replicas: intArg(t, d, "replicas", 1),
		GroupCommit: true, MaxBatch: intArg(t, d, "max-batch", 8), MaxInFlight: intArg(t, d, "max-in-flight", 2),
		MaxInFlightMsgs: intArg(t, d, "max-in-flight-msgs", 64), AckTimeout: 5 * time.Second, CloseBudget: 3 * time.Second,
		PlainUpTo: intArg(t, d, "plain-up-to", 0),
	}
	if d.HasArg("group-commit") {
		d.ScanArgs(t, "group-commit", &cfg.GroupCommit)
	}
	h.p, h.now, h.units, h.last = New[string](cfg), t0, map[uint64]*Unit[string]{}, nil
}

// enqueue queues named requests.
func (h *harness) enqueue(t *testing.T, d *datadriven.TestData) {
	for _, a := range d.CmdArgs {
		n, prefix := 1, "w-"
		for _, v := range a.Vals {
			if v == "caller" {
				prefix = ""
				continue
			}
			var err error
			if n, err = strconv.Atoi(v); err != nil {
				t.Fatalf("%s: request %s: %v", d.Pos, a.Key, err)
			}
		}
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("%s%s.%d", prefix, a.Key, i)
		}
		r := &Request[string]{}
		r.Init(a.Key, ids)
		h.p.Enqueue(r)
	}
}

// send publishes every unit the pipeline forms.
func (h *harness) send() {
	for u := h.p.Next(h.now); u != nil; u = h.p.Next(h.now) {
		h.units[u.Num], h.last = u, u
		fmt.Fprintf(&h.b, "unit %s\n", describe(u))
	}
}

// describe is one line about a unit.
func describe(u *Unit[string]) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d:", u.Num)
	for _, r := range u.Reqs {
		b.WriteString(" " + r.Payload())
		if from, to := r.Span(); r.parent != nil || to-from > 1 {
			fmt.Fprintf(&b, "[%d:%d]", from, to)
		}
		if r.Resend() {
			b.WriteString("(again)")
		}
	}
	kind := "publish"
	if u.Atomic() {
		kind = "batch"
	}
	fmt.Fprintf(&b, " %s of %d expect=%d after=%s", kind, u.N, u.Expect, u.After)
	if u.Fenced {
		fmt.Fprintf(&b, " fence=%d", u.Fence)
	}
	if u.Quiet {
		b.WriteString(" quiet")
	}
	return b.String()
}

// unit is the sent unit the command names.
func (h *harness) unit(t *testing.T, d *datadriven.TestData) *Unit[string] {
	u := h.units[uint64(intArg(t, d, "unit", -1))]
	if u == nil {
		t.Fatalf("%s: no such unit", d.Pos)
	}
	return u
}

// ack is the answer the command describes.
func (h *harness) ack(t *testing.T, d *datadriven.TestData) Ack {
	u := h.unit(t, d)
	a := Ack{Num: u.Num, Seq: u.Expect + uint64(u.N), Count: uint64(u.N)}
	a.Seq = uint64(intArg(t, d, "seq", int(a.Seq)))
	a.Count = uint64(intArg(t, d, "count", int(a.Count)))
	a.Duplicate = d.HasArg("duplicate")
	if d.HasArg("refused") {
		var why string
		d.ScanArgs(t, "refused", &why)
		a = Ack{Num: u.Num, Err: streamwal.Errorf(streamwal.CodeUnavailable, "refused: %s", why)}
		switch why {
		case "wrong-seq":
			a.WrongSeq = true
		case "dup":
			a.RefusedDup = true
		case "permanent":
			a.Permanent = true
			a.Err = streamwal.Errorf(streamwal.CodeUnrecoverable, "refused for good")
		case "busy":
		default:
			t.Fatalf("%s: unknown refusal %q", d.Pos, why)
		}
	}
	return a
}

// scan reads the tail the input gives.
func (h *harness) scan(t *testing.T, d *datadriven.TestData) {
	if !h.p.NeedScan() {
		t.Fatalf("%s: the pipeline asked for no scan", d.Pos)
	}
	if d.HasArg("error") {
		var code string
		d.ScanArgs(t, "error", &code)
		h.p.EndScan(h.now, nil, 0, streamwal.Errorf(streamwal.Code(strings.ToUpper(code)), "tail read failed"))
		return
	}
	msgs := tail(t, d)
	last := uint64(0)
	if len(msgs) > 0 {
		last = msgs[len(msgs)-1].Seq
	}
	last = uint64(intArg(t, d, "last", int(last)))
	end := uint64(intArg(t, d, "end", int(last)))
	sc, err := h.p.StartScan(last)
	if err != nil {
		fmt.Fprintf(&h.b, "scan: %v\n", err)
		h.p.EndScan(h.now, nil, 0, err)
		return
	}
	fmt.Fprintf(&h.b, "scan from %d\n", sc.From())
	for _, m := range msgs {
		if m.Seq >= sc.From() {
			sc.Judge(m)
		}
	}
	h.p.EndScan(h.now, sc, max(end, last), nil)
}

// tail parses the messages of a scan's input.
func tail(t *testing.T, d *datadriven.TestData) []TailMsg {
	var msgs []TailMsg
	for line := range strings.SplitSeq(strings.TrimSpace(d.Input), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		seq, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || len(f) < 2 {
			t.Fatalf("%s: bad tail line %q", d.Pos, line)
		}
		m := TailMsg{Seq: seq, ID: f[1], Term: "1"}
		for _, x := range f[2:] {
			switch {
			case x == "barrier":
				m.Barrier = true
			case strings.HasPrefix(x, "term="):
				m.Term = strings.TrimPrefix(x, "term=")
			default:
				t.Fatalf("%s: bad tail field %q", d.Pos, x)
			}
		}
		msgs = append(msgs, m)
	}
	return msgs
}

// ready prints what the pipeline decided, results sorted by request.
func (h *harness) ready() {
	rd := h.p.Ready()
	var lines []string
	for _, r := range rd.Results {
		lines = append(lines, result(r))
	}
	slices.Sort(lines)
	for _, l := range lines {
		h.b.WriteString(l + "\n")
	}
	for _, c := range rd.Recoveries {
		fmt.Fprintf(&h.b, "recovery: %v\n", c)
	}
	for _, m := range rd.Late {
		fmt.Fprintf(&h.b, "late: %d %s\n", m.Seq, m.ID)
	}
	fmt.Fprintf(&h.b, "-- %s\n", h.summary())
}

// result is one line about a request's outcome.
func result(r Result[string]) string {
	name := r.Req.Payload()
	switch {
	case r.Err != nil:
		return fmt.Sprintf("failed %s: %v", name, r.Err)
	case r.Seqs != nil:
		return fmt.Sprintf("resolved %s at %v", name, r.Seqs)
	}
	return fmt.Sprintf("resolved %s from %d", name, r.First)
}

// summary is the pipeline's state in a line.
func (h *harness) summary() string {
	p := h.p
	var inflight, queue []string
	for _, u := range p.inflight {
		s := strconv.FormatUint(u.Num, 10)
		if u.failed != nil {
			s += "!"
		}
		inflight = append(inflight, s)
	}
	for _, r := range p.queue {
		queue = append(queue, r.Payload())
	}
	ph := phaseNames[p.phase]
	if p.fatal != nil {
		ph = "stopped"
	}
	s := fmt.Sprintf("%s tail=%d acked=%d in-flight=[%s] queue=[%s]", ph, p.tail, p.acked,
		strings.Join(inflight, " "), strings.Join(queue, " "))
	if d := p.Deadline(); !d.IsZero() {
		s += " next=" + signed(d.Sub(h.now))
	}
	if p.closing {
		s += " closing"
	}
	if p.Done(h.now) {
		s += " done"
	}
	if p.fatal != nil {
		s += " fatal=" + string(streamwal.CodeOf(p.fatal))
	}
	return s
}

// state prints the whole state.
func (h *harness) state() {
	p := h.p
	fmt.Fprintf(&h.b, "%s\nacked-id=%s last-id=%s refusals=%d quiet-run=%d\n", h.summary(), p.ackedID, p.lastID, p.refusals, p.quietRun)
	for _, u := range p.inflight {
		fmt.Fprintf(&h.b, "in flight %s", describe(u))
		if u.failed != nil {
			fmt.Fprintf(&h.b, " failed")
		}
		h.b.WriteString("\n")
	}
}

// phaseNames name the phases in the scripts.
var phaseNames = map[phase]string{running: "running", draining: "draining", scanning: "scanning", retrying: "retrying", pausing: "pausing"}

// intArg reads an integer argument, or def when it is absent.
func intArg(t *testing.T, d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var v int
	d.ScanArgs(t, key, &v)
	return v
}

// duration parses a duration argument.
func duration(t *testing.T, s string) time.Duration {
	v, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(errors.New("bad duration " + s))
	}
	return v
}

// signed writes a duration with its sign.
func signed(d time.Duration) string {
	if d < 0 {
		return d.String()
	}
	return "+" + d.String()
}
