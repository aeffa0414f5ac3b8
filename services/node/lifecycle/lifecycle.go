// Package lifecycle is the collection and partition lifecycle table of a
// PChannel's WAL (DESIGN.md §5, "Lifecycle order the WAL enforces per
// VChannel"). The WAL asks Check before every append and tells Apply about
// every message that landed, live or while replaying its stream at
// recovery. It is a plain data structure, not safe for concurrent use; the
// WAL drives it under its ordering mutex.
//
// State is kept per VChannel: a VChannel is one shard of one collection, so
// its collection is the one its name carries (VChannel.CollectionID), and
// two shards of a collection have independent state, each created and
// dropped by its own replica of the DDL broadcast.
//
// Rules Check enforces on a VChannel:
//   - CreateCollection only while the VChannel has no collection
//     (ErrCollectionExists, ErrCollectionDropped), except for an idempotent
//     retry: a CreateCollection whose non-empty message ID equals that of
//     the CreateCollection that created the collection passes, because the
//     storage layer deduplicates it by that ID;
//   - every other message needs the collection (ErrCollectionNotFound);
//   - after DropCollection nothing passes (ErrCollectionDropped) but a
//     retry of that DropCollection with its non-empty message ID, and the
//     Flush the WAL appends for the segments the drop sealed;
//   - CreatePartition needs a partition that neither exists
//     (ErrPartitionExists) nor was dropped (ErrPartitionDropped): partition
//     IDs are never reused;
//   - DropPartition needs a live partition (ErrPartitionNotFound,
//     ErrPartitionDropped);
//   - a DML message (a type with messages.FlagTxnBody: Insert, Delete,
//     Upsert and application types declared so) whose DML header names a
//     partition (PartitionID > 0) needs that partition live
//     (ErrPartitionNotFound, ErrPartitionDropped); PartitionID <= 0 means no
//     particular partition.
//
// Exempt, and ignored by Apply: PChannel-level messages, messages on the
// CChannel (the cluster's control stream carries the DDL of every
// collection, not one collection's life), and the WAL-internal TimeTick and
// RecoveryBarrier. Every other type (transaction control, AlterCollection,
// TruncateCollection, Import, CreateSegment, Flush, ManualFlush,
// application types) only needs the collection to be live. Segment
// lifecycle (CreateSegment before inserts, nothing after Flush) is not
// tracked here.
//
// Every refusal is a streamwal.CodeLifecycle error that also matches one of
// the sentinels of this package with errors.Is, and says what and where:
//
//	LIFECYCLE_VIOLATION: Insert into partition 7 of collection 42 on pchan-0_42v0: partition dropped
//
// Bodies. The table reads a message body only where it needs its content:
// CreateCollection (the initial partitions) and CreatePartition and
// DropPartition (the partition). Such a body is malformed if it does not
// decode, names another collection than the VChannel's (a non-zero
// CollectionID that differs), or carries a partition ID <= 0 or the same
// partition twice; that is a streamwal.CodeInvalidArgument error from Check
// and Apply alike, so whatever Check accepts, Apply can record. DML is
// checked from its header alone: a map lookup for the VChannel and one for
// the partition.
//
// Apply never refuses a landed message for lifecycle reasons: the WAL is the
// source of truth and Check is what keeps violations out. It records what
// a message means where that makes sense and ignores it otherwise, so it is
// idempotent: a second CreateCollection, CreatePartition or DropPartition
// of the same thing, or anything on a dropped collection, changes nothing.
// DropCollection frees the partition sets but keeps the dropped marker and
// its message ID, so retries are still recognised and the VChannel is
// never reused.
//
// Recovery storage keeps the table as VChannel metadata: Export gives one
// Record per VChannel, and Restore rebuilds a table that checks and applies
// exactly as the exported one did, so that a WAL opened from a checkpoint
// replays only what came after it.
package lifecycle

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// The causes of lifecycle refusals: the streamwal sentinels, whose
// reasons cross the request hop. Each error Check returns wraps one of
// them (errors.Is matches it on either side of the hop) and also matches
// streamwal.ErrLifecycle.
var (
	// ErrCollectionNotFound: the VChannel's collection was never created.
	ErrCollectionNotFound = streamwal.ErrCollectionNotFound
	// ErrCollectionExists: CreateCollection of a collection that exists.
	ErrCollectionExists = streamwal.ErrCollectionExists
	// ErrCollectionDropped: the VChannel's collection was dropped.
	ErrCollectionDropped = streamwal.ErrCollectionDropped
	// ErrPartitionNotFound: the partition was never created.
	ErrPartitionNotFound = streamwal.ErrPartitionNotFound
	// ErrPartitionExists: CreatePartition of a live partition.
	ErrPartitionExists = streamwal.ErrPartitionExists
	// ErrPartitionDropped: the partition was dropped; its ID is never reused.
	ErrPartitionDropped = streamwal.ErrPartitionDropped
)

