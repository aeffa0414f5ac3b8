package wal_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/lifecycle"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
	"github.com/streamwal/streamwal/services/node/wal"
)

// Crash modes of a crashStore.
const (
	// crashFrom fails every write from the k-th one after arming.
	crashFrom = iota
	// crashCheckpoint fails every checkpoint write and lets metadata
	// writes land: the metadata runs ahead of the checkpoint.
	crashCheckpoint
	// crashLanded lets the k-th write land but reports it failed (an
	// unknown outcome), then fails every write.
	crashLanded
	// crashAll fails every write at once.
	crashAll
)

var crashModeNames = []string{"from-kth", "checkpoint-only", "kth-lands-unacked", "all"}

// crashStore is a recovery.Faulty around a Memory store that, once armed,
// fails writes as its mode says: a crash of the node, seen from the store.
type crashStore struct {
	mem    *recovery.Memory
	faulty *recovery.Faulty
	cpKey  string

	mu        sync.Mutex
	armed     bool
	mode      int
	countdown int  // writes still let through (crashFrom, crashLanded)
	failing   bool // every write fails
	failed    int  // writes refused or reported failed since arming
	landed    int  // checkpoint writes that took effect
}

// newCrashStore returns a store for p's keys that works until armed.
func newCrashStore(p streamwal.PChannel) *crashStore {
	s := &crashStore{mem: recovery.NewMemory(), cpKey: streamwal.CheckpointKey(p)}
	s.faulty = &recovery.Faulty{Store: s.mem, Fail: s.before, After: s.after}
	return s
}

// arm starts failing writes as mode says, after k writes for the modes
// that count.
func (s *crashStore) arm(mode, k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed, s.mode, s.countdown, s.failing, s.failed = true, mode, k, mode == crashAll, 0
}

// disarm lets every write through again (the next node, healthy).
func (s *crashStore) disarm() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed, s.failing = false, false
}

func (s *crashStore) before(op, key string) error {
	if op == recovery.OpGet {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.armed {
		return nil
	}
	if s.failing {
		s.failed++
		return errStoreDown
	}
	switch s.mode {
	case crashCheckpoint:
		if key == s.cpKey {
			s.failed++
			return errStoreDown
		}
	case crashFrom:
		if s.countdown == 0 {
			s.failing = true
			s.failed++
			return errStoreDown
		}
		s.countdown--
	}
	return nil
}

// checkpoints counts the checkpoint writes that took effect.
func (s *crashStore) checkpoints() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.landed
}

