package lifecycle_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/lifecycle"
)

// TestScripts runs the scripts in testdata: messages checked, landed
// (checked, then applied) or applied alone, each answered with its
// verdict, and the table's state where a script asks. Check must never
// change the table; the harness fails the script if it does. Rewrite the
// expected output after a deliberate change with -rewrite.
//
//	check <message>    Check's verdict (twice: the same both times)
//	land <message>     Check, then Apply of what it accepted
//	apply <message>    Apply alone (a message that landed unchecked)
//	state              the state of cc, v, w and x
//	reset              a new table
//
// A message is a kind and its arguments, on v (p-0_42v0), w (p-0_42v1),
// x (p-0_43v0) or cc (the CChannel):
//
//	create on=V [id=M] [parts=(1,2)] [other]     CreateCollection (other: naming collection 43)
//	drop on=V [id=M]                             DropCollection
//	create-partition on=V pid=P [other]          CreatePartition
//	drop-partition on=V pid=P                    DropPartition
//	insert|delete|upsert|vector|note on=V [pid=P]   DML (vector: application DML; note: an application
//	                                             type that is not DML); without pid, no DML header
//	alter|truncate|manual-flush|flush|create-index|create-database on=V
//	timetick|barrier|flush-all                   PChannel-level
//	nil                                          no message
//
// A refusal prints its code and message, the sentinels it matches and
// the reason that crosses the request hop.
func TestScripts(t *testing.T) {
	paths, err := filepath.Glob("testdata/*.txt")
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			b := newBuilder(t)
			h := &script{b: b, tab: lifecycle.NewTable()}
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				b.t = t
				return h.run(t, d)
			})
		})
	}
}

// script runs scripts against one table.
type script struct {
	b   *builder
	tab *lifecycle.Table
}

// run runs one command.
func (h *script) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "check":
		m := h.message(t, d)
		err := h.check(t, m)
		require.Equal(t, verdict(err), verdict(h.check(t, m)), "a second Check answers otherwise")
		return verdict(err)
	case "land":
		m := h.message(t, d)
		if err := h.check(t, m); err != nil {
			return verdict(err)
		}
		return "landed: " + verdict(h.apply(m))
	case "apply":
		return verdict(h.apply(h.message(t, d)))
	case "state":
		var out strings.Builder
		for i, v := range append([]streamwal.VChannel{h.b.cc}, h.b.vs...) {
			s := h.tab.State(v)
			parts := fmt.Sprint(s.Partitions)
			if s.Partitions == nil {
				parts = "nil"
			}
			fmt.Fprintf(&out, "%s: created=%t dropped=%t partitions=%s\n", []string{"cc", "v", "w", "x"}[i], s.Created, s.Dropped, parts)
		}
		return out.String()
	case "reset":
		h.tab = lifecycle.NewTable()
		return ""
	}
	t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return ""
}

// check runs Check, which must change nothing.
func (h *script) check(t *testing.T, m *messages.MutableMessage) error {
	before := h.b.states(h.tab)
	err := h.tab.Check(m)
	require.Equal(t, before, h.b.states(h.tab), "Check changed the table")
	return err
}

// apply runs Apply on m frozen at the next position.
func (h *script) apply(m *messages.MutableMessage) error {
	if m == nil {
		return h.tab.Apply(nil)
	}
	h.b.next++
	return h.tab.Apply(m.Freeze(h.b.next))
}

// sentinels are the package's causes, by name.
var sentinels = []struct {
	name string
	err  error
}{
	{"collection-not-found", lifecycle.ErrCollectionNotFound}, {"collection-exists", lifecycle.ErrCollectionExists},
	{"collection-dropped", lifecycle.ErrCollectionDropped}, {"partition-not-found", lifecycle.ErrPartitionNotFound},
	{"partition-exists", lifecycle.ErrPartitionExists}, {"partition-dropped", lifecycle.ErrPartitionDropped},
}

