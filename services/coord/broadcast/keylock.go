package broadcast

import (
	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// KeyLocks is the resource-key lock table of the broadcaster: a broadcast
// holds all of its keys or none, so two broadcasts never deadlock, and
// grants are fair: a waiting broadcast is never overtaken by a later one it
// conflicts with. It is a plain data structure, not safe for concurrent
// use.
type KeyLocks struct {
	holders map[uint64][]messages.ResourceKey
	waiting []keyRequest
}

// keyRequest is a broadcast waiting for its keys.
type keyRequest struct {
	id   uint64
	keys []messages.ResourceKey
}

// NewKeyLocks returns an empty table.
func NewKeyLocks() *KeyLocks { return &KeyLocks{holders: map[uint64][]messages.ResourceKey{}} }

// Acquire grants broadcast id its keys at once (true) or queues it
// (false). keys are normalized (sorted, merged). An id already live is an
// invalid argument and changes nothing.
func (t *KeyLocks) Acquire(id uint64, keys []messages.ResourceKey) (bool, error) {
	if t.live(id) {
		return false, streamwal.Errorf(streamwal.CodeInvalidArgument, "broadcast %d already holds or awaits its keys", id)
	}
	keys = messages.NormalizeKeys(keys)
	if t.free(keys, t.waiting) {
		t.holders[id] = keys
		return true, nil
	}
	t.waiting = append(t.waiting, keyRequest{id: id, keys: keys})
	return false, nil
}

// Release drops the keys broadcast id holds and returns the broadcasts
// this let through, in order.
func (t *KeyLocks) Release(id uint64) ([]uint64, error) {
	if _, ok := t.holders[id]; !ok {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "broadcast %d holds no keys", id)
	}
	delete(t.holders, id)
	return t.grant(), nil
}

// Cancel withdraws a waiting broadcast and returns what this let through.
func (t *KeyLocks) Cancel(id uint64) ([]uint64, error) {
	for i, w := range t.waiting {
		if w.id == id {
			t.waiting = append(t.waiting[:i], t.waiting[i+1:]...)
			return t.grant(), nil
		}
	}
	return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "broadcast %d is not waiting", id)
}

// Held reports whether broadcast id holds its keys.
func (t *KeyLocks) Held(id uint64) bool { _, ok := t.holders[id]; return ok }

// Holders is how many broadcasts hold keys; Waiting how many wait.
func (t *KeyLocks) Holders() int { return len(t.holders) }

// Waiting is how many broadcasts wait for their keys.
func (t *KeyLocks) Waiting() int { return len(t.waiting) }

// grant lets through every waiting broadcast whose keys are free of the
// holders and of the broadcasts still waiting before it.
func (t *KeyLocks) grant() []uint64 {
	var granted []uint64
	var still []keyRequest
	for _, w := range t.waiting {
		if t.free(w.keys, still) {
			t.holders[w.id] = w.keys
			granted = append(granted, w.id)
			continue
		}
		still = append(still, w)
	}
	t.waiting = still
	return granted
}

// free reports whether keys conflict with no holder and no request in
// before.
func (t *KeyLocks) free(keys []messages.ResourceKey, before []keyRequest) bool {
	for _, h := range t.holders {
		if conflict(keys, h) {
			return false
		}
	}
	for _, b := range before {
		if conflict(keys, b.keys) {
			return false
		}
	}
	return true
}

// conflict reports whether any key of a conflicts with any key of b.
func conflict(a, b []messages.ResourceKey) bool {
	for _, x := range a {
		for _, y := range b {
			if x.Conflicts(y) {
				return true
			}
		}
	}
	return false
}

// live reports whether id holds or awaits keys.
func (t *KeyLocks) live(id uint64) bool {
	if _, ok := t.holders[id]; ok {
		return true
	}
	for _, w := range t.waiting {
		if w.id == id {
			return true
		}
	}
	return false
}
