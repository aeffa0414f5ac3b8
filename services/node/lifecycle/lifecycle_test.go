package lifecycle_test

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/lifecycle"
)

// builder makes the messages of the tests.
type builder struct {
	t  require.TestingT
	c  *messages.Codec
	p  streamwal.PChannel
	cc streamwal.VChannel
	// vs are p-0_42v0, p-0_42v1 and p-0_43v0: two shards of one collection
	// and a shard of another.
	vs []streamwal.VChannel
	// vector is an application DML type (FlagTxnBody); note an application
	// type that is not DML.
	vector, note *messages.Type
	next         messages.MessageID
}

func newBuilder(t require.TestingT) *builder {
	reg := messages.NewRegistry()
	vector, err := reg.Register(messages.TypeSpec{Name: "Vector", Dispatch: messages.DispatchVChannel, Lock: messages.SharedVChannelLock, Flags: messages.FlagTxnBody})
	require.NoError(t, err)
	note, err := reg.Register(messages.TypeSpec{Name: "Note", Dispatch: messages.DispatchVChannel})
	require.NoError(t, err)
	c, err := messages.NewCodec("test", reg)
	require.NoError(t, err)
	p, err := streamwal.NewPChannel("p", 0)
	require.NoError(t, err)
	b := &builder{t: t, c: c, p: p, cc: p.CChannel(), vector: vector, note: note}
	for _, sh := range []struct {
		coll  int64
		shard int
	}{{42, 0}, {42, 1}, {43, 0}} {
		v, err := p.VChannel(sh.coll, sh.shard)
		require.NoError(t, err)
		b.vs = append(b.vs, v)
	}
	return b
}

func msgID(id string) []messages.Option {
	if id == "" {
		return nil
	}
	return []messages.Option{messages.WithMsgID(id)}
}

func (b *builder) ref(v streamwal.VChannel) messages.CollectionRef {
	return messages.CollectionRef{DBName: "db", CollectionName: "c", CollectionID: v.CollectionID()}
}

func (b *builder) body(t *messages.Type, v streamwal.VChannel, body any, opts ...messages.Option) *messages.MutableMessage {
	m, err := b.c.NewBody(t, v, body, opts...)
	require.NoError(b.t, err)
	return m
}

func (b *builder) create(v streamwal.VChannel, id string, pids ...int64) *messages.MutableMessage {
	return b.body(messages.TypeCreateCollection, v, messages.CreateCollectionBody{CollectionRef: b.ref(v), PartitionIDs: pids, VChannels: []string{v.String()}}, msgID(id)...)
}

func (b *builder) drop(v streamwal.VChannel, id string) *messages.MutableMessage {
	return b.body(messages.TypeDropCollection, v, messages.DropCollectionBody{CollectionRef: b.ref(v)}, msgID(id)...)
}

func (b *builder) part(t *messages.Type, v streamwal.VChannel, pid int64) *messages.MutableMessage {
	return b.body(t, v, messages.PartitionBody{CollectionRef: b.ref(v), PartitionID: pid})
}

func (b *builder) dml(t *messages.Type, v streamwal.VChannel, pid int64) *messages.MutableMessage {
	m, err := b.c.New(t, v, []byte("rows"), messages.WithDML(pid, 1))
	require.NoError(b.t, err)
	return m
}

func (b *builder) plain(t *messages.Type, v streamwal.VChannel) *messages.MutableMessage {
	m, err := b.c.New(t, v, nil)
	require.NoError(b.t, err)
	return m
}

// land checks and applies m, which must be accepted.
func (b *builder) land(tab *lifecycle.Table, m *messages.MutableMessage) {
	require.NoError(b.t, tab.Check(m))
	b.next++
	require.NoError(b.t, tab.Apply(m.Freeze(b.next)))
}

// states snapshots the state of every VChannel of the builder.
func (b *builder) states(tab *lifecycle.Table) []lifecycle.State {
	var out []lifecycle.State
	for _, v := range append([]streamwal.VChannel{b.cc}, b.vs...) {
		out = append(out, tab.State(v))
	}
	return out
}

// requireRefusal checks a lifecycle refusal: the code, the sentinel.
func requireRefusal(t require.TestingT, err, sentinel error) {
	require.Error(t, err)
	require.ErrorIs(t, err, streamwal.ErrLifecycle)
	require.Equal(t, streamwal.CodeLifecycle, streamwal.CodeOf(err))
	require.ErrorIs(t, err, sentinel)
}

