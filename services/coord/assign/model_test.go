package assign

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/coord/balance"
	"github.com/streamwal/streamwal/services/wire"
)

// TestMachineModel drives the machine with random events against fake
// nodes (which serve what they confirmed, restart under new sessions,
// die and leave), random persist failures, allocations and time, and
// checks after every step the invariants and what the coordinator
// promises its nodes:
//   - an open is sent only once its ASSIGNING record (that node, that
//     term) is persisted, and after the fence was raised to its term;
//   - a PChannel's opens are under strictly increasing terms, and a term
//     is never persisted for two owners;
//   - a record persisted as served names a live node, under its current
//     session;
//   - a deposed machine sends no open.
func TestMachineModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := newWorld(t)
		w.takeover()
		for range rapid.IntRange(1, 60).Draw(t, "steps") {
			w.act()
			if err := w.m.checkInvariants(); err != nil {
				t.Fatalf("invariants: %v", err)
			}
		}
	})
}

// world is the machine with fake nodes around it.
type world struct {
	t        *rapid.T
	m        *Machine
	now      time.Time
	ps       []streamwal.PChannel
	nodes    map[streamwal.NodeID]*fakeNode
	sessions int
	opens    []*pendingOpen
	failRate int // percent of persists that fail
	call     uint64
	// what the world saw
	persisted map[streamwal.PChannel]Record // last persisted record
	fences    map[streamwal.PChannel]uint64
	lastOpen  map[streamwal.PChannel]uint64
	owners    map[streamwal.PChannel]map[uint64]streamwal.NodeID // term -> owner ever persisted
}

// fakeNode is a node as the world runs it.
type fakeNode struct {
	session string
	version uint64
	serving map[streamwal.PChannel]uint64
	alive   bool // heartbeats
}

// pendingOpen is an open sent and not answered.
type pendingOpen struct {
	Open
	session   string // the node's session when it was sent
	cancelled bool
}

func newWorld(t *rapid.T) *world {
	return &world{t: t, now: t0, nodes: map[streamwal.NodeID]*fakeNode{}, failRate: rapid.IntRange(0, 20).Draw(t, "failRate"),
		persisted: map[streamwal.PChannel]Record{}, fences: map[streamwal.PChannel]uint64{}, lastOpen: map[streamwal.PChannel]uint64{},
		owners: map[streamwal.PChannel]map[uint64]streamwal.NodeID{}}
}

// takeover starts the machine on a fresh cluster.
func (w *world) takeover() {
	policy := balance.DefaultPolicy()
	policy.MaxMoves = rapid.IntRange(0, 3).Draw(w.t, "maxMoves")
	w.m = New(Config{Epoch: 1, Leader: "c", NodeTTL: time.Second, OpenTimeout: 3 * time.Second, UnservedWarning: 2 * time.Second, Policy: policy})
	var err error
	w.ps, err = streamwal.PChannels("p", rapid.IntRange(1, 5).Draw(w.t, "pchannels"))
	if err != nil {
		w.t.Fatal(err)
	}
	ev := Takeover{}
	for _, p := range w.ps {
		ev.Channels = append(ev.Channels, Loaded{PChannel: p, Record: Record{State: streamwal.Uninitialized}})
	}
	saved := w.failRate
	w.failRate = 0
	w.step(ev)
	w.failRate = saved
}

// act takes one random action.
func (w *world) act() {
	ids := []streamwal.NodeID{"n1", "n2", "n3"}
	switch rapid.IntRange(0, 9).Draw(w.t, "action") {
	case 0, 1:
		w.heartbeat(rapid.SampledFrom(ids).Draw(w.t, "node"), false)
	case 2:
		w.heartbeat(rapid.SampledFrom(ids).Draw(w.t, "node"), true)
	case 3:
		id := rapid.SampledFrom(ids).Draw(w.t, "node")
		if n := w.nodes[id]; n != nil {
			n.alive = false
			if rapid.Bool().Draw(w.t, "leave") {
				w.step(NodeGone{Node: id})
			}
		}
	case 4:
		w.now = w.now.Add(time.Duration(rapid.IntRange(0, 1500).Draw(w.t, "ms")) * time.Millisecond)
		for id, n := range w.nodes {
			if n.alive && rapid.Bool().Draw(w.t, "beat") {
				w.heartbeat(id, false)
			}
		}
		w.step(HealthCheck{})
	case 5, 6:
		w.answer()
	case 7:
		w.step(Balance{})
	case 8:
		w.call++
		if rapid.Bool().Draw(w.t, "release") {
			w.step(Release{Call: w.call, CollectionID: rapid.Int64Range(1, 4).Draw(w.t, "collection")})
		} else {
			w.step(Allocate{Call: w.call, Request: wire.AllocateRequest{CollectionID: rapid.Int64Range(1, 4).Draw(w.t, "collection"),
				Shards: rapid.IntRange(1, len(w.ps)).Draw(w.t, "shards")}})
		}
	case 9:
		if rapid.IntRange(0, 20).Draw(w.t, "depose") == 0 {
			w.step(Deposed{})
		}
	}
}