// verdict is ok, or the error with the sentinels it matches and its
// reason.
func verdict(err error) string {
	if err == nil {
		return "ok"
	}
	var names []string
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			names = append(names, s.name)
		}
	}
	out := fmt.Sprintf("refused %v", names)
	if errors.Is(err, streamwal.ErrLifecycle) {
		out += " lifecycle"
	}
	if r := streamwal.ReasonOf(err); r != "" {
		out += " reason=" + string(r)
	}
	return out + "\n" + err.Error()
}

// message builds the message the command names.
func (h *script) message(t *testing.T, d *datadriven.TestData) *messages.MutableMessage {
	b := h.b
	if len(d.CmdArgs) == 0 {
		t.Fatalf("%s: no message", d.Pos)
	}
	kind := d.CmdArgs[0].Key
	if kind == "nil" {
		return nil
	}
	if m := h.pchannelLevel(kind); m != nil {
		return m
	}
	var on, id string
	d.ScanArgs(t, "on", &on)
	d.MaybeScanArgs(t, "id", &id)
	v := h.vchannel(t, on)
	var pid int64
	hasPID := d.MaybeScanArgs(t, "pid", &pid)
	ref := b.ref(v)
	if d.HasArg("other") {
		ref = messages.CollectionRef{CollectionID: 43}
	}
	switch kind {
	case "create":
		var parts []int64
		if a, ok := d.Arg("parts"); ok {
			for i := range a.Vals {
				var p int64
				a.Scan(t, i, &p)
				parts = append(parts, p)
			}
		}
		return b.body(messages.TypeCreateCollection, v, messages.CreateCollectionBody{CollectionRef: ref, PartitionIDs: parts, VChannels: []string{v.String()}}, msgID(id)...)
	case "drop":
		return b.drop(v, id)
	case "create-partition":
		return b.body(messages.TypeCreatePartition, v, messages.PartitionBody{CollectionRef: ref, PartitionID: pid})
	case "drop-partition":
		return b.body(messages.TypeDropPartition, v, messages.PartitionBody{CollectionRef: ref, PartitionID: pid})
	case "insert", "delete", "upsert", "vector", "note":
		typ := map[string]*messages.Type{"insert": messages.TypeInsert, "delete": messages.TypeDelete, "upsert": messages.TypeUpsert,
			"vector": b.vector, "note": b.note}[kind]
		if !hasPID {
			return b.plain(typ, v)
		}
		return b.dml(typ, v, pid)
	case "alter":
		return b.body(messages.TypeAlterCollection, v, messages.AlterCollectionBody{CollectionRef: ref})
	case "truncate":
		return b.body(messages.TypeTruncateCollection, v, messages.TruncateCollectionBody{CollectionRef: ref})
	case "manual-flush":
		return b.body(messages.TypeManualFlush, v, messages.ManualFlushBody{CollectionID: v.CollectionID()})
	case "flush":
		return b.body(messages.TypeFlush, v, messages.FlushBody{CollectionID: v.CollectionID()})
	case "create-index":
		return b.plain(messages.TypeCreateIndex, v)
	case "create-database":
		return b.plain(messages.TypeCreateDatabase, v)
	}
	t.Fatalf("%s: unknown message %q", d.Pos, kind)
	return nil
}

// pchannelLevel is the PChannel-level message kind names, if it is one.
func (h *script) pchannelLevel(kind string) *messages.MutableMessage {
	switch kind {
	case "timetick":
		return h.b.mustPChannel(messages.TypeTimeTick, messages.TimeTickBody{})
	case "barrier":
		return h.b.mustPChannel(messages.TypeRecoveryBarrier, messages.RecoveryBarrierBody{Term: 1})
	case "flush-all":
		return h.b.mustPChannel(messages.TypeFlushAll, messages.FlushAllBody{})
	}
	return nil
}

// vchannel reads v, w, x or cc.
func (h *script) vchannel(t *testing.T, name string) streamwal.VChannel {
	switch name {
	case "cc":
		return h.b.cc
	case "v":
		return h.b.vs[0]
	case "w":
		return h.b.vs[1]
	case "x":
		return h.b.vs[2]
	}
	t.Fatalf("vchannel %q: want v, w, x or cc", name)
	return streamwal.VChannel{}
}
