package shard

import (
	"encoding/json"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// State is where a segment is in its life.
type State uint8

// Segment states.
const (
	// Growing: takes inserts.
	Growing State = iota + 1
	// Sealed: takes no insert; its Flush is to be appended, or landed.
	Sealed
	// Flushed: its data is in the object store.
	Flushed
)

var stateNames = map[State]string{Growing: "growing", Sealed: "sealed", Flushed: "flushed"}

// String names the state: "growing", "sealed", "flushed".
func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return "invalid"
}

// Valid reports whether s is one of the declared states.
func (s State) Valid() bool { _, ok := stateNames[s]; return ok }

// MarshalText renders the state's name (so JSON has it as a string).
func (s State) MarshalText() ([]byte, error) {
	if !s.Valid() {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "segment state %d: %w", s, ErrMalformed)
	}
	return []byte(s.String()), nil
}

// UnmarshalText parses a state's name.
func (s *State) UnmarshalText(b []byte) error {
	for st, n := range stateNames {
		if n == string(b) {
			*s = st
			return nil
		}
	}
	return streamwal.Errorf(streamwal.CodeInvalidArgument, "segment state %q: %w", b, ErrMalformed)
}

// Segment is one segment's metadata, as persisted in the recovery
// metadata (JSON, snake_case; the VChannel as its name). The fields
// marked in memory are not persisted: a restored segment has none.
type Segment struct {
	ID        int64              `json:"id"`
	VChannel  streamwal.VChannel `json:"vchannel"`
	Partition int64              `json:"partition"`
	State     State              `json:"state"`
	// Rows and Bytes count its landed inserts; First and Last, FirstTT
	// and LastTT bound their MessageIDs and TimeTicks (zero while it has
	// none).
	Rows    uint64             `json:"rows"`
	Bytes   uint64             `json:"bytes"`
	First   messages.MessageID `json:"first_id"`
	Last    messages.MessageID `json:"last_id"`
	FirstTT messages.TimeTick  `json:"first_tt"`
	LastTT  messages.TimeTick  `json:"last_tt"`
	// Created is the physical time of its CreateSegment's TimeTick;
	// LastInsert that of its latest insert (Created while it has none).
	Created    time.Time `json:"created"`
	LastInsert time.Time `json:"last_insert"`
	// Capacity is its own (jittered) capacity in bytes.
	Capacity uint64 `json:"capacity"`
	// Reason is why it was sealed.
	Reason Reason `json:"reason,omitempty"`
	// FlushedAt is the MessageID of the message after which no insert may
	// follow it: its Flush, or its collection's DropCollection; zero until
	// one landed.
	FlushedAt messages.MessageID `json:"flushed_at,omitempty"`

	// In memory: inserts stamped whose appends have not resolved, and
	// their rows and bytes; the open transactions holding it; whether its
	// Flush is handed out (by Ready, not given back, not landed).
	InFlight     int    `json:"-"`
	StampedRows  uint64 `json:"-"`
	StampedBytes uint64 `json:"-"`
	Holds        int    `json:"-"`
	HandedOut    bool   `json:"-"`
}

// segmentFields is Segment without its methods, for the JSON codec.
type segmentFields Segment

// MarshalJSON encodes the segment with its VChannel as a name.
func (s Segment) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		segmentFields
		VChannel string `json:"vchannel"`
	}{segmentFields(s), s.VChannel.String()})
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (s *Segment) UnmarshalJSON(b []byte) error {
	var out struct {
		segmentFields
		VChannel string `json:"vchannel"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return err
	}
	v, err := streamwal.ParseVChannel(out.VChannel)
	if err != nil {
		return err
	}
	*s = Segment(out.segmentFields)
	s.VChannel = v
	return nil
}

// persisted is the segment without its in-memory fields.
func (s Segment) persisted() Segment {
	s.InFlight, s.StampedRows, s.StampedBytes, s.Holds, s.HandedOut = 0, 0, 0, 0, false
	return s
}

// Segments returns a copy of every segment known, sorted by ID.
func (m *Manager) Segments() []Segment {
	out := make([]Segment, 0, len(m.segs))
	for _, id := range ids(m.segs) {
		s := m.segs[id]
		c := s.Segment
		c.Holds = len(s.holds)
		out = append(out, c)
	}
	return out
}

// Segment returns a copy of segment id.
func (m *Manager) Segment(id int64) (Segment, bool) {
	s, ok := m.segs[id]
	if !ok {
		return Segment{}, false
	}
	c := s.Segment
	c.Holds = len(s.holds)
	return c, true
}

// Restore replaces the manager's state with segs, as persisted, covering
// the stream through MessageID applied (Apply changes no segment for a
// message at or below it). In-memory fields of segs are ignored; a zero
// Capacity is derived from the ID as Apply derives it. Restore fails,
// changing nothing, if a segment is malformed (no positive ID, no data
// VChannel, a negative partition, an invalid state), an ID repeats, or a
// VChannel and partition have two growing segments.
func (m *Manager) Restore(segs []Segment, applied messages.MessageID) error {
	if err := check(segs); err != nil {
		return err
	}
	for _, s := range m.segs {
		m.uncount(s, s.mem)
	}
	m.segs, m.growing = map[int64]*segment{}, map[key]int64{}
	m.pending, m.txns = map[int64]*segment{}, map[messages.TxnID]*hold{}
	m.applied, m.forgotten = applied, 0
	for _, seg := range segs {
		m.restore(seg.persisted())
	}
	return nil
}

// restore adds one checked segment.
func (m *Manager) restore(seg Segment) {
	if seg.Capacity == 0 {
		seg.Capacity = m.cfg.capacity(derived(seg.ID))
	}
	s := &segment{Segment: seg}
	m.segs[s.ID] = s
	switch {
	case s.State == Growing:
		m.growing[s.key()] = s.ID
		m.count(s, s.Bytes)
	case s.State == Sealed && !s.flushedOut():
		m.pending[s.ID] = s
	}
}

// check validates segments to restore.
func check(segs []Segment) error {
	seen := make(map[int64]struct{}, len(segs))
	growing := map[key]int64{}
	for _, s := range segs {
		if err := checkOne(s); err != nil {
			return err
		}
		if _, dup := seen[s.ID]; dup {
			return badRestore(s, "listed twice")
		}
		seen[s.ID] = struct{}{}
		if s.State != Growing {
			continue
		}
		if g, dup := growing[s.key()]; dup {
			return badRestore(s, "segment %d is growing on the same partition", g)
		}
		growing[s.key()] = s.ID
	}
	return nil
}

// checkOne validates one segment to restore.
func checkOne(s Segment) error {
	switch {
	case s.ID <= 0:
		return badRestore(s, "the id is not positive")
	case s.VChannel.IsZero() || s.VChannel.IsControl():
		return badRestore(s, "no data vchannel")
	case s.Partition < 0:
		return badRestore(s, "partition %d is negative", s.Partition)
	case !s.State.Valid():
		return badRestore(s, "state %d is not valid", s.State)
	}
	return nil
}

func (s Segment) key() key { return key{s.VChannel, s.Partition} }

// badRestore builds the error of a segment Restore refuses.
func badRestore(s Segment, format string, args ...any) error {
	args = append([]any{s.ID, s.VChannel}, args...)
	args = append(args, ErrMalformed)
	return streamwal.Errorf(streamwal.CodeInvalidArgument, "restore segment %d on %s: "+format+": %w", args...)
}