func (b *builder) mustPChannel(t *messages.Type, body any) *messages.MutableMessage {
	m, err := b.c.NewPChannelBody(t, b.p, body)
	require.NoError(b.t, err)
	return m
}

// model is the rules restated independently, one VChannel at a time.
type model struct {
	created, dropped     bool
	createdBy, droppedBy string
	live, gone           map[int64]bool
}

// op is one random step of the property test.
type op struct {
	kind string // create, drop, cpart, dpart, dml, other, exempt
	v    int
	id   string
	pids []int64
	pid  int64
	typ  *messages.Type
}

// expect returns the model's verdict on o: nil, a sentinel of the package,
// or streamwal.ErrInvalidArgument for a malformed body.
func (s *model) expect(o op) error {
	if o.kind == "exempt" {
		return nil
	}
	if s.dropped {
		if o.kind == "drop" && o.id != "" && o.id == s.droppedBy {
			return nil
		}
		return lifecycle.ErrCollectionDropped
	}
	if o.kind == "create" {
		if s.created && (o.id == "" || o.id != s.createdBy) {
			return lifecycle.ErrCollectionExists
		}
		seen := map[int64]bool{}
		for _, p := range o.pids {
			if seen[p] {
				return streamwal.ErrInvalidArgument
			}
			seen[p] = true
		}
		return nil
	}
	if !s.created {
		return lifecycle.ErrCollectionNotFound
	}
	if (o.kind == "cpart" || o.kind == "dpart") && o.pid <= 0 {
		return streamwal.ErrInvalidArgument
	}
	switch {
	case o.kind == "cpart" && s.live[o.pid]:
		return lifecycle.ErrPartitionExists
	case o.kind == "cpart" && s.gone[o.pid]:
		return lifecycle.ErrPartitionDropped
	case o.kind == "dpart" || o.kind == "dml" && o.pid > 0:
		switch {
		case s.live[o.pid]:
			return nil
		case s.gone[o.pid]:
			return lifecycle.ErrPartitionDropped
		default:
			return lifecycle.ErrPartitionNotFound
		}
	}
	return nil
}

// apply records an accepted op.
func (s *model) apply(o op) {
	switch o.kind {
	case "create":
		if !s.created {
			s.created, s.createdBy = true, o.id
			s.live, s.gone = map[int64]bool{}, map[int64]bool{}
			for _, p := range o.pids {
				s.live[p] = true
			}
		}
	case "drop":
		if !s.dropped {
			s.dropped, s.droppedBy = true, o.id
			s.live, s.gone = nil, nil
		}
	case "cpart":
		s.live[o.pid] = true
	case "dpart":
		delete(s.live, o.pid)
		s.gone[o.pid] = true
	}
}

func (s *model) state() lifecycle.State {
	st := lifecycle.State{Created: s.created, Dropped: s.dropped}
	if len(s.live) > 0 {
		st.Partitions = slices.Sorted(maps.Keys(s.live))
	}
	return st
}

