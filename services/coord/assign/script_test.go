package assign

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/coord/balance"
	"github.com/streamwal/streamwal/services/wire"
)

// TestScripts runs the scripts in testdata: events in, the effects the
// machine asks for out, in the order a shell carries them out (an
// answer's effects indented under its persist). Every persist is answered
// as written unless the command says otherwise (fail=N,... fails the Nth
// persists it makes, fail=all every one; deposed fails them as refused).
// After every command the invariants must hold. Rewrite the expected
// output after a deliberate change with -rewrite.
//
// Commands (the clock starts at t0 and moves only by advance):
//
//	takeover [epoch=E] [pchannels=N] [open-timeout=D] [node-ttl=D]   (input: loaded records,
//	        "pchan-0 ASSIGNED node=n1 term=1 session=s1 version=1", and
//	        "collection <id> <vchannel>...")
//	heartbeat node=N session=S [version=V] [serving=(pchan-0:1,...)] [replayed]
//	gone node=N
//	advance d=D          move the clock
//	tick [d=D]           move the clock, then a health check
//	balance
//	confirm P node=N term=T session=S [version=V]
//	refuse P node=N term=T err=E
//	allocate id=I shards=S [name=db.c] [lookup]
//	release id=I
//	depose
//	state                the records, opens, retries and nodes
//	view                 the view as last published
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
				if err := h.m.checkInvariants(); err != nil {
					t.Fatalf("%s: invariants: %v\n%s", d.Pos, err, out)
				}
				return out
			})
		})
	}
}

// t0 is the scripts' origin of time.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// harness steps a machine and carries out its effects as the shell does.
type harness struct {
	m     *Machine
	now   time.Time
	call  uint64
	fail  map[int]bool // persists of the command under way to fail (by number)
	all   bool         // fail every persist
	depo  bool         // failures are refusals
	count int          // persists of the command so far
	b     strings.Builder
}

// run runs one command.
func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	h.b.Reset()
	h.failures(t, d)
	switch d.Cmd {
	case "takeover":
		h.takeover(t, d)
	case "advance":
		h.now = h.now.Add(h.duration(t, d, "d"))
	case "tick":
		if d.HasArg("d") {
			h.now = h.now.Add(h.duration(t, d, "d"))
		}
		h.step(HealthCheck{})
	case "heartbeat":
		h.step(h.heartbeat(t, d))
	case "gone":
		h.step(NodeGone{Node: h.node(t, d)})
	case "balance":
		h.step(Balance{})
	case "confirm":
		ev := OpenConfirmed{PChannel: h.pchannel(t, d), Node: h.node(t, d), Term: h.uint(t, d, "term"), Version: 1}
		d.ScanArgs(t, "session", &ev.Session)
		d.MaybeScanArgs(t, "version", &ev.Version)
		h.step(ev)
	case "refuse":
		var why string
		d.ScanArgs(t, "err", &why)
		h.step(OpenFailed{PChannel: h.pchannel(t, d), Node: h.node(t, d), Term: h.uint(t, d, "term"), Err: errors.New(why)})
	case "allocate":
		h.call++
		req := wire.AllocateRequest{CollectionID: int64(h.uint(t, d, "id")), Lookup: d.HasArg("lookup")}
		d.MaybeScanArgs(t, "shards", &req.Shards)
		var name string
		if d.MaybeScanArgs(t, "name", &name) {
			req.DBName, req.Name, _ = strings.Cut(name, ".")
		}
		d.MaybeScanArgs(t, "adopt", &req.Adopt)
		h.step(Allocate{Call: h.call, Request: req})
	case "release":
		h.call++
		h.step(Release{Call: h.call, CollectionID: int64(h.uint(t, d, "id"))})
	case "depose":
		h.step(Deposed{})
	case "state":
		h.state()
	case "view":
		h.view()
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
	return h.b.String()
}

// failures reads which persists of the command fail.
func (h *harness) failures(t *testing.T, d *datadriven.TestData) {
	h.fail, h.all, h.count = map[int]bool{}, false, 0
	h.depo = d.HasArg("deposed")
	if a, ok := d.Arg("fail"); ok {
		for _, v := range a.Vals {
			if v == "all" {
				h.all = true
				continue
			}
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%s: fail=%s: %v", d.Pos, v, err)
			}
			h.fail[n] = true
		}
	}
}

