package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/read"
	"github.com/streamwal/streamwal/services/wire"
)

// The broadcast tests below drive the coordinator's broadcaster (package
// services/coord/broadcast) over its request subjects only, and check
// what landed by reading every target back through the read pipeline.
// The database of every collection they create is bcDB.
const bcDB = "db"

// TestBroadcastConflictingOrderAndConcurrency: broadcasts that conflict
// (AlterCollection of one collection: SharedDBName + ExclusiveCollectionName)
// issued concurrently from 8 goroutines land in the same relative order on
// every VChannel of the collection and on the CChannel, in an order that
// agrees with real time (a call answered before another was sent comes
// first); broadcasts that do not conflict (CreateCollection of 8 fresh
// collections) are in flight at the same time; and while an AckSyncUp
// broadcast (TruncateCollection) holds a collection's keys, non-conflicting
// broadcasts complete and a conflicting one waits until it is finished.
func TestBroadcastConflictingOrderAndConcurrency(t *testing.T) {
	s := startSystem(t, 1, 2)
	view := waitServing(t, s, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	be := bcBackend(t, s)
	tasks := bcWatchTasks(t, s)

	// Conflicting: 8 goroutines × 4 AlterCollection of collection 100.
	x := bcCreate(ctx, t, s, 100, 4)
	const goroutines, each = 8, 4
	type rec struct {
		id         uint64
		start, end time.Time
		reply      wire.BroadcastReply
	}
	var mu sync.Mutex
	var recs []rec
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for g := range goroutines {
		wg.Go(func() {
			<-gate
			for i := range each {
				req := bcRequest(t, messages.TypeAlterCollection, x, 100, messages.AlterCollectionBody{
					CollectionRef: bcRef(100), SchemaVersion: uint64(g*each + i + 1)}, "")
				start := time.Now()
				reply, err := bcCall(ctx, s, req)
				end := time.Now()
				if !assertNoError(t, err, "alter g%d i%d", g, i) {
					return
				}
				mu.Lock()
				recs = append(recs, rec{id: reply.ID, start: start, end: end, reply: reply})
				mu.Unlock()
			}
		})
	}
	close(gate)
	wg.Wait()
	require.Len(t, recs, goroutines*each)
	targets := append(slices.Clone(x), view.CChannel)
	ids := map[uint64]bool{}
	for _, r := range recs {
		require.False(t, ids[r.id], "broadcast ID %d returned twice", r.id)
		ids[r.id] = true
		require.ElementsMatch(t, targets, slices.Collect(maps.Keys(r.reply.Appended)), "broadcast %d names every target", r.id)
	}

	var ref []uint64
	for _, target := range targets {
		got := bcReadIDs(t, s, be, target, messages.TypeAlterCollection)
		var seq []uint64
		for _, m := range got {
			id := m.Broadcast().ID
			if !ids[id] {
				continue
			}
			seq = append(seq, id)
			for _, r := range recs {
				if r.id == id {
					require.Equal(t, r.reply.Appended[target].ID, m.ID(), "broadcast %d landed on %s where its result says", id, target)
				}
			}
		}
		require.Len(t, seq, len(ids), "%s holds every alter exactly once", target)
		if ref == nil {
			ref = seq
			continue
		}
		require.Equal(t, ref, seq, "conflicting broadcasts in the same order on %s as on %s", target, targets[0])
	}
	pos := map[uint64]int{}
	for i, id := range ref {
		pos[id] = i
	}
	for _, a := range recs {
		for _, b := range recs {
			if a.end.Before(b.start) {
				require.Less(t, pos[a.id], pos[b.id], "broadcast %d was answered before %d was sent, so it comes first", a.id, b.id)
			}
		}
	}
	// As persisted: each held its keys (from its first save to its
	// tombstone) strictly after the one before it in the log released them.
	held := tasks.intervals(t, ref)
	for i := 1; i < len(ref); i++ {
		prev, cur := held[ref[i-1]], held[ref[i]]
		require.Greater(t, cur[0], prev[1], "broadcast %d was persisted (revision %d) before %d, which precedes it, was a tombstone (revision %d)",
			ref[i], cur[0], ref[i-1], prev[1])
	}

	// Not conflicting: CreateCollection of 8 fresh collections at once.
	fresh := make([][]string, goroutines)
	for i := range fresh {
		fresh[i] = bcAllocate(ctx, t, s, int64(200+i), 2)
	}
	starts, ends := make([]time.Time, goroutines), make([]time.Time, goroutines)
	freshIDs := make([]uint64, goroutines)
	gate = make(chan struct{})
	for i := range goroutines {
		wg.Go(func() {
			<-gate
			id := int64(200 + i)
			req := bcRequest(t, messages.TypeCreateCollection, fresh[i], id, bcCreateBody(id, fresh[i]), "")
			starts[i] = time.Now()
			reply, err := bcCall(ctx, s, req)
			ends[i] = time.Now()
			assertNoError(t, err, "create %d", id)
			freshIDs[i] = reply.ID
		})
	}
	close(gate)
	wg.Wait()
	if t.Failed() {
		return
	}
	overlaps, most := 0, 0
	for i := range goroutines {
		inFlight := 0 // calls in flight when call i was sent
		for j := range goroutines {
			if j != i && starts[i].Before(ends[j]) && starts[j].Before(ends[i]) && j > i {
				overlaps++
			}
			if !starts[j].After(starts[i]) && ends[j].After(starts[i]) {
				inFlight++
			}
		}
		most = max(most, inFlight)
	}
	held = tasks.intervals(t, freshIDs)
	heldOverlaps := 0
	for i, a := range freshIDs {
		for _, b := range freshIDs[i+1:] {
			if held[a][0] < held[b][1] && held[b][0] < held[a][1] {
				heldOverlaps++
			}
		}
	}
	t.Logf("8 non-conflicting broadcasts: calls of %d of 28 pairs overlap (at most %d in flight at once); %d pairs held their keys at the same time",
		overlaps, most, heldOverlaps)
	require.Positive(t, overlaps, "non-conflicting broadcasts are called at the same time")
	require.Positive(t, heldOverlaps, "non-conflicting broadcasts run at the same time")

	// While a TruncateCollection (AckSyncUp) of collection 100 waits for
	// its acknowledgements it holds the collection's keys: an
	// AlterCollection of 100 waits, broadcasts of other collections pass.
	truncDone := make(chan error, 1)
	var truncReply wire.BroadcastReply
	go func() {
		var err error
		truncReply, err = bcCall(ctx, s, bcRequest(t, messages.TypeTruncateCollection, x, 100,
			messages.TruncateCollectionBody{CollectionRef: bcRef(100)}, ""))
		truncDone <- err
	}()
	trunc := bcAwaitReplica(ctx, t, be, s.Codec, x[0], messages.TypeTruncateCollection, 0)
	truncID := trunc.Broadcast().ID
	alterDone := make(chan error, 1)
	var alterReply wire.BroadcastReply
	go func() {
		var err error
		alterReply, err = bcCall(ctx, s, bcRequest(t, messages.TypeAlterCollection, x, 100,
			messages.AlterCollectionBody{CollectionRef: bcRef(100), SchemaVersion: 1000}, ""))
		alterDone <- err
	}()
	other := bcAllocate(ctx, t, s, 300, 1)
	short, cancelShort := context.WithTimeout(ctx, 10*time.Second)
	_, err := bcCall(short, s, bcRequest(t, messages.TypeCreateCollection, other, 300, bcCreateBody(300, other), ""))
	require.NoError(t, err, "a broadcast of another collection passes while collection 100's keys are held")
	_, err = bcCall(short, s, bcRequest(t, messages.TypeAlterCollection, fresh[0], 200,
		messages.AlterCollectionBody{CollectionRef: bcRef(200), SchemaVersion: 2}, ""))
	require.NoError(t, err, "a broadcast of another collection passes while collection 100's keys are held")
	cancelShort()
	select {
	case err := <-truncDone:
		t.Fatalf("TruncateCollection (AckSyncUp) returned before any acknowledgement: %v", err)
	case err := <-alterDone:
		t.Fatalf("a conflicting AlterCollection returned while TruncateCollection held the keys: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	for _, target := range targets {
		bcAwaitReplica(ctx, t, be, s.Codec, target, messages.TypeTruncateCollection, truncID)
		require.NoError(t, bcAck(ctx, s, truncID, target))
	}
	require.NoError(t, <-truncDone)
	require.NoError(t, <-alterDone)
	require.Equal(t, truncID, truncReply.ID)
	require.Len(t, truncReply.Appended, len(targets))
	for _, target := range targets {
		var seq []uint64
		for _, m := range bcReadIDs(t, s, be, target, messages.TypeTruncateCollection, messages.TypeAlterCollection) {
			if id := m.Broadcast().ID; id == truncID || id == alterReply.ID {
				seq = append(seq, id)
			}
		}
		require.Equal(t, []uint64{truncID, alterReply.ID}, seq, "on %s the waiting alter follows the truncate", target)
	}
}

// bcOp is one broadcast of the chaos test, with the ops it must follow.
type bcOp struct {
	i       int
	typ     *messages.Type
	coll    int64 // 0 for CreateDatabase
	dbName  string
	targets []string // VChannel targets (the CChannel is added)
	deps    []int
	done    chan struct{}
	reply   wire.BroadcastReply
	tries   int
	end     time.Time
}

// TestBroadcastCoordinatorCrashes: 100 broadcasts (CreateCollection,
// AlterCollection and DropCollection of 13 collections, CreateDatabase of
// fresh databases), issued by 8 goroutines that retry retriable errors with
// the same idempotency key, while the active coordinator is crashed at 3
// random points (a new standby joining each time). Afterwards every
// broadcast landed exactly once on every target and nowhere else, where its
// final result says; every result names every target; each target holds
// exactly the broadcasts aimed at it (none is on some VChannels and missing
// from others); the broadcasts of a collection are in one order on all of
// its targets, and (as persisted in the broadcast bucket) each held the
// collection's keys only after the one before it was a tombstone, across
// takeovers too; no resource key is left held (a broadcast touching every
// collection, and a cluster barrier, succeed promptly); and the
// DropCollection callbacks ran (the dropped collections' IDs allocate
// afresh).
func TestBroadcastCoordinatorCrashes(t *testing.T) {
	s := startSystem(t, 2, 2)
	view := waitServing(t, s, true)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tasks := bcWatchTasks(t, s)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	seed := rng.Uint64()
	rng = rand.New(rand.NewPCG(seed, 2))
	t.Logf("seed %d", seed)

	// Collections 1-10 live on, 11-13 are dropped; shards vary 1-3.
	const live, dropped = 10, 3
	colls := map[int64][]string{}
	for id := int64(1); id <= live+dropped; id++ {
		colls[id] = bcAllocate(ctx, t, s, id, 1+int(id%3))
	}

	var ops []*bcOp
	add := func(op *bcOp) *bcOp {
		op.i, op.done = len(ops), make(chan struct{})
		ops = append(ops, op)
		return op
	}
	creates := map[int64]*bcOp{}
	for id := int64(1); id <= live+dropped; id++ {
		creates[id] = add(&bcOp{typ: messages.TypeCreateCollection, coll: id, targets: colls[id]})
	}
	alters := map[int64][]int{}
	alter := func(id int64) {
		op := add(&bcOp{typ: messages.TypeAlterCollection, coll: id, targets: colls[id], deps: []int{creates[id].i}})
		alters[id] = append(alters[id], op.i)
	}
	for range 70 {
		alter(1 + rng.Int64N(live))
	}
	for id := int64(live + 1); id <= live+dropped; id++ {
		alter(id)
		alter(id)
	}
	for id := int64(live + 1); id <= live+dropped; id++ {
		add(&bcOp{typ: messages.TypeDropCollection, coll: id, targets: colls[id], deps: append([]int{creates[id].i}, alters[id]...)})
	}
	for i := range 8 {
		add(&bcOp{typ: messages.TypeCreateDatabase, dbName: fmt.Sprintf("xdb%d", i)})
	}
	require.Len(t, ops, 100)
	order := bcTopoShuffle(rng, ops)

	// Crash points: after 3 random counts of finished broadcasts.
	var finished atomic.Int64
	points := rng.Perm(80)[:3]
	sort.Ints(points)
	for i := range points {
		points[i] += 5 + 5*i
	}
	t.Logf("crashing the active coordinator after %v broadcasts finished", points)

	queue := make(chan *bcOp, len(order))
	for _, op := range order {
		queue <- op
	}
	close(queue)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for op := range queue {
				for _, d := range op.deps {
					select {
					case <-ops[d].done:
					case <-ctx.Done():
						t.Errorf("op %d: dependency %d never finished", op.i, d)
						return
					}
				}
				req := bcOpRequest(t, op)
				reply, tries, err := bcCallRetry(ctx, s, req, 15*time.Second)
				if !assertNoError(t, err, "op %d (%s of %d/%s) after %d tries", op.i, op.typ.Name, op.coll, op.dbName, tries) {
					return
				}
				op.reply, op.tries, op.end = reply, tries, time.Now()
				close(op.done)
				finished.Add(1)
			}
		})
	}
	var crashes []time.Time
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		for _, p := range points {
			for finished.Load() < int64(p) {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Millisecond):
				}
			}
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			crashes = append(crashes, time.Now())
			if !bcCrashActive(ctx, t, s) {
				return
			}
		}
	}()
	wg.Wait()
	<-chaosDone
	require.False(t, t.Failed())
	retried, resumed := 0, 0
	for _, op := range ops {
		retried += op.tries
		// Drawn before a crash, answered only to a retry: the task was
		// persisted by a crashed coordinator and finished by another.
		created := messages.TimeTick(op.reply.ID).Physical()
		for _, c := range crashes {
			if op.tries > 0 && created.Before(c) && op.end.After(c) {
				resumed++
				break
			}
		}
	}
	t.Logf("100 broadcasts done; %d retries; %d tasks resumed by a new coordinator", retried, resumed)

	// Every result names every target; IDs are distinct.
	expected := map[string]map[uint64]*bcOp{} // target -> broadcasts aimed at it
	byID := map[uint64]*bcOp{}
	for _, op := range ops {
		want := append(slices.Clone(op.targets), view.CChannel)
		require.ElementsMatch(t, want, slices.Collect(maps.Keys(op.reply.Appended)), "op %d (%s) names every target", op.i, op.typ.Name)
		if prev := byID[op.reply.ID]; prev != nil {
			t.Fatalf("ops %d and %d share broadcast ID %d", prev.i, op.i, op.reply.ID)
		}
		byID[op.reply.ID] = op
		for _, target := range want {
			if expected[target] == nil {
				expected[target] = map[uint64]*bcOp{}
			}
			expected[target][op.reply.ID] = op
		}
	}

	// Every target holds exactly its broadcasts, once each, where the
	// results say; a collection's broadcasts are in one order everywhere.
	be := bcBackend(t, s)
	types := []*messages.Type{messages.TypeCreateCollection, messages.TypeAlterCollection, messages.TypeDropCollection, messages.TypeCreateDatabase}
	orders := map[string][]uint64{}
	for target, want := range expected {
		seen := map[uint64]int{}
		for _, m := range bcReadIDs(t, s, be, target, types...) {
			bh := m.Broadcast()
			require.NotNil(t, bh, "%s: a %s without a broadcast header", target, m.Type().Name)
			seen[bh.ID]++
			op := want[bh.ID]
			require.NotNil(t, op, "%s holds broadcast %d (%s), which no call returned: a duplicate or a stray", target, bh.ID, m.Type().Name)
			require.Equal(t, op.reply.Appended[target].ID, m.ID(), "broadcast %d landed on %s where its result says", bh.ID, target)
			require.Equal(t, op.typ, m.Type())
			orders[target] = append(orders[target], bh.ID)
		}
		for id, op := range want {
			require.Equal(t, 1, seen[id], "op %d (%s, broadcast %d) on %s", op.i, op.typ.Name, id, target)
		}
	}
	for id, vs := range colls {
		var ref []uint64
		for _, target := range append(slices.Clone(vs), view.CChannel) {
			var seq []uint64
			for _, bid := range orders[target] {
				if byID[bid].coll == id {
					seq = append(seq, bid)
				}
			}
			if ref == nil {
				ref = seq
				continue
			}
			require.Equal(t, ref, seq, "collection %d: broadcasts in one order on %s and %s", id, vs[0], target)
		}
		require.Equal(t, byID[ref[0]].typ, messages.TypeCreateCollection, "collection %d starts with its creation", id)
		// Persisted state: each held the collection's keys only after the
		// one before it in the log was a tombstone, across takeovers too.
		held := tasks.intervals(t, ref)
		for i := 1; i < len(ref); i++ {
			require.Greater(t, held[ref[i]][0], held[ref[i-1]][1], "collection %d: broadcast %d persisted before %d, which precedes it, was done",
				id, ref[i], ref[i-1])
		}
	}

	// No key is left held: one broadcast per live collection, one
	// exclusive on the database, and a cluster barrier, each prompt.
	probe, cancelProbe := context.WithTimeout(ctx, 10*time.Second)
	defer cancelProbe()
	for id := int64(1); id <= live; id++ {
		wg.Go(func() {
			_, err := bcCall(probe, s, bcRequest(t, messages.TypeAlterCollection, colls[id], id,
				messages.AlterCollectionBody{CollectionRef: bcRef(id), SchemaVersion: 99}, ""))
			assertNoError(t, err, "final alter of collection %d", id)
		})
	}
	wg.Wait()
	require.False(t, t.Failed(), "a resource key is still held")
	_, err := bcCall(probe, s, wire.BroadcastRequest{Type: messages.TypeCreateDatabase.Name, DBName: bcDB, Payload: []byte(`{}`)})
	require.NoError(t, err, "ExclusiveDBName of the collections' database is free")
	_, err = bcCall(probe, s, bcBarrierRequest(t, messages.TypeAlterWAL, messages.AlterWALBody{Settings: map[string]string{"probe": "1"}}))
	require.NoError(t, err, "ExclusiveCluster is free: no broadcast holds any key")

	// The DropCollection callbacks released the dropped collections: a
	// lookup finds them dropped, without VChannels; the live ones keep
	// theirs.
	for id := int64(1); id <= live+dropped; id++ {
		got := bcLookup(ctx, t, s, id)
		if id > live {
			require.Equal(t, wire.AllocateReply{Dropped: true}, got, "collection %d was dropped: its callback released it", id)
		} else {
			require.Equal(t, colls[id], got.VChannels, "collection %d lives on", id)
		}
	}
}

