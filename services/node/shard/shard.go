// Package shard is the shard manager of a PChannel's WAL (DESIGN.md §1
// "Shard management", §10): it assigns every insert to a growing segment,
// runs the seal policies, and says when the Flush of a sealed segment may
// be appended. It is a plain data structure, not safe for concurrent use
// (except [Memory], which the managers of one node share): the WAL drives
// it under the mutex that orders its appends, with the clock it passes in,
// so that every rule is decided and tested without goroutines or a server.
//
// # Segments
//
// A segment holds the inserts of one VChannel and partition; an insert
// whose partition is <= 0 goes to partition 0 ("no particular partition").
// Each (VChannel, partition) has at most one growing segment. A segment is
// growing, then sealed (it takes no insert any more), then flushed (its
// data is in the object store, [Manager.MarkFlushed]). Between the last
// two it is flushed-out once the message after which no insert of it may
// follow landed: its Flush, or the DropCollection of its VChannel
// (Segment.FlushedAt). The caller chooses segment IDs (the WAL uses the
// TimeTick of the segment's CreateSegment); an ID is never used twice.
//
// # Live side
//
// The WAL calls, in stamp order: [Manager.Growing] for the segment an
// insert goes to, and when there is none it stamps a CreateSegment and
// calls [Manager.Create] with a new ID; [Manager.Stamp] once the insert is
// stamped; [Manager.Resolve] once its append resolved, landed or not. When
// it stamps ManualFlush, DropPartition, DropCollection, TruncateCollection
// or FlushAll it seals what they cover ([Manager.SealVChannel],
// [Manager.SealPartition], [Manager.SealAll]); it calls [Manager.Tick]
// on its clock, and appends the Flushes [Manager.Ready] hands out. These
// rules hold:
//
//   - every insert is in exactly one segment: the one Stamp names;
//   - no insert joins a sealed segment: Growing never returns one, and
//     Stamp refuses one ([ErrSealed]);
//   - an insert of an open transaction holds its segment until
//     [Manager.TxnEnded] (committed, rolled back, expired or aborted);
//   - Ready hands out the Flush of a sealed segment only once every
//     insert stamped into it resolved and no transaction holds it, and
//     hands it out once: again only after [Manager.FlushFailed]; once the
//     Flush landed, [Manager.FlushLanded] records where.
//
// An insert's size is what the caller says it is; [Manager.Apply] counts
// [InsertBytes] (its payload), so the WAL should stamp that too, to keep
// the live and replayed counts equal. An append that the stream
// deduplicated to an earlier message did not land (its rows were counted
// where the earlier one was). Rows of a transaction that is rolled back
// later stay counted: they are in the stream.
//
// A CreateSegment that did not land (or may not have) is reported with
// [Manager.CreateFailed]: the segment is sealed, so that inserts go to a
// new one, and flushed like any other. DropCollection flushes out its
// VChannel's segments without a Flush, which could not be appended after
// it: [Manager.Dropped] once it landed.
//
// # Seal policies
//
// Each policy names itself in the Flush's reason ([Reason]); see [Config]
// for the defaults and how each is turned off:
//
//   - capacity: the segment's bytes (landed plus in flight) reach its own
//     capacity, which is jittered when the segment is created so that the
//     segments of many VChannels do not seal together;
//   - rows: its rows (landed plus in flight) reach Config.MaxRows;
//   - lifetime: it was created Config.Lifetime ago;
//   - idle: no insert for Config.Idle, and at least Config.IdleMinBytes
//     landed;
//   - memory: the node's growing bytes ([Memory]) are above the high
//     water mark: the manager seals its largest growing segments first
//     until the node is at or below the low water mark. A segment's bytes
//     leave the account when it is sealed, for whatever reason;
//   - manual, flush_all, lifecycle: ManualFlush, FlushAll, and
//     DropPartition, DropCollection, TruncateCollection.
//
// Stamp applies capacity and rows at once, so a segment never takes an
// insert after the one that filled it; Tick applies them all. A segment
// keeps the reason it was first sealed for (under Apply, until its Flush
// names the writer's).
//
// # Landed side
//
// [Manager.Apply] takes the messages that landed, in stream order (the
// replay at recovery, or a reader that follows the stream): CreateSegment
// creates its segment, an insert carrying a segment ID counts as landed in
// it, Flush flushes out its segments (with the reason it names), and the
// seal messages seal what they cover. A CreateSegment of a VChannel and
// partition that still has a growing segment seals that one
// ([ReasonReplaced]): its writer sealed it by a policy, which writes no
// message, and its Flush will name why. Apply is idempotent: a message at
// or below the last one applied changes no segment, so a replay from a
// checkpoint that re-reads some messages is harmless. The live WAL
// resolves appends out of stream order, so it reports its own messages
// with the live methods, never with Apply; a manager fed both ways would
// count an insert twice.
//
// Apply also keeps the holds of open transactions (which are not
// persisted): an insert of a transaction holds its segment until the
// transaction's CommitTxn or RollbackTxn, an exclusive operation on its
// VChannel, or a message whose TimeTick passes its keepalive, as
// txn.Table.Replay decides; it does so for re-read messages too, so a
// replay from the checkpoint's MessageID (at or below the BeginTxn of
// every transaction open then) restores them. The WAL's transaction
// table then reports the sessions it continues with TxnEnded.
//
// # Persistence
//
// [Manager.Segments] is the segment metadata to persist (a [Segment]
// marshals as snake_case JSON); [Manager.Restore] rebuilds a manager from
// it and the ID of the last message it covers. A restored segment has
// nothing in flight and no transaction hold until the replay; one sealed
// but not flushed-out is handed out by Ready again. Restore(nil, 0)
// empties a manager and gives its bytes back to Memory (when its WAL
// closes).
//
// Errors are streamwal errors: bad input is streamwal.CodeInvalidArgument,
// a breach of the segment lifecycle streamwal.CodeLifecycle; each also
// matches one of the sentinels of this package with errors.Is.
package shard