// takeover loads the input's records into a new machine.
func (h *harness) takeover(t *testing.T, d *datadriven.TestData) {
	cfg := Config{Epoch: 1, Leader: "coord", NodeTTL: time.Second, OpenTimeout: 2 * time.Minute,
		UnservedWarning: 10 * time.Second, Policy: balance.DefaultPolicy()}
	d.MaybeScanArgs(t, "epoch", &cfg.Epoch)
	if d.HasArg("open-timeout") {
		cfg.OpenTimeout = h.duration(t, d, "open-timeout")
	}
	if d.HasArg("node-ttl") {
		cfg.NodeTTL = h.duration(t, d, "node-ttl")
	}
	n := 4
	d.MaybeScanArgs(t, "pchannels", &n)
	ps, err := streamwal.PChannels("pchan", n)
	if err != nil {
		t.Fatal(err)
	}
	ev := Takeover{Collections: wire.Collections{Collections: map[string][]string{}}}
	records := map[streamwal.PChannel]Record{}
	for line := range strings.Lines(d.Input) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if fields[0] == "collection" {
			ev.Collections.Collections[fields[1]] = fields[2:]
			continue
		}
		p, r := parseRecord(t, fields)
		records[p] = r
	}
	for _, p := range ps {
		r, ok := records[p]
		if !ok {
			r = Record{State: streamwal.Uninitialized}
		}
		ev.Channels = append(ev.Channels, Loaded{PChannel: p, Record: r})
	}
	h.m = New(cfg)
	h.step(ev)
}

// parseRecord reads "pchan-0 STATE node=n1 term=1 session=s1 version=1
// serving error=why".
func parseRecord(t *testing.T, fields []string) (streamwal.PChannel, Record) {
	p, err := streamwal.ParsePChannel(fields[0])
	if err != nil {
		t.Fatal(err)
	}
	r := Record{State: streamwal.AssignmentState(fields[1])}
	for _, f := range fields[2:] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "node":
			r.Node = streamwal.NodeID(v)
		case "term":
			r.Term, _ = strconv.ParseUint(v, 10, 64)
		case "session":
			r.Session = v
		case "version":
			r.Version, _ = strconv.ParseUint(v, 10, 64)
		case "serving":
			r.Serving = true
		case "error":
			r.Error = v
		default:
			t.Fatalf("record field %q", f)
		}
	}
	return p, r
}

// heartbeat reads a NodeSeen.
func (h *harness) heartbeat(t *testing.T, d *datadriven.TestData) NodeSeen {
	ev := NodeSeen{Node: h.node(t, d), Serving: map[streamwal.PChannel]uint64{}, Replayed: d.HasArg("replayed")}
	d.ScanArgs(t, "session", &ev.Session)
	d.MaybeScanArgs(t, "version", &ev.Version)
	if a, ok := d.Arg("serving"); ok {
		for _, v := range a.Vals {
			name, term, _ := strings.Cut(v, ":")
			p, err := streamwal.ParsePChannel(name)
			if err != nil {
				t.Fatal(err)
			}
			ev.Serving[p], _ = strconv.ParseUint(term, 10, 64)
		}
	}
	return ev
}

func (h *harness) node(t *testing.T, d *datadriven.TestData) streamwal.NodeID {
	var n string
	d.ScanArgs(t, "node", &n)
	return streamwal.NodeID(n)
}