// State is the lifecycle state of one VChannel's collection.
type State struct {
	// Created reports that a CreateCollection landed.
	Created bool
	// Dropped reports that a DropCollection landed.
	Dropped bool
	// Partitions are the live partitions, sorted; nil once dropped.
	Partitions []int64
}

// vchannel is the state of one VChannel. An entry exists once its
// collection was created or dropped.
type vchannel struct {
	created, dropped     bool
	createdBy, droppedBy string // message IDs of the CreateCollection and DropCollection
	live, gone           map[int64]struct{}
	// by holds the message IDs of the partition DDL that landed, so that a
	// resumed broadcast's repeat of one passes (the stream deduplicates it).
	by map[string]struct{}
}

// repeat reports whether m repeats a partition DDL that landed.
func (s *vchannel) repeat(m *messages.MutableMessage) bool {
	_, ok := s.by[m.MsgID()]
	return ok && m.MsgID() != ""
}

// Table is the collection and partition lifecycle state of the VChannels of
// one PChannel. Plain data structure, not safe for concurrent use.
type Table struct {
	vs map[streamwal.VChannel]*vchannel
}

// NewTable returns a table in which no VChannel has a collection.
func NewTable() *Table { return &Table{vs: map[streamwal.VChannel]*vchannel{}} }

// exempt reports whether messages of t on v are outside the lifecycle.
func exempt(t *messages.Type, v streamwal.VChannel) bool {
	return v.IsZero() || v.IsControl() || t == messages.TypeTimeTick || t == messages.TypeRecoveryBarrier
}

// Check reports whether m may be appended now; it changes nothing. Errors
// match streamwal.ErrLifecycle (streamwal.CodeLifecycle) and, with
// errors.Is, one of the sentinels of this package; a malformed lifecycle
// body (see the package doc) is a streamwal.CodeInvalidArgument error.
func (t *Table) Check(m *messages.MutableMessage) error {
	if m == nil {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "lifecycle check of a nil message")
	}
	typ, v := m.Type(), m.VChannel()
	if exempt(typ, v) {
		return nil
	}
	s := t.vs[v]
	if s != nil && s.dropped {
		if typ == messages.TypeDropCollection && m.MsgID() != "" && m.MsgID() == s.droppedBy {
			return nil
		}
		if typ == messages.TypeFlush {
			return nil // closes the segments the drop sealed
		}
		return violation(typ, v, "", ErrCollectionDropped)
	}
	if typ == messages.TypeCreateCollection {
		if s != nil && (m.MsgID() == "" || m.MsgID() != s.createdBy) {
			return violation(typ, v, "", ErrCollectionExists)
		}
		_, err := createBody(m, v)
		return err
	}
	if s == nil {
		return violation(typ, v, "", ErrCollectionNotFound)
	}
	switch {
	case (typ == messages.TypeCreatePartition || typ == messages.TypeDropPartition) && s.repeat(m):
		return nil
	case typ == messages.TypeCreatePartition:
		pid, err := partitionBody(m, v)
		if err != nil {
			return err
		}
		if _, ok := s.live[pid]; ok {
			return violation(typ, v, partition(pid, false), ErrPartitionExists)
		}
		if _, ok := s.gone[pid]; ok {
			return violation(typ, v, partition(pid, false), ErrPartitionDropped)
		}
	case typ == messages.TypeDropPartition:
		pid, err := partitionBody(m, v)
		if err != nil {
			return err
		}
		return s.needLive(typ, v, pid, false)
	case typ.Is(messages.FlagTxnBody):
		if h := m.Header(); h.DML != nil && h.DML.PartitionID > 0 {
			return s.needLive(typ, v, h.DML.PartitionID, true)
		}
	}
	return nil
}