// TestTableModel drives the table with random collection and partition DDL,
// DML and exempt messages over three VChannels, applying only what Check
// accepts, and checks after every step that Check's verdict is the model's,
// that Check changed nothing, that Apply accepts what Check accepted, and
// that every VChannel's state is the model's.
func TestTableModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := newBuilder(t)
		tab := lifecycle.NewTable()
		models := make([]*model, len(b.vs))
		for i := range models {
			models[i] = &model{}
		}
		ids := rapid.SampledFrom([]string{"", "m1", "m2"})
		pid := rapid.SampledFrom([]int64{1, 2, 3, 4, 5, 6, 0, -1}) // <= 0: no partition (DML), malformed (DDL)
		dmlTypes := rapid.SampledFrom([]*messages.Type{messages.TypeInsert, messages.TypeDelete, messages.TypeUpsert, b.vector})
		// Weighted so that collections usually live long enough for
		// partition churn; drops are rare.
		kinds := rapid.SampledFrom([]string{"create", "create", "drop", "cpart", "cpart", "cpart", "dpart", "dpart",
			"dml", "dml", "dml", "dml", "other", "exempt"})
		for range rapid.IntRange(1, 120).Draw(t, "steps") {
			o := op{
				kind: kinds.Draw(t, "kind"),
				v:    rapid.IntRange(0, len(b.vs)-1).Draw(t, "v"),
			}
			v := b.vs[o.v]
			var m *messages.MutableMessage
			switch o.kind {
			case "create":
				o.id = ids.Draw(t, "id")
				o.pids = rapid.SliceOfNDistinct(rapid.Int64Range(1, 4), 0, 3, rapid.ID).Draw(t, "pids")
				if len(o.pids) > 0 && rapid.IntRange(0, 9).Draw(t, "dup") == 0 {
					o.pids = append(o.pids, o.pids[0])
				}
				m = b.create(v, o.id, o.pids...)
			case "drop":
				if rapid.IntRange(0, 2).Draw(t, "really") > 0 {
					continue
				}
				o.id = ids.Draw(t, "id")
				m = b.drop(v, o.id)
			case "cpart":
				o.pid = pid.Draw(t, "pid")
				m = b.part(messages.TypeCreatePartition, v, o.pid)
			case "dpart":
				o.pid = pid.Draw(t, "pid")
				m = b.part(messages.TypeDropPartition, v, o.pid)
			case "dml":
				o.pid, o.typ = pid.Draw(t, "pid"), dmlTypes.Draw(t, "type")
				m = b.dml(o.typ, v, o.pid)
			case "other":
				m = b.body(messages.TypeAlterCollection, v, messages.AlterCollectionBody{CollectionRef: b.ref(v)})
			case "exempt":
				m = rapid.SampledFrom([]*messages.MutableMessage{
					b.mustPChannel(messages.TypeTimeTick, messages.TimeTickBody{}),
					b.drop(b.cc, ""),
					b.part(messages.TypeDropPartition, b.cc, 1),
				}).Draw(t, "exempt")
			}
			want := models[o.v].expect(o)
			before := b.states(tab)
			err := tab.Check(m)
			require.Equal(t, before, b.states(tab), "Check changed the table")
			switch {
			case want == nil:
				require.NoError(t, err, "%+v", o)
				b.next++
				require.NoError(t, tab.Apply(m.Freeze(b.next)), "%+v", o)
				if o.kind != "exempt" {
					models[o.v].apply(o)
				}
			case errors.Is(want, streamwal.ErrInvalidArgument):
				require.Equal(t, streamwal.CodeInvalidArgument, streamwal.CodeOf(err), "%+v: %v", o, err)
			default:
				requireRefusal(t, err, want)
			}
			for i, mv := range models {
				require.Equal(t, mv.state(), tab.State(b.vs[i]), "state of %s after %+v", b.vs[i], o)
			}
			if rapid.IntRange(0, 4).Draw(t, "restore") == 0 {
				// Recovery storage: a table restored from its export goes
				// on checking and applying exactly as the original.
				restored := lifecycle.NewTable()
				require.NoError(t, restored.Restore(tab.Export()))
				require.Equal(t, tab.Export(), restored.Export())
				tab = restored
			}
		}
	})
}

// TestRestoreRefusesBadRecords: a record without a VChannel, or with a
// partition both live and dropped, is refused and changes nothing.
func TestRestoreRefusesBadRecords(t *testing.T) {
	b := newBuilder(t)
	tab := lifecycle.NewTable()
	b.land(tab, b.create(b.vs[0], "c", 1, 2))
	before := tab.Export()
	for _, bad := range [][]lifecycle.Record{
		{{Created: true}},
		{{VChannel: b.vs[1], Created: true, Partitions: []int64{3}, Gone: []int64{3}}},
	} {
		err := tab.Restore(bad)
		require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
		require.Equal(t, before, tab.Export())
	}
}

// BenchmarkCheckInsert measures the hot path: DML into a live partition.
func BenchmarkCheckInsert(bm *testing.B) {
	b := newBuilder(bm)
	v := b.vs[0]
	tab := lifecycle.NewTable()
	b.land(tab, b.create(v, "", 1, 2, 3))
	m := b.dml(messages.TypeInsert, v, 2)
	bm.ReportAllocs()
	for bm.Loop() {
		if err := tab.Check(m); err != nil {
			bm.Fatal(err)
		}
	}
}