import (
	"errors"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// Causes of shard errors; match them with errors.Is.
var (
	// ErrUnknownSegment: no segment has that ID (or it was forgotten).
	ErrUnknownSegment = errors.New("unknown segment")
	// ErrIDUsed: a new segment reuses an ID.
	ErrIDUsed = errors.New("segment id already used")
	// ErrGrowingExists: the VChannel and partition have a growing segment.
	ErrGrowingExists = errors.New("a growing segment exists")
	// ErrSealed: an insert for a sealed segment, or one landed after its
	// flush-out.
	ErrSealed = errors.New("segment sealed")
	// ErrFlushPending: MarkFlushed of a segment whose flush-out has not
	// landed.
	ErrFlushPending = errors.New("flush of segment has not landed")
	// ErrMalformed: a message body or a restored segment that does not
	// make sense.
	ErrMalformed = errors.New("malformed")
)

// Reason names the seal policy that fired; it goes into FlushBody.Reason.
type Reason string

// Seal reasons.
const (
	ReasonCapacity Reason = "capacity"
	ReasonRows     Reason = "rows"
	ReasonLifetime Reason = "lifetime"
	ReasonIdle     Reason = "idle"
	ReasonMemory   Reason = "memory"
	// ReasonManual: ManualFlush.
	ReasonManual Reason = "manual"
	// ReasonFlushAll: FlushAll.
	ReasonFlushAll Reason = "flush_all"
	// ReasonLifecycle: DropPartition, DropCollection, TruncateCollection.
	ReasonLifecycle Reason = "lifecycle"
	// ReasonCreateFailed: its CreateSegment did not land, or may not have.
	ReasonCreateFailed Reason = "create_failed"
	// ReasonReplaced: Apply met a newer CreateSegment of the segment's
	// VChannel and partition, so its writer had sealed it (by a policy,
	// which writes no message); the reason its Flush names replaces this
	// one when the Flush lands, as it replaces any reason Apply gave.
	ReasonReplaced Reason = "replaced"
)

// key is where a growing segment takes inserts.
type key struct {
	v         streamwal.VChannel
	partition int64
}

// partitionOf maps "no particular partition" (<= 0) to 0.
func partitionOf(p int64) int64 { return max(p, 0) }

// segment is a Segment with the manager's bookkeeping.
type segment struct {
	Segment
	// mem is what the segment counts in Config.Memory: its bytes, landed
	// and in flight, while growing; 0 once sealed.
	mem uint64
	// holds are the open transactions with rows in it.
	holds map[messages.TxnID]struct{}
}

// flushedOut reports whether no insert may follow any more.
func (s *segment) flushedOut() bool { return s.FlushedAt != 0 }

// Manager holds the segments of one PChannel.
type Manager struct {
	cfg  Config
	segs map[int64]*segment
	// growing indexes the growing segments.
	growing map[key]int64
	// pending are the sealed segments whose flush-out has not landed.
	pending map[int64]*segment
	txns    map[messages.TxnID]*hold
	// applied is the last message Apply applied (or Restore covered).
	applied messages.MessageID
	// forgotten is the largest ID Forget dropped: IDs up to it count as
	// used.
	forgotten int64
}

// New returns a manager without segments. Config fields left zero take
// their defaults; a bad field is a streamwal.CodeInvalidArgument error.
func New(cfg Config) (*Manager, error) {
	c, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	return &Manager{
		cfg: c, segs: map[int64]*segment{}, growing: map[key]int64{},
		pending: map[int64]*segment{}, txns: map[messages.TxnID]*hold{},
	}, nil
}

// Growing returns the growing segment an insert into partition of v goes
// to; ok is false when there is none (the caller creates one).
func (m *Manager) Growing(v streamwal.VChannel, partition int64) (id int64, ok bool) {
	id, ok = m.growing[key{v, partitionOf(partition)}]
	return id, ok
}

// Create records that the CreateSegment of segment id, on partition of v,
// was stamped at now (the physical time of its TimeTick). It fails if
// that partition has a growing segment ([ErrGrowingExists]) or the ID is
// not new ([ErrIDUsed]: known, or at or below one that was forgotten).
func (m *Manager) Create(v streamwal.VChannel, partition, id int64, now time.Time) error {
	if err := m.checkNew(v, id); err != nil {
		return err
	}
	k := key{v, partitionOf(partition)}
	if g, ok := m.growing[k]; ok {
		return streamwal.Errorf(streamwal.CodeLifecycle, "create segment %d on %s partition %d: segment %d: %w", id, v, k.partition, g, ErrGrowingExists)
	}
	m.add(k, id, now, m.cfg.Rand())
	return nil
}

// checkNew refuses a bad VChannel or an ID that is not new.
func (m *Manager) checkNew(v streamwal.VChannel, id int64) error {
	if v.IsZero() || v.IsControl() {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "create segment %d: needs a data vchannel, not %q: %w", id, v, ErrMalformed)
	}
	if id <= 0 {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "create segment %d on %s: the id must be positive: %w", id, v, ErrMalformed)
	}
	if _, ok := m.segs[id]; ok || id <= m.forgotten {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "create segment %d on %s: %w", id, v, ErrIDUsed)
	}
	return nil
}