func (h *harness) pchannel(t *testing.T, d *datadriven.TestData) streamwal.PChannel {
	if len(d.CmdArgs) == 0 {
		t.Fatalf("%s: no pchannel", d.Pos)
	}
	p, err := streamwal.ParsePChannel(d.CmdArgs[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (h *harness) uint(t *testing.T, d *datadriven.TestData, key string) uint64 {
	var v uint64
	d.ScanArgs(t, key, &v)
	return v
}

func (h *harness) duration(t *testing.T, d *datadriven.TestData, key string) time.Duration {
	var s string
	d.ScanArgs(t, key, &s)
	v, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s: %s=%s: %v", d.Pos, key, s, err)
	}
	return v
}

// step steps ev and carries out the effects.
func (h *harness) step(ev Event) { h.carry(h.m.Step(h.now, ev), 0) }

// carry prints and carries out effects, answering persists.
func (h *harness) carry(effects []Effect, depth int) {
	for _, e := range effects {
		if line := h.format(e); line != "" {
			fmt.Fprintf(&h.b, "%s%s\n", strings.Repeat("  ", depth), line)
		}
		var rev Rev
		switch e := e.(type) {
		case PersistAssignment:
			rev = e.Rev
		case PersistCollections:
			rev = e.Rev
		case PublishView:
			rev = e.Rev
		default:
			continue
		}
		h.count++
		if h.all || h.fail[h.count] {
			fmt.Fprintf(&h.b, "%s  -> failed\n", strings.Repeat("  ", depth))
			h.carry(h.m.Step(h.now, PersistFailed{Rev: rev, Err: errors.New("write refused"), Deposed: h.depo}), depth+1)
			continue
		}
		h.carry(h.m.Step(h.now, Persisted{Rev: rev}), depth+1)
	}
}

// format is one effect's line ("" for reports, which follow every
// persisted assignment).
func (h *harness) format(e Effect) string {
	switch e := e.(type) {
	case PersistAssignment:
		return fmt.Sprintf("persist %s: %s", e.PChannel, h.record(e.Assignment))
	case PersistCollections:
		return "persist collections: " + formatCollections(e.Collections)
	case PublishView:
		return fmt.Sprintf("publish view v%d nodes=%v", e.View.Version, e.View.Nodes)
	case Fence:
		return fmt.Sprintf("fence %s term=%d", e.PChannel, e.Term)
	case Open:
		s := fmt.Sprintf("open %s on %s term=%d", e.PChannel, e.Node, e.Term)
		if e.Close != nil {
			s += fmt.Sprintf(" (close on %s term=%d first)", e.Close.Node, e.Close.Term)
		}
		return s
	case CancelOpen:
		return "cancel open " + e.PChannel.String()
	case Reply:
		return "reply " + formatReply(e)
	case Log:
		return h.formatLog(e)
	}
	return ""
}

// record is an assignment's line.
func (h *harness) record(a streamwal.Assignment) string {
	s := string(a.State)
	if a.Node != "" {
		s += " node=" + a.Node
	}
	s += fmt.Sprintf(" term=%d", a.Term)
	if a.Session != "" {
		s += fmt.Sprintf(" session=%s version=%d", a.Session, a.Version)
	}
	if a.Serving {
		s += " serving"
	}
	if a.VChannels > 0 {
		s += fmt.Sprintf(" vchannels=%d", a.VChannels)
	}
	s += " since=" + h.at(a.Since)
	if a.Error != "" {
		s += fmt.Sprintf(" error=%q", a.Error)
	}
	return s
}

// at is a time as an offset from t0.
func (h *harness) at(ts time.Time) string {
	if ts.IsZero() {
		return "never"
	}
	return "+" + ts.Sub(t0).String()
}

func formatCollections(c wire.Collections) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(c.Collections)) {
		parts = append(parts, fmt.Sprintf("%s=%v", k, c.Collections[k]))
	}
	s := fmt.Sprintf("epoch=%d cchannel=%s {%s}", c.Epoch, c.CChannel, strings.Join(parts, " "))
	if len(c.Names) > 0 {
		s += fmt.Sprintf(" names=%v", c.Names)
	}
	if len(c.Dropped) > 0 {
		s += fmt.Sprintf(" dropped=%v", c.Dropped)
	}
	return s
}

func formatReply(r Reply) string {
	switch {
	case r.Err != nil:
		return "error: " + r.Err.Error()
	case r.Allocate.Dropped:
		return "dropped"
	default:
		return fmt.Sprintf("vchannels=%v", r.Allocate.VChannels)
	}
}

func (h *harness) formatLog(l Log) string {
	s := fmt.Sprintf("log %s %q", l.Level, l.Msg)
	for _, f := range l.Fields {
		s += fmt.Sprintf(" %s=%v", f.Key, f.Value)
	}
	return s
}

// state prints the machine's records, opens, retries and nodes.
func (h *harness) state() {
	m := h.m
	for _, ch := range m.channels {
		fmt.Fprintf(&h.b, "%s: %s fence=%d", ch.p, h.record(ch.rec.Wire(ch.p, m.counts[ch.p])), ch.fence)
		if ch.opening {
			h.b.WriteString(" opening")
		}
		if !ch.retry.after.IsZero() {
			fmt.Fprintf(&h.b, " retry-after=%s", h.at(ch.retry.after))
		}
		h.b.WriteString("\n")
	}
	for _, id := range slices.Sorted(maps.Keys(m.nodes)) {
		mem := m.nodes[id]
		var serving []string
		for _, p := range slices.SortedFunc(maps.Keys(mem.serving), func(a, b streamwal.PChannel) int { return a.Index() - b.Index() }) {
			serving = append(serving, fmt.Sprintf("%s:%d", p, mem.serving[p]))
		}
		fmt.Fprintf(&h.b, "node %s: session=%q version=%d seen=%s serving=%v\n", id, mem.session, mem.version, h.at(mem.lastSeen), serving)
	}
	if m.deposed {
		h.b.WriteString("deposed\n")
	}
}

// view prints the view as last published.
func (h *harness) view() {
	v := h.m.View()
	fmt.Fprintf(&h.b, "v%d epoch=%d leader=%s cchannel=%s nodes=%v\n", v.Version, v.Epoch, v.Leader, v.CChannel, v.Nodes)
	for _, a := range v.Channels {
		fmt.Fprintf(&h.b, "%s: %s\n", a.PChannel, h.record(a))
	}
}
