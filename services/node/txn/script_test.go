package txn_test

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
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/txn"
)

// TestScripts runs the scripts in testdata: calls of the table, each
// answered with its result, and the table's state where a script asks.
// Rewrite the expected output after a deliberate change with -rewrite.
//
// TimeTicks are written from t0 (base, logical part 7): t0+5ms+2 is five
// milliseconds of TimeTick time and two logical steps after it. VChannels
// are v1 and v2 (two shards of one collection), "-" the whole PChannel.
// An error prints as its code and the package causes it matches.
//
//	begin id=I v=V at=T [ka=D] [pos=P]   (keepalive 5ms, position 10 unless given)
//	body id=I v=V at=T
//	body-done id=I [lost]
//	body-refused id=I at=T
//	begin-done id=I [lost]
//	start-commit id=I v=V at=T           ready (nothing in flight) or waiting
//	commit id=I v=V at=T
//	cancel-commit id=I
//	rollback id=I v=V at=T [message]
//	commit-failed id=I err=E
//	abort [v=V]
//	expire at=T
//	replay [from=P]                      (input: "<type> v=V at=T [id=I] [ka=D]"
//	                                      per message, at positions from P on)
//	state                                Len, Oldest, every session begun
//	reset                                a new table
//
// After every call, the committers whose wait ended are listed.
func TestScripts(t *testing.T) {
	paths, err := filepath.Glob("testdata/*.txt")
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			h := &harness{tab: txn.NewTable(), sessions: map[messages.TxnID]*txn.Session{}, waits: map[messages.TxnID]<-chan struct{}{}, next: 1}
			h.v1, h.v2 = vchannels(t)
			h.t0 = tick(t, 0, 7)
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				h.b.Reset()
				h.run(t, d)
				h.drained()
				return h.b.String()
			})
		})
	}
}

// harness runs scripts against one table.
type harness struct {
	tab      *txn.Table
	t0       messages.TimeTick
	v1, v2   streamwal.VChannel
	sessions map[messages.TxnID]*txn.Session // the latest begun under each ID
	waits    map[messages.TxnID]<-chan struct{}
	w        *wal
	next     messages.MessageID // the next replayed message's position
	b        strings.Builder
}