// add creates a growing segment at k; u in [0, 1) draws its capacity.
func (m *Manager) add(k key, id int64, now time.Time, u float64) *segment {
	s := &segment{Segment: Segment{
		ID: id, VChannel: k.v, Partition: k.partition, State: Growing,
		Created: now, LastInsert: now, Capacity: m.cfg.capacity(u),
	}}
	m.segs[id] = s
	m.growing[k] = id
	return s
}

// Stamp records that an insert of rows and bytes was stamped into segment
// id at now; it is in flight until Resolve. A transaction's insert (txn
// != 0) holds the segment until TxnEnded. Stamp refuses an unknown
// segment ([ErrUnknownSegment]) and one that is not growing
// ([ErrSealed]). If the insert fills the segment (capacity or rows), the
// segment is sealed at once, with the insert in it.
func (m *Manager) Stamp(id int64, rows, bytes uint64, txn messages.TxnID, now time.Time) error {
	s, err := m.stampable(id)
	if err != nil {
		return err
	}
	s.InFlight++
	s.StampedRows += rows
	s.StampedBytes += bytes
	if now.After(s.LastInsert) {
		s.LastInsert = now
	}
	m.count(s, bytes)
	if txn != 0 {
		m.hold(txn, s).live = true
	}
	if r, ok := m.full(s); ok {
		m.seal(s, r)
	}
	return nil
}

// stampable returns segment id if it takes inserts.
func (m *Manager) stampable(id int64) (*segment, error) {
	s, ok := m.segs[id]
	if !ok {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "stamp into segment %d: %w", id, ErrUnknownSegment)
	}
	if s.State != Growing {
		return nil, streamwal.Errorf(streamwal.CodeLifecycle, "stamp into segment %d on %s: %s (%s): %w", id, s.VChannel, s.State, s.Reason, ErrSealed)
	}
	return s, nil
}

// Resolve records that the append of an insert Stamp counted in segment
// id resolved, with the rows and bytes it was stamped with: if it landed
// (at MessageID at, TimeTick tt), they count in Rows and Bytes and widen
// First..Last; if not, they are gone. A Resolve without a Stamp in flight
// changes nothing.
func (m *Manager) Resolve(id int64, rows, bytes uint64, landed bool, at messages.MessageID, tt messages.TimeTick) {
	s, ok := m.segs[id]
	if !ok || s.InFlight == 0 {
		return
	}
	s.InFlight--
	s.StampedRows = minus(s.StampedRows, rows)
	s.StampedBytes = minus(s.StampedBytes, bytes)
	if landed {
		s.land(rows, bytes, at, tt)
		return
	}
	m.uncount(s, bytes)
}

// land counts a landed insert.
func (s *segment) land(rows, bytes uint64, at messages.MessageID, tt messages.TimeTick) {
	s.Rows += rows
	s.Bytes += bytes
	if at != 0 {
		s.First, s.Last = lower(s.First, at), max(s.Last, at)
	}
	if tt != 0 {
		s.FirstTT, s.LastTT = lower(s.FirstTT, tt), max(s.LastTT, tt)
	}
}

// lower is the smaller of a and b, where zero means "none yet".
func lower[T ~uint64](a, b T) T {
	if a == 0 {
		return b
	}
	return min(a, b)
}

// minus is a - b, or 0 below.
func minus(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// TxnEnded records that transaction txn ended (committed, rolled back,
// expired or aborted): it holds no segment any more.
func (m *Manager) TxnEnded(txn messages.TxnID) { m.release(txn) }

// CreateFailed records that the CreateSegment of segment id did not land,
// or may not have: a growing segment is sealed (ReasonCreateFailed), so
// that later inserts go to a new segment, and it is flushed like any
// other once the inserts stamped into it resolved.
func (m *Manager) CreateFailed(id int64) {
	if s, ok := m.segs[id]; ok && s.State == Growing {
		m.seal(s, ReasonCreateFailed)
	}
}

// InsertBytes is the size Apply counts for an insert: its payload.
// It is known also of a message read without its payload (the replay reads
// headers only).
func InsertBytes(m interface{ PayloadSize() int }) uint64 { return uint64(m.PayloadSize()) }