// bcTopoShuffle returns ops in a random order in which every op comes
// after its dependencies, so that workers taking ops in this order never
// all wait for ops nobody took.
func bcTopoShuffle(rng *rand.Rand, ops []*bcOp) []*bcOp {
	placed := map[int]bool{}
	var out []*bcOp
	for len(out) < len(ops) {
		var ready []*bcOp
		for _, op := range ops {
			if placed[op.i] {
				continue
			}
			ok := true
			for _, d := range op.deps {
				ok = ok && placed[d]
			}
			if ok {
				ready = append(ready, op)
			}
		}
		op := ready[rng.IntN(len(ready))]
		placed[op.i] = true
		out = append(out, op)
	}
	return out
}

// bcOpRequest is the request of a chaos op, with an idempotency key of its
// own that every retry repeats.
func bcOpRequest(t *testing.T, op *bcOp) wire.BroadcastRequest {
	key := fmt.Sprintf("op-%d", op.i)
	switch op.typ {
	case messages.TypeCreateCollection:
		return bcRequest(t, op.typ, op.targets, op.coll, bcCreateBody(op.coll, op.targets), key)
	case messages.TypeAlterCollection:
		return bcRequest(t, op.typ, op.targets, op.coll, messages.AlterCollectionBody{CollectionRef: bcRef(op.coll),
			Properties: map[string]string{"op": key}}, key)
	case messages.TypeDropCollection:
		return bcRequest(t, op.typ, op.targets, op.coll, messages.DropCollectionBody{CollectionRef: bcRef(op.coll)}, key)
	}
	return wire.BroadcastRequest{Type: op.typ.Name, DBName: op.dbName, Payload: []byte(`{"op":"` + key + `"}`), IdempotencyKey: key}
}

