package recovery

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// Checkpoint is the point through which the owner of a PChannel consumed
// its WAL, stored as JSON under streamwal.CheckpointKey.
type Checkpoint struct {
	// Term is the term of the owner that wrote the checkpoint; the
	// persister sets it.
	Term uint64 `json:"term"`
	// Node is the node that wrote it; the persister sets it.
	Node string `json:"node,omitempty"`
	// TimeTick: every message at or below it was consumed.
	TimeTick messages.TimeTick `json:"timetick"`
	// MessageID is where a replay starts: the LastConfirmedMessageID of
	// the last consumed message, so open transactions are replayed whole.
	MessageID messages.MessageID `json:"message_id"`
	// Consumed is the MessageID of the last consumed message.
	Consumed messages.MessageID `json:"consumed"`
	// Digest is [Digest] of the last consumed message: a replay that finds
	// another message at Consumed has met rewritten history.
	Digest string `json:"digest,omitempty"`
	// Reached is the highest MessageID known to have been handed out.
	Reached messages.MessageID `json:"reached"`
	// Truncated is the truncation point last applied: nothing below it is
	// kept in the stream but the fencing barrier.
	Truncated messages.MessageID `json:"truncated,omitempty"`
	// Replication is the replication state (role and source checkpoint),
	// when replication exists; opaque to this package.
	Replication json.RawMessage `json:"replication,omitempty"`
	// Written is when the checkpoint was written; the persister sets it.
	Written time.Time `json:"written"`
}

// behind reports whether c is below o: a smaller Consumed or TimeTick.
func (c Checkpoint) behind(o Checkpoint) bool {
	return c.Consumed < o.Consumed || c.TimeTick < o.TimeTick
}

// digestLen is the number of bytes of the SHA-256 a [Digest] keeps.
const digestLen = 12

// Digest returns a short hex digest (24 digits) of what identifies m in
// its stream: its MessageID, PChannel, VChannel, type, TimeTick and
// payload. Two messages with the same digest at the same MessageID are
// the same message. Digest of nil is "".
func Digest(m *messages.ImmutableMessage) string {
	if m == nil {
		return ""
	}
	h := sha256.New()
	field := func(b []byte) {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(b))))
		h.Write(b)
	}
	field(binary.BigEndian.AppendUint64(nil, uint64(m.ID())))
	field([]byte(m.PChannel().String()))
	field([]byte(m.VChannel().String()))
	field([]byte(m.Type().String()))
	field(binary.BigEndian.AppendUint64(nil, uint64(m.TimeTick())))
	field(m.Payload())
	return hex.EncodeToString(h.Sum(nil)[:digestLen])
}

// The states of a VChannel.
const (
	StateNormal  = "normal"
	StateDropped = "dropped"
)

// VChannelMeta is what recovery keeps of one VChannel.
type VChannelMeta struct {
	// VChannel is the VChannel's name.
	VChannel string `json:"vchannel"`
	// CollectionID is the collection the VChannel is a shard of.
	CollectionID int64 `json:"collection_id"`
	// State is StateNormal or StateDropped.
	State string `json:"state"`
	// Partitions are the live partitions.
	Partitions []int64 `json:"partitions,omitempty"`
	// DroppedPartitions are the partitions dropped so far.
	DroppedPartitions []int64 `json:"dropped_partitions,omitempty"`
	// SchemaVersion counts the collection's schema changes.
	SchemaVersion uint64 `json:"schema_version"`
	// CreatedBy and DroppedBy identify the messages that created and
	// dropped the VChannel's collection.
	CreatedBy string `json:"created_by,omitempty"`
	DroppedBy string `json:"dropped_by,omitempty"`
	// DDLIDs identify the DDL messages applied, for idempotent replay.
	DDLIDs []string `json:"ddl_ids,omitempty"`
}