// run runs one command.
func (h *harness) run(t *testing.T, d *datadriven.TestData) {
	switch d.Cmd {
	case "begin":
		ka := keepalive
		if d.HasArg("ka") {
			ka = h.duration(t, d, "ka")
		}
		pos := uint64(10)
		d.MaybeScanArgs(t, "pos", &pos)
		s, err := h.tab.Begin(h.id(t, d), h.v(t, d), ka, h.at(t, d), messages.MessageID(pos))
		if err == nil {
			h.sessions[s.ID] = s
		}
		h.result(err)
	case "body":
		_, err := h.tab.Body(h.id(t, d), h.v(t, d), h.at(t, d))
		h.result(err)
	case "body-done":
		h.tab.BodyDone(h.id(t, d), !d.HasArg("lost"))
	case "body-refused":
		h.tab.BodyRefused(h.id(t, d), h.at(t, d))
	case "begin-done":
		h.tab.BeginDone(h.id(t, d), !d.HasArg("lost"))
	case "start-commit":
		h.startCommit(t, d)
	case "commit":
		n, err := h.tab.Commit(h.id(t, d), h.v(t, d), h.at(t, d))
		if err == nil {
			fmt.Fprintf(&h.b, "committed %d bodies\n", n)
			return
		}
		h.result(err)
	case "cancel-commit":
		h.tab.CancelCommit(h.id(t, d))
	case "rollback":
		err := h.tab.Rollback(h.id(t, d), h.v(t, d), h.at(t, d))
		h.result(err)
		if err != nil && d.HasArg("message") {
			fmt.Fprintf(&h.b, "message: %s\n", err)
		}
	case "commit-failed":
		var why string
		d.ScanArgs(t, "err", &why)
		h.tab.CommitFailed(h.id(t, d), streamwal.Errorf(streamwal.CodeUnknownOutcome, "%s", why))
	case "abort":
		var v streamwal.VChannel
		if d.HasArg("v") {
			v = h.v(t, d)
		}
		h.ids("aborted", h.tab.Abort(v))
	case "expire":
		h.ids("expired", h.tab.Expire(h.at(t, d)))
	case "replay":
		h.replay(t, d)
	case "state":
		h.state()
	case "reset":
		h.tab, h.sessions, h.waits = txn.NewTable(), map[messages.TxnID]*txn.Session{}, map[messages.TxnID]<-chan struct{}{}
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
}

// startCommit runs StartCommit and keeps the channel to wait on.
func (h *harness) startCommit(t *testing.T, d *datadriven.TestData) {
	id := h.id(t, d)
	ch, err := h.tab.StartCommit(id, h.v(t, d), h.at(t, d))
	switch {
	case err != nil:
		require.Nil(t, ch, "a refused StartCommit returned a channel")
		h.result(err)
	case ch == nil:
		h.b.WriteString("ready\n")
	default:
		h.waits[id] = ch
		h.b.WriteString("waiting\n")
	}
}

// drained lists (and forgets) the committers whose wait ended.
func (h *harness) drained() {
	for _, id := range slices.Sorted(maps.Keys(h.waits)) {
		select {
		case <-h.waits[id]:
			fmt.Fprintf(&h.b, "committer of %d woken\n", id)
			delete(h.waits, id)
		default:
		}
	}
}

// result prints ok or the error.
func (h *harness) result(err error) {
	if err == nil {
		h.b.WriteString("ok\n")
		return
	}
	var names []string
	for _, c := range causes {
		if errors.Is(err, c) {
			names = append(names, causeName(c))
		}
	}
	fmt.Fprintf(&h.b, "error %s %v\n", streamwal.CodeOf(err), names)
}

// causeName is a cause's short name.
func causeName(c error) string {
	switch c {
	case txn.ErrUnknown:
		return "unknown"
	case txn.ErrExpired:
		return "expired"
	case txn.ErrCommitted:
		return "committed"
	case txn.ErrRolledBack:
		return "rolled-back"
	case txn.ErrAborted:
		return "aborted"
	case txn.ErrWrongVChannel:
		return "wrong-vchannel"
	case txn.ErrDuplicate:
		return "duplicate"
	}
	return c.Error()
}

// ids prints a list of transaction IDs, sorted.
func (h *harness) ids(what string, ids []messages.TxnID) {
	fmt.Fprintf(&h.b, "%s %v\n", what, slices.Sorted(slices.Values(ids)))
}

// state prints Len, Oldest and every session begun, live or not.
func (h *harness) state() {
	fmt.Fprintf(&h.b, "len=%d", h.tab.Len())
	if at, ok := h.tab.Oldest(); ok {
		fmt.Fprintf(&h.b, " oldest=%d", at)
	} else {
		h.b.WriteString(" oldest=none")
	}
	h.b.WriteString("\n")
	for _, id := range slices.Sorted(maps.Keys(h.sessions)) {
		s := h.sessions[id]
		live := "gone"
		if got, ok := h.tab.Get(id); ok {
			if got != s {
				live = "replaced"
			} else {
				live = "live"
			}
		}
		fmt.Fprintf(&h.b, "txn %d (%s): %s on %s ka=%v begin=%d last=%s deadline=%s bodies=%d in-flight=%d\n",
			id, live, s.State, h.vname(s.VChannel), s.Keepalive, s.Begin, h.fmt(s.LastActivity), h.fmt(s.Deadline()), s.Bodies, s.InFlight)
	}
}

// replay replays the input's messages.
func (h *harness) replay(t *testing.T, d *datadriven.TestData) {
	var from uint64
	if d.MaybeScanArgs(t, "from", &from) {
		h.next = messages.MessageID(from)
	}
	if h.w == nil {
		h.w = newWAL(t, h.next)
	}
	h.w.next = h.next
	for line := range strings.Lines(d.Input) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		typ := replayTypes[fields[0]]
		if typ == nil {
			t.Fatalf("%s: unknown message type %q", d.Pos, fields[0])
		}
		var (
			v  streamwal.VChannel
			tt messages.TimeTick
			tc *messages.TxnContext
		)
		for _, f := range fields[1:] {
			k, val, _ := strings.Cut(f, "=")
			switch k {
			case "v":
				v = h.vchannel(t, val)
			case "at":
				tt = h.parse(t, val)
			case "id":
				id, err := strconv.ParseUint(val, 10, 64)
				require.NoError(t, err)
				if tc == nil {
					tc = &messages.TxnContext{Keepalive: keepalive}
				}
				tc.ID = messages.TxnID(id)
			case "ka":
				ka, err := time.ParseDuration(val)
				require.NoError(t, err)
				if tc == nil {
					tc = &messages.TxnContext{}
				}
				tc.Keepalive = ka
			default:
				t.Fatalf("%s: %q", d.Pos, f)
			}
		}
		m := h.w.msg(typ, v, tt, tc)
		if typ == messages.TypeBeginTxn {
			defer h.keep(tc.ID)
		}
		h.tab.Replay(m)
		h.next = h.w.next
	}
}