func (s *crashStore) after(op, key string) error {
	if op == recovery.OpGet {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if op == recovery.OpPut && key == s.cpKey {
		s.landed++
	}
	if !s.armed || s.mode != crashLanded {
		return nil
	}
	if s.countdown == 0 {
		s.failing = true
		s.failed++
		return errStoreDown
	}
	s.countdown--
	return nil
}

// mcoll is the workload's model of one collection (one VChannel).
type mcoll struct {
	v       streamwal.VChannel
	live    map[int64]bool
	gone    map[int64]bool
	dropped bool
}

// partitions lists the live partitions, sorted.
func (c *mcoll) partitions() []int64 {
	var out []int64
	for p := range c.live {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// workload drives random DDL, inserts, transactions and flushes through a
// WAL, predicting from its model which appends the lifecycle refuses.
type workload struct {
	t     *testing.T
	e     *storageEnv
	rng   *rand.Rand
	colls []*mcoll
	next  int64 // the next collection ID
	rows  uint64
	ops   int
}

func (k *workload) live() []*mcoll {
	var out []*mcoll
	for _, c := range k.colls {
		if !c.dropped {
			out = append(out, c)
		}
	}
	return out
}

// pick returns a random element of s.
func pick[T any](rng *rand.Rand, s []T) T { return s[rng.IntN(len(s))] }

// payload is a random insert payload of 20 to 200 bytes.
func (k *workload) payload() string {
	n := 20 + k.rng.IntN(180)
	return fmt.Sprintf("op %d %s", k.ops, strings.Repeat("x", n))
}

// insertMsg builds an insert into partition pid of c with rows rows.
func (k *workload) insertMsg(c *mcoll, pid int64, rows uint64, opts ...messages.Option) *messages.MutableMessage {
	return k.e.insert(c.v, k.payload(), append([]messages.Option{messages.WithDML(pid, rows)}, opts...)...)
}

// livePartition is a random live partition of c, or 0 (none in
// particular).
func (k *workload) livePartition(c *mcoll) int64 {
	ps := c.partitions()
	if len(ps) == 0 || k.rng.IntN(4) == 0 {
		return 0
	}
	return pick(k.rng, ps)
}

// mustAppend appends m, which the model says is accepted.
func (k *workload) mustAppend(w *wal.WAL, m *messages.MutableMessage, what string) *messages.ImmutableMessage {
	k.t.Helper()
	im, err := w.Append(context.Background(), m)
	require.NoError(k.t, err, "op %d: %s", k.ops, what)
	return im
}

// mustRefuse appends m, which the model says the lifecycle refuses.
func (k *workload) mustRefuse(w *wal.WAL, m *messages.MutableMessage, what string) {
	k.t.Helper()
	_, err := w.Append(context.Background(), m)
	require.ErrorIs(k.t, err, streamwal.ErrLifecycle, "op %d: %s", k.ops, what)
}

// createCollection creates a new collection with up to three partitions.
func (k *workload) createCollection(w *wal.WAL) {
	c := &mcoll{v: k.e.vchannel(k.next), live: map[int64]bool{}, gone: map[int64]bool{}}
	k.next++
	var ps []int64
	for p := int64(1); p <= 4; p++ {
		if k.rng.IntN(2) == 0 {
			ps = append(ps, p)
			c.live[p] = true
		}
	}
	k.e.createCollection(w, c.v, ps...)
	k.colls = append(k.colls, c)
}

// step runs one random operation.
func (k *workload) step(w *wal.WAL) {
	k.t.Helper()
	k.ops++
	ctx := context.Background()
	live := k.live()
	if len(live) == 0 {
		k.createCollection(w)
		return
	}
	c := pick(k.rng, live)
	switch r := k.rng.IntN(100); {
	case r < 6:
		if len(live) < 4 {
			k.createCollection(w)
		}
	case r < 11: // CreatePartition: new, live or gone
		pid := 1 + k.rng.Int64N(6)
		m := ruleDDL(k.t, k.e.env, messages.TypeCreatePartition, c.v, pid)
		if c.live[pid] || c.gone[pid] {
			k.mustRefuse(w, m, fmt.Sprintf("create partition %d of %s again", pid, c.v))
			return
		}
		k.mustAppend(w, m, "create partition")
		c.live[pid] = true
	case r < 16: // DropPartition of a live one
		ps := c.partitions()
		if len(ps) == 0 {
			return
		}
		pid := pick(k.rng, ps)
		k.mustAppend(w, ruleDDL(k.t, k.e.env, messages.TypeDropPartition, c.v, pid), "drop partition")
		delete(c.live, pid)
		c.gone[pid] = true
	case r < 19: // DropCollection
		if len(live) < 2 {
			return
		}
		k.mustAppend(w, ruleDropCollection(k.t, k.e.env, c.v), "drop collection")
		c.dropped = true
	case r < 55: // inserts into a live partition
		for range 1 + k.rng.IntN(3) {
			rows := 1 + k.rng.Uint64N(4)
			k.mustAppend(w, k.insertMsg(c, k.livePartition(c), rows), "insert")
			k.rows += rows
		}
	case r < 62: // an insert the lifecycle refuses
		k.refusedInsert(w)
	case r < 75: // a session transaction, committed or rolled back
		tc, err := w.BeginTxn(ctx, c.v, 0)
		require.NoError(k.t, err)
		var rows uint64
		for range 1 + k.rng.IntN(3) {
			n := 1 + k.rng.Uint64N(3)
			k.mustAppend(w, k.insertMsg(c, k.livePartition(c), n, messages.WithTxn(tc)), "txn body")
			rows += n
		}
		if k.rng.IntN(3) == 0 {
			_, err = w.RollbackTxn(ctx, c.v, tc)
		} else {
			_, err = w.CommitTxn(ctx, c.v, tc)
		}
		require.NoError(k.t, err)
		k.rows += rows // rolled back or not, the rows are in the stream
	case r < 85: // a whole transaction
		var body []*messages.MutableMessage
		for range 1 + k.rng.IntN(4) {
			n := 1 + k.rng.Uint64N(3)
			body = append(body, k.insertMsg(c, k.livePartition(c), n))
			k.rows += n
		}
		_, err := w.AppendTxn(ctx, c.v, 0, body...)
		require.NoError(k.t, err)
	default:
		k.mustAppend(w, ruleManualFlush(k.t, k.e.env, c.v), "manual flush")
	}
}

// refusedInsert appends an insert into a dropped partition or collection,
// if there is one, and requires the lifecycle to refuse it.
func (k *workload) refusedInsert(w *wal.WAL) {
	k.t.Helper()
	for _, c := range k.colls {
		if c.dropped {
			k.mustRefuse(w, k.insertMsg(c, 0, 1), "insert into dropped collection "+c.v.String())
			break
		}
	}
	for _, c := range k.live() {
		for pid := range c.gone {
			k.mustRefuse(w, k.insertMsg(c, pid, 1), fmt.Sprintf("insert into dropped partition %d of %s", pid, c.v))
			return
		}
	}
}

// probe checks the lifecycle rules right after an open: every insert
// into a dropped collection or partition is refused, one into each live
// partition accepted.
func (k *workload) probe(w *wal.WAL) {
	k.t.Helper()
	for _, c := range k.colls {
		if c.dropped {
			k.mustRefuse(w, k.insertMsg(c, 0, 1), "after reopen: insert into dropped collection "+c.v.String())
			continue
		}
		for pid := range c.gone {
			k.mustRefuse(w, k.insertMsg(c, pid, 1), fmt.Sprintf("after reopen: insert into dropped partition %d of %s", pid, c.v))
		}
		for _, pid := range append(c.partitions(), 0) {
			k.mustAppend(w, k.insertMsg(c, pid, 1), fmt.Sprintf("after reopen: insert into live partition %d of %s", pid, c.v))
			k.rows++
		}
	}
}

// flushAndClose flushes a live collection with a growing segment, waits
// until the ledger consumed its Flush and closes the WAL at once: most
// often before the storage loop stored the segment, so the final round
// persists it flushed out but not stored.
func (k *workload) flushAndClose(w *wal.WAL) {
	k.t.Helper()
	st, _ := w.StorageState()
	var seg shard.Segment
	for _, s := range st.Segments {
		if s.State == shard.Growing && s.Rows > 0 && slices.ContainsFunc(k.live(), func(c *mcoll) bool { return c.v == s.VChannel }) {
			seg = s
			break
		}
	}
	if seg.ID != 0 {
		k.mustAppend(w, ruleManualFlush(k.t, k.e.env, seg.VChannel), "manual flush before close")
		waitFor(k.t, "the flush consumed", func() bool {
			st, _ := w.StorageState()
			s, ok := segmentOf(st, seg.ID)
			return ok && s.FlushedAt != 0
		})
	}
	require.NoError(k.t, w.Close())
}

// quietConfig is the configuration of a WAL that appends nothing of its
// own after its barrier (no sync loop, no storage round until Close), so
// that its state is the state its open recovered.
func quietConfig(e *storageEnv, term uint64, store recovery.Store) wal.Config {
	cfg := e.storageConfig(term)
	cfg.SyncInterval = time.Hour
	cfg.Storage.Store = store
	return cfg
}

// recoveredState opens a quiet WAL of term on store and returns its
// storage state right after the open; crash, if set, makes its final
// round fail.
func recoveredState(t *testing.T, e *storageEnv, term uint64, store recovery.Store, crash *crashStore) (*wal.WAL, wal.StorageState) {
	t.Helper()
	w, err := wal.Open(context.Background(), quietConfig(e, term, store))
	require.NoError(t, err, "open term %d", term)
	st, ok := w.StorageState()
	require.True(t, ok)
	if crash != nil {
		crash.arm(crashAll, 0)
	}
	require.NoError(t, w.Close())
	if crash != nil {
		crash.disarm()
	}
	return w, st
}

// determined is the part of a storage state that replay determines: the
// VChannel records and the persisted fields of the segments, flushed
// folded into sealed (whether a flushed-out segment was stored yet is a
// fact of the object store, not of the stream), and the rows they hold.
func determined(t *testing.T, st wal.StorageState) (vchannels []lifecycle.Record, segments string, rows uint64) {
	t.Helper()
	vchannels = st.VChannels
	segs := make([]shard.Segment, 0, len(st.Segments))
	for _, s := range st.Segments {
		if s.State == shard.Flushed {
			s.State = shard.Sealed
		}
		rows += s.Rows
		segs = append(segs, s)
	}
	b, err := json.MarshalIndent(segs, "", " ")
	require.NoError(t, err)
	return vchannels, string(b), rows
}

// checkRecovery opens the PChannel quietly on the crashed store (from its
// checkpoint) and then on a fresh store (full replay from the first
// message), and requires both to recover the same state: what replay from
// the checkpoint rebuilds on top of the persisted metadata equals what a
// replay of the whole log builds. Both open quietly and their final
// rounds change nothing the next owner relies on (the crashed store's
// fails). It returns the next term.
func checkRecovery(t *testing.T, e *storageEnv, k *workload, store *crashStore, term uint64, what string) uint64 {
	t.Helper()
	stored := storedCheckpoint(t, store.mem, e.p)
	v, a := recoveredState(t, e, term, store.faulty, store)
	r, b := recoveredState(t, e, term+1, recovery.NewMemory(), nil)
	require.Equal(t, stored.MessageID, v.Recovered().From, "%s: replay from the stored checkpoint", what)
	require.Zero(t, r.Recovered().From, "%s: a fresh store replays from the first message", what)
	require.Equal(t, v.Barrier().ID()+1, r.Barrier().ID(), "%s: nothing landed between the two opens", what)

	va, sa, rowsA := determined(t, a)
	vb, sb, rowsB := determined(t, b)
	require.Equal(t, vb, va, "%s: vchannels from the checkpoint (term %d) and from a full replay (term %d)", what, term, term+1)
	require.Equal(t, sb, sa, "%s: segments from the checkpoint (term %d) and from a full replay (term %d)", what, term, term+1)
	require.Equal(t, k.rows, rowsB, "%s: every acknowledged row is in a segment", what)
	require.Equal(t, k.rows, rowsA)
	// Both consumed everything through their own barrier, without a gap.
	require.Equal(t, v.Barrier().ID(), a.Consumed.Consumed, "%s", what)
	require.Equal(t, r.Barrier().ID(), b.Consumed.Consumed, "%s", what)
	require.Equal(t, v.Barrier().TimeTick(), a.Consumed.TimeTick, "%s", what)
	require.Equal(t, r.Barrier().TimeTick(), b.Consumed.TimeTick, "%s", what)
	return term + 2
}

// storedThrough is the TimeTicks the stored VChannel and segment metadata
// say they reflect (0 when missing).
func storedThrough(t *testing.T, s recovery.Store, p streamwal.PChannel) (vchannels, segments messages.TimeTick) {
	t.Helper()
	var out [2]messages.TimeTick
	for i, key := range []string{streamwal.VChannelMetaKey(p), streamwal.SegmentMetaKey(p)} {
		raw, _, err := s.Get(context.Background(), key)
		if err != nil {
			continue
		}
		var v struct {
			TimeTick messages.TimeTick `json:"timetick"`
		}
		require.NoError(t, json.Unmarshal(raw, &v))
		out[i] = v.TimeTick
	}
	return out[0], out[1]
}

// settleUploads waits until the WAL stored every flushed-out segment.
func settleUploads(t *testing.T, w *wal.WAL, what string) {
	t.Helper()
	waitForWithin(t, 10*time.Second, what+": every flushed-out segment stored", func() bool {
		st, _ := w.StorageState()
		for _, s := range st.Segments {
			if s.FlushedAt != 0 && s.State != shard.Flushed {
				return false
			}
		}
		return true
	})
}

// TestMetamorphicRecovery runs random workloads (collection and partition
// DDL on several VChannels, inserts, session and whole transactions,
// manual flushes, with segments small enough to seal and flush) and
// crashes the node at a random point: the store starts failing writes at
// a random one, possibly between the parts of a persist round, and the WAL
// closes without a final round. After each of three crashes in a row, the
// state recovered from the checkpoint must equal the state of a full
// replay on an empty store, and the lifecycle must hold.
func TestMetamorphicRecovery(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4, 5, 6} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			p, err := streamwal.NewPChannel("p", 0)
			require.NoError(t, err)
			store := newCrashStore(p)
			e := newStorageEnv(t, store.faulty)
			e.shard = shard.Config{Capacity: 1 << 10, Jitter: []float64{-1, 0.3}[rng.IntN(2)]}
			if rng.IntN(2) == 0 {
				e.shard.MaxRows = 12
			}
			if seed%2 == 0 {
				e.retain = 0 // truncate as far as the checkpoint and the segments allow
			}
			k := &workload{t: t, e: e, rng: rng, next: 1}
			term := uint64(1)
			for crash := range 3 {
				w := openWith(t, e.storageConfig(term))
				term++
				k.probe(w)
				// The crash comes at a random operation, once this owner
				// persisted a random number of rounds (0 to 2), and a few
				// operations before the WAL closes.
				at, want, post := rng.IntN(40), rng.IntN(3), rng.IntN(15)
				mode, after := rng.IntN(crashAll), rng.IntN(6)
				base, armed := store.checkpoints(), -1
				for i := 0; armed < 0 || i < armed+post; i++ {
					require.Less(t, i, 3000, "persisted %d rounds in 3000 operations", store.checkpoints()-base)
					if armed < 0 && i >= at && store.checkpoints()-base >= want {
						store.arm(mode, after)
						armed = i
					}
					k.step(w)
				}
				// Uploads go to the object store, not the failing store:
				// every owner stores what was flushed out before it.
				settleUploads(t, w, fmt.Sprintf("owner of term %d", term-1))
				require.NoError(t, w.Close())
				st, _ := w.StorageState()
				vt, sgt := storedThrough(t, store.mem, e.p)
				t.Logf("crash %d (%s after %d writes, at op %d, after %d rounds, %d ops before closing): consumed %d, persisted %d, %d segments; stored checkpoint at %d, vchannels at %d, segments at %d",
					crash, crashModeNames[mode], after, armed, store.checkpoints()-base, post, st.Consumed.Consumed, st.Persisted.Consumed, len(st.Segments),
					storedCheckpoint(t, store.mem, e.p).TimeTick, vt, sgt)
				store.disarm()
				term = checkRecovery(t, e, k, store, term, fmt.Sprintf("after crash %d", crash))
			}
			// A last owner, healthy: the lifecycle holds, it stores every
			// segment flushed out before it, and after a graceful close its
			// checkpoint recovers the same state as a full replay.
			w := openWith(t, e.storageConfig(term))
			term++
			k.probe(w)
			for range 10 {
				k.step(w)
			}
			settleUploads(t, w, "last owner")
			k.flushAndClose(w)
			term = checkRecovery(t, e, k, store, term, "after a graceful close")
			settleUploads(t, openWith(t, e.storageConfig(term)), "owner after a graceful close")
		})
	}
}
