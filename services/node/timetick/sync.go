package timetick

import "github.com/streamwal/streamwal/messages"

// SyncAction is what one round of the sync loop does.
type SyncAction uint8

// Sync actions.
const (
	// SyncNothing: appends are in flight; the TimeTick message that
	// follows them will come in a later round.
	SyncNothing SyncAction = iota
	// SyncPersist: append a TimeTick message.
	SyncPersist
	// SyncLive: publish a live tick covering the stream's last message.
	SyncLive
)

// Syncer decides each round of a WAL's sync loop: a persisted TimeTick
// message when anything but TimeTicks landed since the last one, otherwise
// a live tick, which is only sound while the stream's last message is one
// of the WAL's own PChannel-level messages (every reader, whatever its
// VChannel filter, receives those, and so can tell when it has caught up
// with the tick). It is a plain data structure, not safe for concurrent
// use.
type Syncer struct {
	dirty bool
	tail  messages.MessageID // the largest MessageID landed
	tick  messages.MessageID // the tail, while it is a TimeTick or barrier
}

// NewSyncer starts after the RecoveryBarrier at barrier.
func NewSyncer(barrier messages.MessageID) *Syncer {
	return &Syncer{tail: barrier, tick: barrier}
}

// Landed records that an append ending at last landed; tick says whether
// it was a TimeTick message.
func (s *Syncer) Landed(last messages.MessageID, tick bool) {
	if last > s.tail {
		s.tail, s.tick = last, 0
	}
	if !tick {
		s.dirty = true
	} else if last == s.tail {
		s.tick = last
	}
}

// Decide returns this round's action given how many appends are in
// flight, and for a live tick the MessageID it covers. Deciding to persist
// clears the dirty mark; call Failed if that append does not land.
func (s *Syncer) Decide(inFlight int) (SyncAction, messages.MessageID) {
	switch {
	case s.dirty:
		s.dirty = false
		return SyncPersist, 0
	case inFlight == 0 && s.tick != 0:
		return SyncLive, s.tick
	}
	return SyncNothing, 0
}

// Failed re-marks the WAL dirty after a TimeTick message did not land.
func (s *Syncer) Failed() { s.dirty = true }