// keep remembers the session a replayed BeginTxn opened, for state.
func (h *harness) keep(id messages.TxnID) {
	if s, ok := h.tab.Get(id); ok {
		h.sessions[id] = s
	}
}

// replayTypes are the message types a replay script names.
var replayTypes = map[string]*messages.Type{
	"begin": messages.TypeBeginTxn, "commit": messages.TypeCommitTxn, "rollback": messages.TypeRollbackTxn,
	"insert": messages.TypeInsert, "delete": messages.TypeDelete, "upsert": messages.TypeUpsert,
	"timetick": messages.TypeTimeTick, "create-collection": messages.TypeCreateCollection,
	"manual-flush": messages.TypeManualFlush, "flush-all": messages.TypeFlushAll, "alter-wal": messages.TypeAlterWAL,
}

func (h *harness) id(t *testing.T, d *datadriven.TestData) messages.TxnID {
	var id uint64
	d.ScanArgs(t, "id", &id)
	return messages.TxnID(id)
}

func (h *harness) v(t *testing.T, d *datadriven.TestData) streamwal.VChannel {
	var s string
	d.ScanArgs(t, "v", &s)
	return h.vchannel(t, s)
}

// vchannel reads v1, v2, or - (none: the PChannel).
func (h *harness) vchannel(t *testing.T, s string) streamwal.VChannel {
	switch s {
	case "v1":
		return h.v1
	case "v2":
		return h.v2
	case "-":
		return streamwal.VChannel{}
	}
	t.Fatalf("vchannel %q", s)
	return streamwal.VChannel{}
}

func (h *harness) vname(v streamwal.VChannel) string {
	switch v {
	case h.v1:
		return "v1"
	case h.v2:
		return "v2"
	}
	return v.String()
}

func (h *harness) at(t *testing.T, d *datadriven.TestData) messages.TimeTick {
	var s string
	d.ScanArgs(t, "at", &s)
	return h.parse(t, s)
}

func (h *harness) duration(t *testing.T, d *datadriven.TestData, key string) time.Duration {
	var s string
	d.ScanArgs(t, key, &s)
	v, err := time.ParseDuration(s)
	require.NoError(t, err)
	return v
}

// parse reads "t0", "t0+5ms", "t0+2" or "t0+5ms+2".
func (h *harness) parse(t *testing.T, s string) messages.TimeTick {
	rest, ok := strings.CutPrefix(s, "t0")
	if !ok {
		t.Fatalf("TimeTick %q: want t0[+<n>ms][+<logical>]", s)
	}
	tt := h.t0
	for rest != "" {
		var part string
		part, rest, _ = strings.Cut(strings.TrimPrefix(rest, "+"), "+")
		if n, ok := strings.CutSuffix(part, "ms"); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			require.NoError(t, err)
			tt += ms(v)
			continue
		}
		v, err := strconv.ParseUint(part, 10, 64)
		require.NoError(t, err, "TimeTick %q", s)
		tt += messages.TimeTick(v)
	}
	return tt
}

// fmt writes a TimeTick as parse reads it.
func (h *harness) fmt(tt messages.TimeTick) string {
	d := tt - h.t0
	s := "t0"
	if whole := d >> messages.LogicalBits; whole > 0 {
		s += fmt.Sprintf("+%dms", whole)
	}
	if logical := d & messages.MaxLogical; logical > 0 {
		s += fmt.Sprintf("+%d", logical)
	}
	return s
}