// remember records the message ID of a partition DDL that landed.
func (s *vchannel) remember(id string) {
	if id == "" {
		return
	}
	if s.by == nil {
		s.by = map[string]struct{}{}
	}
	s.by[id] = struct{}{}
}

// needLive refuses unless partition pid is live; dml says how to name it.
func (s *vchannel) needLive(typ *messages.Type, v streamwal.VChannel, pid int64, dml bool) error {
	if _, ok := s.live[pid]; ok {
		return nil
	}
	if _, ok := s.gone[pid]; ok {
		return violation(typ, v, partition(pid, dml), ErrPartitionDropped)
	}
	return violation(typ, v, partition(pid, dml), ErrPartitionNotFound)
}

// Apply records a message that landed in the WAL (live, or during replay of
// the stream at recovery). Messages that do not change lifecycle state are
// ignored. A malformed lifecycle body is an error
// (streamwal.CodeInvalidArgument) and changes nothing.
func (t *Table) Apply(m *messages.ImmutableMessage) error {
	if m == nil {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "lifecycle apply of a nil message")
	}
	typ, v := m.Type(), m.VChannel()
	if exempt(typ, v) {
		return nil
	}
	s := t.vs[v]
	switch typ {
	case messages.TypeCreateCollection:
		pids, err := createBody(m, v)
		if err != nil {
			return err
		}
		if s != nil {
			return nil // a retry, or a collection already dropped
		}
		s = &vchannel{created: true, createdBy: m.MsgID(), live: make(map[int64]struct{}, len(pids)), gone: map[int64]struct{}{}}
		for _, pid := range pids {
			s.live[pid] = struct{}{}
		}
		t.vs[v] = s
	case messages.TypeDropCollection:
		if s == nil {
			s = &vchannel{}
			t.vs[v] = s
		}
		if !s.dropped {
			s.dropped, s.droppedBy = true, m.MsgID()
			s.live, s.gone = nil, nil
		}
	case messages.TypeCreatePartition:
		pid, err := partitionBody(m, v)
		if err != nil {
			return err
		}
		if s == nil || s.dropped {
			return nil
		}
		if _, ok := s.gone[pid]; !ok {
			s.live[pid] = struct{}{}
		}
		s.remember(m.MsgID())
	case messages.TypeDropPartition:
		pid, err := partitionBody(m, v)
		if err != nil {
			return err
		}
		if s == nil || s.dropped {
			return nil
		}
		delete(s.live, pid)
		s.gone[pid] = struct{}{}
		s.remember(m.MsgID())
	}
	return nil
}

// State reports the state of v's collection (for tests and status).
func (t *Table) State(v streamwal.VChannel) State {
	s := t.vs[v]
	if s == nil {
		return State{}
	}
	st := State{Created: s.created, Dropped: s.dropped}
	if len(s.live) > 0 {
		st.Partitions = slices.Sorted(maps.Keys(s.live))
	}
	return st
}

// violation builds a lifecycle refusal; what names the partition, if any
// (see partition).
func violation(typ *messages.Type, v streamwal.VChannel, what string, cause error) error {
	return streamwal.Errorf(streamwal.CodeLifecycle, "%s%s of collection %d on %s: %w", typ.Name, what, v.CollectionID(), v, cause)
}

// partition names the partition of a refused message: after the type of a
// partition DDL ("DropPartition 7"), after "into" for DML ("Insert into
// partition 7").
func partition(pid int64, dml bool) string {
	if dml {
		return " into partition " + strconv.FormatInt(pid, 10)
	}
	return " " + strconv.FormatInt(pid, 10)
}

// body is what both message states offer for reading a body.
type body interface {
	Type() *messages.Type
	Body(out any) error
}