// check validates the fields a reader relies on.
func (v VChannelMeta) check() error {
	if v.State != StateNormal && v.State != StateDropped {
		return fmt.Errorf("vchannel %q: state must be %q or %q, not %q", v.VChannel, StateNormal, StateDropped, v.State)
	}
	return nil
}

// Snapshot is one persist round, or what [Persister.Load] found.
type Snapshot struct {
	// Checkpoint is the cut the round covers.
	Checkpoint Checkpoint
	// VChannels is the VChannel metadata at the cut.
	VChannels []VChannelMeta
	// Segments is the shard manager's segment metadata at the cut, opaque
	// to this package: valid JSON written as is (nil writes null).
	Segments json.RawMessage
	// VChannelsThrough and SegmentsThrough are set by Load: the TimeTick
	// the stored VChannel and segment metadata already reflect, at or
	// above the checkpoint's (ahead of it after a round that stopped
	// before its checkpoint). A replay must not apply a message at or
	// below it to that component again. Persist ignores them.
	VChannelsThrough messages.TimeTick
	SegmentsThrough  messages.TimeTick
}

// vchannelsValue is the stored value of streamwal.VChannelMetaKey.
type vchannelsValue struct {
	Term      uint64            `json:"term"`
	TimeTick  messages.TimeTick `json:"timetick"`
	VChannels []VChannelMeta    `json:"vchannels"`
}

// segmentsValue is the stored value of streamwal.SegmentMetaKey.
type segmentsValue struct {
	Term     uint64            `json:"term"`
	TimeTick messages.TimeTick `json:"timetick"`
	Segments json.RawMessage   `json:"segments"`
}

// ErrCorrupt is the cause of every error about a stored value that does
// not decode; such errors also match streamwal.ErrUnrecoverable.
var ErrCorrupt = errors.New("recovery: corrupt stored value")

// ErrBackwards is the cause of the refusal of a checkpoint below the
// last one; such errors also match streamwal.ErrInvalidArgument.
var ErrBackwards = errors.New("recovery: checkpoint moves backwards")

// corrupt builds the error for an undecodable value of key.
func corrupt(key string, why error) error {
	return streamwal.Errorf(streamwal.CodeUnrecoverable, "%s: %w: %v", key, ErrCorrupt, why)
}

// decodeObject decodes a stored JSON object into out; anything else (an
// array, a scalar, null, trailing data) is an error.
func decodeObject(data []byte, out any) error {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return errors.New("not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if err := dec.Decode(out); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

// decodeCheckpoint decodes the stored value of the checkpoint key.
func decodeCheckpoint(key string, data []byte) (Checkpoint, error) {
	var c Checkpoint
	if err := decodeObject(data, &c); err != nil {
		return Checkpoint{}, corrupt(key, err)
	}
	return c, nil
}

// decodeVChannels decodes the stored value of the VChannel metadata key.
func decodeVChannels(key string, data []byte) (vchannelsValue, error) {
	var v vchannelsValue
	if err := decodeObject(data, &v); err != nil {
		return vchannelsValue{}, corrupt(key, err)
	}
	for _, m := range v.VChannels {
		if err := m.check(); err != nil {
			return vchannelsValue{}, corrupt(key, err)
		}
	}
	return v, nil
}

// decodeSegments decodes the stored value of the segment metadata key;
// a stored null comes back as nil.
func decodeSegments(key string, data []byte) (segmentsValue, error) {
	var v segmentsValue
	if err := decodeObject(data, &v); err != nil {
		return segmentsValue{}, corrupt(key, err)
	}
	if bytes.Equal(v.Segments, []byte("null")) {
		v.Segments = nil
	}
	return v, nil
}

// storedTerm decodes only the term of a stored value of any of the keys.
func storedTerm(key string, data []byte) (uint64, error) {
	var v struct {
		Term uint64 `json:"term"`
	}
	if err := decodeObject(data, &v); err != nil {
		return 0, corrupt(key, err)
	}
	return v.Term, nil
}
