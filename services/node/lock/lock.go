// Package lock is the lock table of a PChannel's WAL (DESIGN.md §1
// "Lock"): appends take a shared or exclusive lock at VChannel or PChannel
// scope, as their message type declares. It is a plain data structure, not
// safe for concurrent use; the WAL drives it under its own mutex and wakes
// the appends it grants.
//
// Semantics:
//   - a VChannel lock conflicts with an exclusive lock on the same
//     VChannel, and an exclusive VChannel lock with any lock on it;
//   - an exclusive PChannel lock conflicts with every other lock, and every
//     append holds at least a shared PChannel lock (types without a lock of
//     their own take exactly that), so nothing else is in flight while a
//     cluster barrier lands;
//   - grants are fair: a waiting request is never overtaken by a later
//     request it conflicts with, so an exclusive request waits for the
//     shared holders before it and blocks the shared requests after it.
package lock

import (
	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// Request is one append's lock.
type Request struct {
	// ID identifies the request in Release and Cancel; unique among live
	// requests.
	ID uint64
	// Lock is the message type's declared lock; messages.NoLock means a
	// shared PChannel lock.
	Lock messages.Lock
	// VChannel is the target of a VChannel-scoped lock.
	VChannel streamwal.VChannel
}

// normalized maps NoLock onto a shared PChannel lock.
func (r Request) normalized() Request {
	if r.Lock == messages.NoLock {
		r.Lock = messages.Lock{Mode: messages.LockShared, Scope: messages.ScopePChannel}
	}
	return r
}

// conflicts reports whether two requests cannot hold their locks at once.
func conflicts(a, b Request) bool {
	ax := a.Lock.Mode == messages.LockExclusive
	bx := b.Lock.Mode == messages.LockExclusive
	switch {
	case ax && a.Lock.Scope == messages.ScopePChannel, bx && b.Lock.Scope == messages.ScopePChannel:
		return true
	case a.Lock.Scope == messages.ScopeVChannel && b.Lock.Scope == messages.ScopeVChannel:
		return a.VChannel == b.VChannel && (ax || bx)
	}
	return false
}

// Table holds the granted and waiting requests.
type Table struct {
	holders map[uint64]Request
	waiting []Request
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{holders: map[uint64]Request{}} }

// Acquire grants r at once (true) or queues it (false). A request with an
// ID already live, or a VChannel-scoped lock without a VChannel, is an
// invalid argument and changes nothing.
func (t *Table) Acquire(r Request) (bool, error) {
	r = r.normalized()
	if t.live(r.ID) {
		return false, streamwal.Errorf(streamwal.CodeInvalidArgument, "lock request %d is already live", r.ID)
	}
	if r.Lock.Scope == messages.ScopeVChannel && r.VChannel.IsZero() {
		return false, streamwal.Errorf(streamwal.CodeInvalidArgument, "vchannel lock %d without a vchannel", r.ID)
	}
	if t.compatible(r, t.waiting) {
		t.holders[r.ID] = r
		return true, nil
	}
	t.waiting = append(t.waiting, r)
	return false, nil
}

// Release drops a held lock and returns the IDs it let through, in order.
func (t *Table) Release(id uint64) ([]uint64, error) {
	if _, ok := t.holders[id]; !ok {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "lock %d is not held", id)
	}
	delete(t.holders, id)
	return t.grant(), nil
}

// Cancel withdraws a waiting request (its caller gave up) and returns the
// IDs that this let through.
func (t *Table) Cancel(id uint64) ([]uint64, error) {
	for i, w := range t.waiting {
		if w.ID == id {
			t.waiting = append(t.waiting[:i], t.waiting[i+1:]...)
			return t.grant(), nil
		}
	}
	return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "lock %d is not waiting", id)
}

// grant lets through every waiting request compatible with the holders
// and with the requests still waiting before it.
func (t *Table) grant() []uint64 {
	var granted []uint64
	var still []Request
	for _, w := range t.waiting {
		if t.compatible(w, still) {
			t.holders[w.ID] = w
			granted = append(granted, w.ID)
			continue
		}
		still = append(still, w)
	}
	t.waiting = still
	return granted
}

// compatible reports whether r conflicts with no holder and no request in
// before.
func (t *Table) compatible(r Request, before []Request) bool {
	for _, h := range t.holders {
		if conflicts(r, h) {
			return false
		}
	}
	for _, b := range before {
		if conflicts(r, b) {
			return false
		}
	}
	return true
}

// live reports whether id is held or waiting.
func (t *Table) live(id uint64) bool {
	if _, ok := t.holders[id]; ok {
		return true
	}
	for _, w := range t.waiting {
		if w.ID == id {
			return true
		}
	}
	return false
}

// Held reports whether id holds its lock.
func (t *Table) Held(id uint64) bool { _, ok := t.holders[id]; return ok }

// Waiting is how many requests wait.
func (t *Table) Waiting() int { return len(t.waiting) }