// createBody decodes and validates a CreateCollection body and returns its
// initial partitions.
func createBody(m body, v streamwal.VChannel) ([]int64, error) {
	var b messages.CreateCollectionBody
	if err := m.Body(&b); err != nil {
		return nil, malformed(m, v, "%w", err)
	}
	if err := sameCollection(m, v, b.CollectionID); err != nil {
		return nil, err
	}
	seen := make(map[int64]struct{}, len(b.PartitionIDs))
	for _, pid := range b.PartitionIDs {
		if pid <= 0 {
			return nil, malformed(m, v, "partition id %d is not positive", pid)
		}
		if _, dup := seen[pid]; dup {
			return nil, malformed(m, v, "partition %d listed twice", pid)
		}
		seen[pid] = struct{}{}
	}
	return b.PartitionIDs, nil
}

// partitionBody decodes and validates a CreatePartition or DropPartition
// body and returns its partition.
func partitionBody(m body, v streamwal.VChannel) (int64, error) {
	var b messages.PartitionBody
	if err := m.Body(&b); err != nil {
		return 0, malformed(m, v, "%w", err)
	}
	if err := sameCollection(m, v, b.CollectionID); err != nil {
		return 0, err
	}
	if b.PartitionID <= 0 {
		return 0, malformed(m, v, "partition id %d is not positive", b.PartitionID)
	}
	return b.PartitionID, nil
}

// sameCollection refuses a body naming another collection than v's.
func sameCollection(m body, v streamwal.VChannel, id int64) error {
	if id != 0 && id != v.CollectionID() {
		return malformed(m, v, "body names collection %d", id)
	}
	return nil
}

// malformed builds the invalid-argument error of a bad lifecycle body.
func malformed(m body, v streamwal.VChannel, format string, args ...any) error {
	args = append([]any{m.Type().Name, v}, args...)
	return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s on %s: malformed body: "+format, args...)
}

// Record is the lifecycle state of one VChannel as recovery storage keeps
// it (DESIGN.md §10, VChannel metadata): enough for [Table.Restore] to give
// a table that checks and applies exactly as the one exported.
type Record struct {
	VChannel streamwal.VChannel
	// Created and Dropped: a CreateCollection, a DropCollection landed.
	Created, Dropped bool
	// CreatedBy and DroppedBy are their message IDs (retries pass).
	CreatedBy, DroppedBy string
	// Partitions are the live partitions, Gone the dropped ones (never
	// reused), both sorted.
	Partitions, Gone []int64
	// DDL are the message IDs of the partition DDL that landed, sorted.
	DDL []string
}

// Export returns the state of every VChannel the table knows, sorted by
// VChannel.
func (t *Table) Export() []Record {
	out := make([]Record, 0, len(t.vs))
	for v, s := range t.vs {
		out = append(out, Record{
			VChannel: v, Created: s.created, Dropped: s.dropped, CreatedBy: s.createdBy, DroppedBy: s.droppedBy,
			Partitions: slices.Sorted(maps.Keys(s.live)), Gone: slices.Sorted(maps.Keys(s.gone)), DDL: slices.Sorted(maps.Keys(s.by)),
		})
	}
	slices.SortFunc(out, func(a, b Record) int { return strings.Compare(a.VChannel.String(), b.VChannel.String()) })
	return out
}

// Restore replaces the table's state with records exported before. A
// record without a VChannel, or with a partition both live and gone, is a
// streamwal.CodeInvalidArgument error and changes nothing.
func (t *Table) Restore(records []Record) error {
	vs := make(map[streamwal.VChannel]*vchannel, len(records))
	for _, r := range records {
		if r.VChannel.IsZero() {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "lifecycle record without a vchannel")
		}
		s := &vchannel{created: r.Created, dropped: r.Dropped, createdBy: r.CreatedBy, droppedBy: r.DroppedBy}
		if !r.Dropped {
			s.live, s.gone = setOf(r.Partitions), setOf(r.Gone)
			for pid := range s.live {
				if _, ok := s.gone[pid]; ok {
					return streamwal.Errorf(streamwal.CodeInvalidArgument, "lifecycle record of %s: partition %d both live and dropped", r.VChannel, pid)
				}
			}
		}
		for _, id := range r.DDL {
			s.remember(id)
		}
		vs[r.VChannel] = s
	}
	t.vs = vs
	return nil
}

// setOf returns ids as a set (never nil).
func setOf(ids []int64) map[int64]struct{} {
	m := make(map[int64]struct{}, len(ids))
	for _, id := range ids {
		m[id] = struct{}{}
	}
	return m
}