// TestBroadcastIdempotency: a retried idempotency key returns the original
// result (ID and where each replica landed) and creates nothing; the key
// is scoped by the message type; the same holds after a coordinator
// takeover, for a finished broadcast and for one still waiting for its
// acknowledgements when the active coordinator crashed (the new one
// resumes it, takes the acknowledgements, and the retry returns it).
func TestBroadcastIdempotency(t *testing.T) {
	s := startSystem(t, 2, 2)
	view := waitServing(t, s, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	be := bcBackend(t, s)
	vs := bcCreate(ctx, t, s, 1, 2)
	targets := append(slices.Clone(vs), view.CChannel)

	alter := bcRequest(t, messages.TypeAlterCollection, vs, 1, messages.AlterCollectionBody{CollectionRef: bcRef(1), SchemaVersion: 2}, "k1")
	first, err := bcCall(ctx, s, alter)
	require.NoError(t, err)
	require.Len(t, first.Appended, len(targets))
	again, err := bcCall(ctx, s, alter)
	require.NoError(t, err)
	require.Equal(t, first, again, "a retried key returns the original result")
	other, err := bcCall(ctx, s, wire.BroadcastRequest{Type: messages.TypeCreateDatabase.Name, DBName: "xdb", Payload: []byte(`{}`), IdempotencyKey: "k1"})
	require.NoError(t, err)
	require.NotEqual(t, first.ID, other.ID, "the key is scoped by the message type")

	// A pending AckSyncUp broadcast with a key of its own.
	trunc := bcRequest(t, messages.TypeTruncateCollection, vs, 1, messages.TruncateCollectionBody{CollectionRef: bcRef(1)}, "k2")
	truncErr := make(chan error, 1)
	go func() { _, err := bcCall(ctx, s, trunc); truncErr <- err }()
	m := bcAwaitReplica(ctx, t, be, s.Codec, targets[0], messages.TypeTruncateCollection, 0)
	truncID := m.Broadcast().ID
	for _, target := range targets {
		bcAwaitReplica(ctx, t, be, s.Codec, target, messages.TypeTruncateCollection, truncID)
	}

	// Take over: the old coordinator's caller learns nothing final.
	require.True(t, bcCrashActive(ctx, t, s))
	require.Error(t, <-truncErr, "the crashed coordinator cannot answer a broadcast still waiting for acknowledgements")

	after, _, err := bcCallRetry(ctx, s, alter, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, first, after, "a retried key returns the original result after a takeover")

	retried := make(chan wire.BroadcastReply, 1)
	go func() {
		reply, _, err := bcCallRetry(ctx, s, trunc, 5*time.Second)
		assertNoError(t, err, "retry of the truncate")
		retried <- reply
	}()
	select {
	case r := <-retried:
		t.Fatalf("the retry returned %+v before the acknowledgements", r)
	case <-time.After(300 * time.Millisecond):
	}
	for _, target := range targets {
		require.NoError(t, bcAck(ctx, s, truncID, target))
	}
	reply := <-retried
	require.Equal(t, truncID, reply.ID, "the retry returns the resumed original")
	require.ElementsMatch(t, targets, slices.Collect(maps.Keys(reply.Appended)))
	again, err = bcCall(ctx, s, trunc)
	require.NoError(t, err)
	require.Equal(t, reply, again)

	for _, target := range targets {
		counts := map[uint64]int{}
		for _, m := range bcReadIDs(t, s, be, target, messages.TypeAlterCollection, messages.TypeTruncateCollection) {
			counts[m.Broadcast().ID]++
			if m.Broadcast().ID == first.ID {
				require.Equal(t, first.Appended[target].ID, m.ID())
			}
			if m.Broadcast().ID == truncID {
				require.Equal(t, reply.Appended[target].ID, m.ID())
			}
		}
		require.Equal(t, map[uint64]int{first.ID: 1, truncID: 1}, counts, "%s: each broadcast once, retries created nothing", target)
	}
}

// TestBroadcastIdempotencyRetryWhileWaiting: a caller whose broadcast
// waits for its keys gives up (its call times out; the coordinator keeps
// the request waiting) and retries with the same idempotency key; once the
// keys are free the key's broadcast lands once, not once per attempt, and
// every attempt that waits long enough gets its result.
func TestBroadcastIdempotencyRetryWhileWaiting(t *testing.T) {
	s := startSystem(t, 1, 2)
	view := waitServing(t, s, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	be := bcBackend(t, s)
	vs := bcCreate(ctx, t, s, 1, 1)
	targets := append(slices.Clone(vs), view.CChannel)

	// TruncateCollection (AckSyncUp) holds the collection's keys until
	// acknowledged.
	truncErr := make(chan error, 1)
	go func() {
		_, err := bcCall(ctx, s, bcRequest(t, messages.TypeTruncateCollection, vs, 1, messages.TruncateCollectionBody{CollectionRef: bcRef(1)}, ""))
		truncErr <- err
	}()
	truncID := bcAwaitReplica(ctx, t, be, s.Codec, vs[0], messages.TypeTruncateCollection, 0).Broadcast().ID

	alter := bcRequest(t, messages.TypeAlterCollection, vs, 1, messages.AlterCollectionBody{CollectionRef: bcRef(1), SchemaVersion: 2}, "once")
	for range 2 {
		short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := bcCall(short, s, alter)
		cancelShort()
		require.Error(t, err, "the alter waits for the truncate's keys")
		require.True(t, streamwal.IsRetriable(err), "a caller may retry: %v", err)
	}
	patient := make(chan wire.BroadcastReply, 1)
	go func() {
		reply, err := bcCall(ctx, s, alter)
		assertNoError(t, err, "a patient attempt")
		patient <- reply
	}()
	for _, target := range targets {
		bcAwaitReplica(ctx, t, be, s.Codec, target, messages.TypeTruncateCollection, truncID)
		require.NoError(t, bcAck(ctx, s, truncID, target))
	}
	require.NoError(t, <-truncErr)
	reply, err := bcCall(ctx, s, alter)
	require.NoError(t, err)
	require.Equal(t, reply, <-patient, "every attempt gets the one result")
	require.Len(t, reply.Appended, len(targets))
	time.Sleep(300 * time.Millisecond) // let a second task, if any, land
	for _, target := range targets {
		var ids []uint64
		for _, m := range bcReadIDs(t, s, be, target, messages.TypeAlterCollection) {
			ids = append(ids, m.Broadcast().ID)
		}
		require.Equal(t, []uint64{reply.ID}, ids, "%s: the key's broadcast landed once", target)
	}
}

// TestBroadcastAckSyncUpDoesNotBlockOthers: an AckSyncUp broadcast
// (TruncateCollection) whose CChannel replica was acknowledged but whose
// VChannel replica was not yet holds only its own keys: a broadcast of
// another collection completes meanwhile.
func TestBroadcastAckSyncUpDoesNotBlockOthers(t *testing.T) {
	s := startSystem(t, 1, 2)
	view := waitServing(t, s, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	be := bcBackend(t, s)
	x := bcCreate(ctx, t, s, 1, 1)
	y := bcCreate(ctx, t, s, 2, 1)

	truncErr := make(chan error, 1)
	go func() {
		_, err := bcCall(ctx, s, bcRequest(t, messages.TypeTruncateCollection, x, 1, messages.TruncateCollectionBody{CollectionRef: bcRef(1)}, ""))
		truncErr <- err
	}()
	id := bcAwaitReplica(ctx, t, be, s.Codec, view.CChannel, messages.TypeTruncateCollection, 0).Broadcast().ID
	require.NoError(t, bcAck(ctx, s, id, view.CChannel))

	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	_, err := bcCall(short, s, bcRequest(t, messages.TypeAlterCollection, y, 2, messages.AlterCollectionBody{CollectionRef: bcRef(2), SchemaVersion: 2}, ""))
	cancelShort()

	bcAwaitReplica(ctx, t, be, s.Codec, x[0], messages.TypeTruncateCollection, id)
	require.NoError(t, bcAck(ctx, s, id, x[0]))
	require.NoError(t, <-truncErr)
	if errors.Is(err, streamwal.ErrUnavailable) {
	}
	require.NoError(t, err, "a non-conflicting broadcast completes while an AckSyncUp broadcast waits for a VChannel")
}

// TestBroadcastBadBodyChangesNothing: a CreateCollection whose body names
// another collection than its VChannels is bad input: it gets an
// invalid-argument error, lands nowhere, and leaves no key held (the
// correct CreateCollection then succeeds at once).
func TestBroadcastBadBodyChangesNothing(t *testing.T) {
	s := startSystem(t, 1, 2)
	view := waitServing(t, s, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	be := bcBackend(t, s)
	vs := bcAllocate(ctx, t, s, 5, 2)

	_, badErr := bcCall(ctx, s, bcRequest(t, messages.TypeCreateCollection, vs, 5, bcCreateBody(6, vs), ""))
	require.Error(t, badErr, "a body naming collection 6 on collection 5's VChannels")
	landed := len(bcReadIDs(t, s, be, view.CChannel, messages.TypeCreateCollection))
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	_, goodErr := bcCall(short, s, bcRequest(t, messages.TypeCreateCollection, vs, 5, bcCreateBody(5, vs), ""))
	cancelShort()
	if !errors.Is(badErr, streamwal.ErrInvalidArgument) || landed > 0 || goodErr != nil {
	}
}

// TestBroadcastPartitionLifecycle: DML is refused before CreateCollection,
// accepted after it; DML into a partition needs a CreatePartition
// broadcast first and is refused after DropPartition; after DropCollection
// everything is refused.
func TestBroadcastPartitionLifecycle(t *testing.T) {
	s := startSystem(t, 1, 2)
	view := waitServing(t, s, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := s.Conn()
	vs := bcAllocate(ctx, t, s, 5, 2)

	n := 0
	insert := func(partition int64) error {
		t.Helper()
		var err error
		for _, name := range vs {
			v, perr := streamwal.ParseVChannel(name)
			require.NoError(t, perr)
			n++
			m, merr := s.Codec.New(messages.TypeInsert, v, fmt.Appendf(nil, "row-%d", n), messages.WithDML(partition, 1))
			require.NoError(t, merr)
			_, _, aerr := appendOne(ctx, nc, s.Codec, m)
			if name == vs[0] {
				err = aerr
			} else {
				require.Equal(t, streamwal.CodeOf(err), streamwal.CodeOf(aerr), "both shards agree")
			}
		}
		return err
	}
	partition := func(typ *messages.Type, pid int64) wire.BroadcastReply {
		t.Helper()
		reply, err := bcCall(ctx, s, bcRequest(t, typ, vs, 5, messages.PartitionBody{CollectionRef: bcRef(5), PartitionID: pid,
			PartitionName: fmt.Sprintf("p%d", pid)}, ""))
		require.NoError(t, err)
		require.ElementsMatch(t, append(slices.Clone(vs), view.CChannel), slices.Collect(maps.Keys(reply.Appended)))
		return reply
	}

	require.ErrorIs(t, insert(0), streamwal.ErrLifecycle, "before CreateCollection")
	body := bcCreateBody(5, vs)
	body.PartitionIDs = []int64{1}
	_, err := bcCall(ctx, s, bcRequest(t, messages.TypeCreateCollection, vs, 5, body, ""))
	require.NoError(t, err)
	require.NoError(t, insert(0), "no particular partition")
	require.NoError(t, insert(1), "an initial partition")
	require.ErrorIs(t, insert(2), streamwal.ErrLifecycle, "before CreatePartition")

	partition(messages.TypeCreatePartition, 2)
	require.NoError(t, insert(2), "after CreatePartition")
	partition(messages.TypeDropPartition, 2)
	require.ErrorIs(t, insert(2), streamwal.ErrLifecycle, "after DropPartition")
	require.NoError(t, insert(1), "the other partition is untouched")
	partition(messages.TypeCreatePartition, 3)
	require.NoError(t, insert(3))

	_, err = bcCall(ctx, s, bcRequest(t, messages.TypeDropCollection, vs, 5, messages.DropCollectionBody{CollectionRef: bcRef(5)}, ""))
	require.NoError(t, err)
	require.ErrorIs(t, insert(0), streamwal.ErrLifecycle, "after DropCollection")
	require.ErrorIs(t, insert(3), streamwal.ErrLifecycle, "after DropCollection")

	// The inserts accepted are the ones read back, in order.
	be := bcBackend(t, s)
	for _, name := range vs {
		var parts []int64
		for _, m := range bcReadIDs(t, s, be, name, messages.TypeInsert) {
			parts = append(parts, m.Header().DML.PartitionID)
		}
		require.Equal(t, []int64{0, 1, 2, 1, 3}, parts, "%s: the accepted inserts' partitions", name)
	}
}

// TestBroadcastClusterBarriers: FlushAll (AckSyncUp) lands on every
// PChannel and returns only once every PChannel acknowledged it (each
// acknowledgement sent after its replica was read); while it waits it
// holds ExclusiveCluster, so any other broadcast waits. AlterWAL (not
// AckSyncUp) lands on every PChannel at once. Acknowledgements of unknown
// broadcasts or non-targets are invalid arguments; of a finished one a
// no-op.
func TestBroadcastClusterBarriers(t *testing.T) {
	s := startSystem(t, 1, 2)
	view := waitServing(t, s, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	be := bcBackend(t, s)
	var pchannels []string
	for _, a := range view.Channels {
		pchannels = append(pchannels, a.PChannel)
	}
	require.Len(t, pchannels, 16)

	flushErr := make(chan error, 1)
	var flush wire.BroadcastReply
	go func() {
		var err error
		flush, err = bcCall(ctx, s, bcBarrierRequest(t, messages.TypeFlushAll, messages.FlushAllBody{}))
		flushErr <- err
	}()
	// Read each PChannel's replica, then acknowledge it (all but one).
	var mu sync.Mutex
	replicas := map[string]*messages.ImmutableMessage{}
	var wg sync.WaitGroup
	for _, p := range pchannels {
		wg.Go(func() {
			m, err := bcReplica(ctx, be, s.Codec, p, messages.TypeFlushAll, 0)
			if !assertNoError(t, err, "replica on %s", p) {
				return
			}
			mu.Lock()
			replicas[p] = m
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Len(t, replicas, len(pchannels))
	id := replicas[pchannels[0]].Broadcast().ID
	for _, p := range pchannels {
		m := replicas[p]
		require.True(t, m.VChannel().IsZero(), "a PChannel-level replica")
		require.Equal(t, id, m.Broadcast().ID, "one broadcast on every PChannel")
	}
	require.ErrorIs(t, bcAck(ctx, s, id, "pchan-99"), streamwal.ErrInvalidArgument, "not a target")
	require.ErrorIs(t, bcAck(ctx, s, id+12345, pchannels[0]), streamwal.ErrInvalidArgument, "no such broadcast")
	for _, p := range pchannels[1:] {
		wg.Go(func() { assertNoError(t, bcAck(ctx, s, id, p), "ack %s", p) })
	}
	wg.Wait()

	// Still waiting for one acknowledgement: it holds ExclusiveCluster.
	dbErr := make(chan error, 1)
	go func() {
		_, err := bcCall(ctx, s, wire.BroadcastRequest{Type: messages.TypeCreateDatabase.Name, DBName: "afterflush", Payload: []byte(`{}`)})
		dbErr <- err
	}()
	select {
	case err := <-flushErr:
		t.Fatalf("FlushAll returned with one PChannel unacknowledged: %v", err)
	case err := <-dbErr:
		t.Fatalf("a broadcast passed while FlushAll held ExclusiveCluster: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, bcAck(ctx, s, id, pchannels[0]))
	require.NoError(t, <-flushErr)
	require.NoError(t, <-dbErr, "the waiting broadcast passes once FlushAll is done")
	require.Equal(t, id, flush.ID)
	require.ElementsMatch(t, pchannels, slices.Collect(maps.Keys(flush.Appended)))
	require.NoError(t, bcAck(ctx, s, id, pchannels[0]), "acknowledging a finished broadcast again is a no-op")

	walReply, err := bcCall(ctx, s, bcBarrierRequest(t, messages.TypeAlterWAL, messages.AlterWALBody{Settings: map[string]string{"k": "v"}}))
	require.NoError(t, err, "AlterWAL needs no acknowledgement")
	require.ElementsMatch(t, pchannels, slices.Collect(maps.Keys(walReply.Appended)))
	for _, p := range pchannels {
		counts := map[string]int{}
		for _, m := range bcReadIDs(t, s, be, p, messages.TypeFlushAll, messages.TypeAlterWAL) {
			require.True(t, m.VChannel().IsZero())
			counts[fmt.Sprintf("%s/%d", m.Type().Name, m.Broadcast().ID)]++
			want := map[*messages.Type]wire.BroadcastReply{messages.TypeFlushAll: flush, messages.TypeAlterWAL: walReply}[m.Type()]
			require.Equal(t, want.Appended[p].ID, m.ID(), "%s landed on %s where its result says", m.Type().Name, p)
		}
		require.Equal(t, map[string]int{fmt.Sprintf("FlushAll/%d", id): 1, fmt.Sprintf("AlterWAL/%d", walReply.ID): 1}, counts, "%s", p)
	}
}

// TestBroadcastAppendFirst: a broadcast naming an append-first VChannel
// succeeds and lands everywhere; the append-first replica lands before
// the others (checked where that is visible from outside: on the
// PChannel it shares with the CChannel, its MessageID is the lower); an
// append-first VChannel that is not a target, or not a VChannel name, is
// an invalid argument and nothing is broadcast.
func TestBroadcastAppendFirst(t *testing.T) {
	s := startSystem(t, 1, 2)
	view := waitServing(t, s, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	be := bcBackend(t, s)
	cc, err := streamwal.ParseVChannel(view.CChannel)
	require.NoError(t, err)

	// 16 shards: one on every PChannel, so one shares the CChannel's.
	vs := bcAllocate(ctx, t, s, 9, 16)
	first := ""
	for _, name := range vs {
		v, err := streamwal.ParseVChannel(name)
		require.NoError(t, err)
		if v.PChannel() == cc.PChannel() {
			first = name
		}
	}
	require.NotEmpty(t, first, "a shard shares the CChannel's PChannel")

	req := bcRequest(t, messages.TypeCreateCollection, vs, 9, bcCreateBody(9, vs), "")
	req.AppendFirst = first
	created, err := bcCall(ctx, s, req)
	require.NoError(t, err)
	require.ElementsMatch(t, append(slices.Clone(vs), view.CChannel), slices.Collect(maps.Keys(created.Appended)))
	require.Less(t, created.Appended[first].ID, created.Appended[view.CChannel].ID, "the append-first replica landed before the CChannel's")
	for i := range 5 {
		req := bcRequest(t, messages.TypeAlterCollection, vs, 9, messages.AlterCollectionBody{CollectionRef: bcRef(9), SchemaVersion: uint64(i + 2)}, "")
		req.AppendFirst = first
		reply, err := bcCall(ctx, s, req)
		require.NoError(t, err)
		require.Len(t, reply.Appended, 17)
		require.Less(t, reply.Appended[first].ID, reply.Appended[view.CChannel].ID, "alter %d: the append-first replica landed first", i)
	}

	other := bcAllocate(ctx, t, s, 10, 1)
	before := len(bcReadIDs(t, s, be, view.CChannel, messages.TypeAlterCollection))
	req = bcRequest(t, messages.TypeAlterCollection, vs, 9, messages.AlterCollectionBody{CollectionRef: bcRef(9)}, "")
	req.AppendFirst = other[0]
	_, err = bcCall(ctx, s, req)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "append-first is not a target")
	req.AppendFirst = "not a vchannel"
	_, err = bcCall(ctx, s, req)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument, "append-first is not a VChannel name")
	require.Len(t, bcReadIDs(t, s, be, view.CChannel, messages.TypeAlterCollection), before, "a refused broadcast broadcasts nothing")
}

// --- helpers -------------------------------------------------------------

// assertNoError reports err (from any goroutine) and whether it was nil.
func assertNoError(t *testing.T, err error, format string, args ...any) bool {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", fmt.Sprintf(format, args...), err)
		return false
	}
	return true
}

// bcRef names collection id in bcDB.
func bcRef(id int64) messages.CollectionRef {
	return messages.CollectionRef{DBName: bcDB, CollectionName: fmt.Sprintf("c%d", id), CollectionID: id}
}

// bcCreateBody is the CreateCollection body of collection id.
func bcCreateBody(id int64, vs []string) messages.CreateCollectionBody {
	return messages.CreateCollectionBody{CollectionRef: bcRef(id), VChannels: vs}
}

// bcRequest builds a collection broadcast of typ to vs.
func bcRequest(t testing.TB, typ *messages.Type, vs []string, id int64, body any, key string) wire.BroadcastRequest {
	payload, err := json.Marshal(body)
	require.NoError(t, err)
	ref := bcRef(id)
	return wire.BroadcastRequest{Type: typ.Name, VChannels: vs, DBName: ref.DBName, CollectionName: ref.CollectionName,
		Payload: payload, IdempotencyKey: key}
}

// bcBarrierRequest builds a cluster barrier (every PChannel).
func bcBarrierRequest(t testing.TB, typ *messages.Type, body any) wire.BroadcastRequest {
	payload, err := json.Marshal(body)
	require.NoError(t, err)
	return wire.BroadcastRequest{Type: typ.Name, Payload: payload}
}

// bcCall sends one broadcast request.
func bcCall(ctx context.Context, s *system.System, req wire.BroadcastRequest) (wire.BroadcastReply, error) {
	var reply wire.BroadcastReply
	err := call(ctx, s.Conn(), s.Codec.Cluster().CoordSubject(streamwal.CoordBroadcast), req, &reply)
	return reply, err
}

// bcCallRetry sends a broadcast request, each attempt bounded by attempt,
// and repeats it (same idempotency key) on retriable errors until it
// succeeds or ctx ends; it returns the number of retries too.
func bcCallRetry(ctx context.Context, s *system.System, req wire.BroadcastRequest, attempt time.Duration) (wire.BroadcastReply, int, error) {
	delay := 20 * time.Millisecond
	for tries := 0; ; tries++ {
		actx, cancel := context.WithTimeout(ctx, attempt)
		reply, err := bcCall(actx, s, req)
		cancel()
		if err == nil || !streamwal.IsRetriable(err) {
			return reply, tries, err
		}
		select {
		case <-ctx.Done():
			return reply, tries, fmt.Errorf("gave up after %d tries: %w", tries, err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 250*time.Millisecond)
	}
}

// bcAck acknowledges target of broadcast id, retrying retriable errors
// (a takeover) until ctx ends.
func bcAck(ctx context.Context, s *system.System, id uint64, target string) error {
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := call(actx, s.Conn(), s.Codec.Cluster().CoordSubject(streamwal.CoordBroadcastAck), wire.BroadcastAckRequest{ID: id, Target: target}, nil)
		cancel()
		if err == nil || !streamwal.IsRetriable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// bcLookup returns what the coordinator knows of a collection.
func bcLookup(ctx context.Context, t testing.TB, s *system.System, id int64) wire.AllocateReply {
	t.Helper()
	var reply wire.AllocateReply
	require.NoError(t, call(ctx, s.Conn(), s.Codec.Cluster().CoordSubject(streamwal.CoordAllocate),
		wire.AllocateRequest{CollectionID: id, Lookup: true}, &reply))
	return reply
}

// bcAllocate places a collection's shards.
func bcAllocate(ctx context.Context, t testing.TB, s *system.System, id int64, shards int) []string {
	t.Helper()
	var reply wire.AllocateReply
	require.NoError(t, call(ctx, s.Conn(), s.Codec.Cluster().CoordSubject(streamwal.CoordAllocate),
		wire.AllocateRequest{CollectionID: id, Shards: shards}, &reply))
	return reply.VChannels
}

// bcCreate allocates and creates a collection by broadcast.
func bcCreate(ctx context.Context, t testing.TB, s *system.System, id int64, shards int) []string {
	t.Helper()
	vs := bcAllocate(ctx, t, s, id, shards)
	_, err := bcCall(ctx, s, bcRequest(t, messages.TypeCreateCollection, vs, id, bcCreateBody(id, vs), ""))
	require.NoError(t, err)
	return vs
}

// bcCrashActive crashes the active coordinator, starts a new standby, and
// waits until a coordinator is active under a later epoch.
func bcCrashActive(ctx context.Context, t *testing.T, s *system.System) bool {
	var old uint64
	for {
		if c, ok := s.Active(); ok {
			old, _ = c.Active()
			s.StopCoordinator(c, true)
			break
		}
		select {
		case <-ctx.Done():
			t.Errorf("no active coordinator to crash")
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
	if _, err := s.AddCoordinator(ctx); err != nil {
		t.Errorf("add a coordinator: %v", err)
		return false
	}
	crashed := time.Now()
	for {
		if c, ok := s.Active(); ok {
			if e, _ := c.Active(); e > old {
				t.Logf("coordinator crashed (epoch %d); epoch %d active %v later", old, e, time.Since(crashed).Round(time.Millisecond))
				return true
			}
		}
		select {
		case <-ctx.Done():
			t.Errorf("no coordinator took over")
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// bcTaskWatch follows the broadcast bucket: for every task, the bucket
// revision at which it was first seen persisted (its keys are held from
// before then) and the one at which it became a tombstone (they are
// released after).
type bcTaskWatch struct {
	mu          sync.Mutex
	first, tomb map[uint64]uint64
}

// bcWatchTasks starts a watch of the broadcast bucket until the test ends.
func bcWatchTasks(t *testing.T, s *system.System) *bcTaskWatch {
	ctx, cancel := context.WithCancel(context.Background())
	js, err := njs.New(s.Conn())
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, s.Codec.Cluster().BucketName(streamwal.BucketBroadcast))
	require.NoError(t, err)
	w, err := kv.WatchAll(ctx)
	require.NoError(t, err)
	tw := &bcTaskWatch{first: map[uint64]uint64{}, tomb: map[uint64]uint64{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.Updates() {
			if e == nil || e.Operation() != njs.KeyValuePut {
				continue
			}
			var task struct {
				ID    uint64 `json:"id"`
				State string `json:"state"`
			}
			if json.Unmarshal(e.Value(), &task) != nil {
				continue
			}
			tw.mu.Lock()
			if _, ok := tw.first[task.ID]; !ok {
				tw.first[task.ID] = e.Revision()
			}
			if task.State == "TOMBSTONE" {
				tw.tomb[task.ID] = e.Revision()
			}
			tw.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = w.Stop()
		cancel()
		<-done
	})
	return tw
}

// intervals waits until every task of ids is a tombstone and returns,
// per task, the revisions between which it held its keys.
func (tw *bcTaskWatch) intervals(t *testing.T, ids []uint64) map[uint64][2]uint64 {
	out := map[uint64][2]uint64{}
	require.Eventually(t, func() bool {
		tw.mu.Lock()
		defer tw.mu.Unlock()
		for _, id := range ids {
			end, ok := tw.tomb[id]
			if !ok {
				return false
			}
			out[id] = [2]uint64{tw.first[id], end}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond, "every task seen as a tombstone in the broadcast bucket")
	return out
}

// bcBackend is a read backend on the system's connection.
func bcBackend(t testing.TB, s *system.System) jetstream.Backend {
	be, err := jetstream.New(s.Conn(), s.Codec, jetstream.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = be.Close() })
	return be
}

// bcTarget parses a broadcast target: a VChannel (or the CChannel), or a
// PChannel of a cluster barrier.
func bcTarget(t testing.TB, name string) (streamwal.PChannel, streamwal.VChannel) {
	if v, err := streamwal.ParseVChannel(name); err == nil {
		return v.PChannel(), v
	}
	p, err := streamwal.ParsePChannel(name)
	require.NoError(t, err, "target %q", name)
	return p, streamwal.VChannel{}
}

// bcReadable are the types a reader asks for so that every message of a
// stream comes out of the pipeline (no transactions are used here).
var bcReadable = func() []*messages.Type {
	var out []*messages.Type
	for _, typ := range messages.Builtins() {
		switch typ {
		case messages.TypeTxn, messages.TypeBeginTxn, messages.TypeCommitTxn, messages.TypeRollbackTxn:
			continue
		}
		out = append(out, typ)
	}
	return out
}()

// bcLast is the sequence of the last message a reader of target sees
// (0: none).
func bcLast(t testing.TB, s *system.System, p streamwal.PChannel, v streamwal.VChannel) messages.MessageID {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := njs.New(s.Conn())
	require.NoError(t, err)
	c := s.Codec.Cluster()
	st, err := js.Stream(ctx, c.StreamName(p))
	require.NoError(t, err)
	subjects := c.PChannelFilter(p)
	if !v.IsZero() {
		subjects = c.VChannelFilter(v)
	}
	var last uint64
	for _, subj := range subjects {
		m, err := st.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, njs.ErrMsgNotFound) {
			continue
		}
		require.NoError(t, err, "last message on %s", subj)
		last = max(last, m.Sequence)
	}
	return messages.MessageID(last)
}

// bcReadIDs reads target (VChannel, CChannel or PChannel) with read.Open
// from the start to its last message as of the call and returns its
// messages of the given types, in order.
func bcReadIDs(t testing.TB, s *system.System, be jetstream.Backend, target string, types ...*messages.Type) []*messages.ImmutableMessage {
	t.Helper()
	p, v := bcTarget(t, target)
	codec := s.Codec
	last := bcLast(t, s, p, v)
	if last == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc, err := read.Open(ctx, read.Options{Backend: be, Codec: codec, PChannel: p, VChannel: v, Start: read.Earliest(), Types: bcReadable})
	require.NoError(t, err)
	defer sc.Close()
	var out []*messages.ImmutableMessage
	for {
		m, err := sc.Next(ctx)
		require.NoError(t, err, "read %s up to %d", target, last)
		if slices.Contains(types, m.Type()) {
			out = append(out, m)
		}
		if m.ID() >= last {
			return out
		}
	}
}

// bcAwaitReplica reads target from the start until a replica of typ (of
// broadcast id, or any if id is 0) appears, and returns it.
func bcAwaitReplica(ctx context.Context, t testing.TB, be jetstream.Backend, codec *messages.Codec, target string, typ *messages.Type, id uint64) *messages.ImmutableMessage {
	t.Helper()
	m, err := bcReplica(ctx, be, codec, target, typ, id)
	require.NoError(t, err)
	return m
}

// bcReplica is bcAwaitReplica for any goroutine.
func bcReplica(ctx context.Context, be jetstream.Backend, codec *messages.Codec, target string, typ *messages.Type, id uint64) (*messages.ImmutableMessage, error) {
	var p streamwal.PChannel
	v, err := streamwal.ParseVChannel(target)
	if err == nil {
		p = v.PChannel()
	} else if p, err = streamwal.ParsePChannel(target); err != nil {
		return nil, err
	}
	sc, err := read.Open(ctx, read.Options{Backend: be, Codec: codec, PChannel: p, VChannel: v, Start: read.Earliest(), Types: []*messages.Type{typ}})
	if err != nil {
		return nil, err
	}
	defer sc.Close()
	for {
		m, err := sc.Next(ctx)
		if err != nil {
			return nil, fmt.Errorf("await %s on %s: %w", typ.Name, target, err)
		}
		if bh := m.Broadcast(); bh != nil && (id == 0 || bh.ID == id) {
			return m, nil
		}
	}
}