// heartbeat has node id heartbeat, in a new session when restart.
func (w *world) heartbeat(id streamwal.NodeID, restart bool) {
	n := w.nodes[id]
	if n == nil || restart {
		w.sessions++
		n = &fakeNode{session: fmt.Sprintf("s%d", w.sessions), serving: map[streamwal.PChannel]uint64{}}
		w.nodes[id] = n
	}
	n.alive = true
	if len(n.serving) > 0 && rapid.IntRange(0, 9).Draw(w.t, "drop") == 0 {
		delete(n.serving, rapid.SampledFrom(slices.Collect(maps.Keys(n.serving))).Draw(w.t, "dropped"))
		n.version++
	}
	w.step(NodeSeen{Node: id, Session: n.session, Version: n.version, Serving: maps.Clone(n.serving)})
}

// answer answers an open sent: the node confirms it (most of the time,
// sometimes even when it was cancelled, or by an incarnation since
// replaced) or refuses it.
func (w *world) answer() {
	if len(w.opens) == 0 {
		return
	}
	i := rapid.IntRange(0, len(w.opens)-1).Draw(w.t, "open")
	o := w.opens[i]
	w.opens = slices.Delete(w.opens, i, i+1)
	n := w.nodes[o.Node]
	// A cancelled open may still be confirmed: the cancel raced it.
	if o.cancelled && rapid.Bool().Draw(w.t, "cancelled") || n == nil || rapid.IntRange(0, 4).Draw(w.t, "refuse") == 0 {
		w.step(OpenFailed{PChannel: o.PChannel, Node: o.Node, Term: o.Term, Err: errors.New("refused")})
		return
	}
	if n.session == o.session {
		n.serving[o.PChannel] = o.Term
		n.version++
	}
	w.step(OpenConfirmed{PChannel: o.PChannel, Node: o.Node, Term: o.Term, Session: o.session, Version: n.version})
}

// step steps ev and carries out the effects.
func (w *world) step(ev Event) { w.carry(w.m.Step(w.now, ev)) }

// carry carries out effects, checking each against what came before.
func (w *world) carry(effects []Effect) {
	for _, e := range effects {
		switch e := e.(type) {
		case PersistAssignment:
			w.persist(e)
		case PersistCollections:
			w.answerPersist(e.Rev, nil)
		case PublishView:
			w.answerPersist(e.Rev, nil)
		case Fence:
			if e.Term < w.fences[e.PChannel] {
				w.t.Fatalf("fence of %s lowered from %d to %d", e.PChannel, w.fences[e.PChannel], e.Term)
			}
			w.fences[e.PChannel] = e.Term
		case Open:
			w.open(e)
		case CancelOpen:
			for _, o := range w.opens {
				if o.PChannel == e.PChannel {
					o.cancelled = true
				}
			}
		}
	}
}

// persist checks and answers an assignment's persist.
func (w *world) persist(e PersistAssignment) {
	_, r, err := FromWire(e.Assignment)
	if err != nil {
		w.t.Fatal(err)
	}
	if r.Term > w.fences[e.PChannel] {
		w.t.Fatalf("%s persisted under term %d above its fence %d", e.PChannel, r.Term, w.fences[e.PChannel])
	}
	if r.Serving {
		mem := w.m.nodes[r.Node]
		if mem == nil || mem.session != "" && mem.session != r.Session {
			w.t.Fatalf("%s persisted as served by %s in %q, not a live member (%+v)", e.PChannel, r.Node, r.Session, mem)
		}
	}
	w.answerPersist(e.Rev, func() {
		w.persisted[e.PChannel] = r
		if r.Node == "" {
			return
		}
		if w.owners[e.PChannel] == nil {
			w.owners[e.PChannel] = map[uint64]streamwal.NodeID{}
		}
		if had, ok := w.owners[e.PChannel][r.Term]; ok && had != r.Node {
			w.t.Fatalf("%s term %d persisted for %s and %s", e.PChannel, r.Term, had, r.Node)
		}
		w.owners[e.PChannel][r.Term] = r.Node
	})
}

// answerPersist answers persist rev, failing it at the world's rate;
// persisted runs before the answer when it succeeds.
func (w *world) answerPersist(rev Rev, persisted func()) {
	if rapid.IntRange(0, 99).Draw(w.t, "fail") < w.failRate {
		w.carry(w.m.Step(w.now, PersistFailed{Rev: rev, Err: errors.New("unavailable")}))
		return
	}
	if persisted != nil {
		persisted()
	}
	w.carry(w.m.Step(w.now, Persisted{Rev: rev}))
}

// open checks an open against what was persisted, and sends it.
func (w *world) open(o Open) {
	if w.m.deposed {
		w.t.Fatalf("deposed, yet %s opened on %s", o.PChannel, o.Node)
	}
	r := w.persisted[o.PChannel]
	if r.State != streamwal.Assigning || r.Node != o.Node || r.Term != o.Term {
		w.t.Fatalf("open %+v, but %s is persisted as %+v", o, o.PChannel, r)
	}
	if o.Term <= w.lastOpen[o.PChannel] || o.Term > w.fences[o.PChannel] {
		w.t.Fatalf("open %+v after an open under term %d, fence %d", o, w.lastOpen[o.PChannel], w.fences[o.PChannel])
	}
	w.lastOpen[o.PChannel] = o.Term
	n := w.nodes[o.Node]
	w.opens = append(w.opens, &pendingOpen{Open: o, session: n.session})
}
