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

// census counts requests by what they conflict with, so that a conflict
// check costs the same however many requests are held or waiting.
type census struct {
	all        int
	pExclusive int
	vShared    map[streamwal.VChannel]int
	vExclusive map[streamwal.VChannel]int
}

// add counts r (d = 1) or stops counting it (d = -1); r is normalized.
func (c *census) add(r Request, d int) {
	c.all += d
	switch {
	case r.Lock.Scope == messages.ScopePChannel && r.Lock.Mode == messages.LockExclusive:
		c.pExclusive += d
	case r.Lock.Scope == messages.ScopeVChannel:
		m := &c.vShared
		if r.Lock.Mode == messages.LockExclusive {
			m = &c.vExclusive
		}
		if *m == nil {
			*m = map[streamwal.VChannel]int{}
		}
		if (*m)[r.VChannel] += d; (*m)[r.VChannel] == 0 {
			delete(*m, r.VChannel)
		}
	}
}

// conflicts reports whether r conflicts with a counted request; it agrees
// with the pairwise rule of the package doc.
func (c *census) conflicts(r Request) bool {
	switch {
	case c.pExclusive > 0:
		return true
	case r.Lock.Scope == messages.ScopePChannel:
		return r.Lock.Mode == messages.LockExclusive && c.all > 0
	case c.vExclusive[r.VChannel] > 0:
		return true
	}
	return r.Lock.Mode == messages.LockExclusive && c.vShared[r.VChannel] > 0
}

// Table holds the granted and waiting requests.
type Table struct {
	holders map[uint64]Request
	held    census
	waiting []Request // in arrival order
	queued  census    // the waiting requests
	waitIDs map[uint64]struct{}
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{holders: map[uint64]Request{}, waitIDs: map[uint64]struct{}{}}
}

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
	if !t.held.conflicts(r) && !t.queued.conflicts(r) {
		t.hold(r)
		return true, nil
	}
	t.waiting = append(t.waiting, r)
	t.queued.add(r, 1)
	t.waitIDs[r.ID] = struct{}{}
	return false, nil
}

// hold records r as a holder.
func (t *Table) hold(r Request) {
	t.holders[r.ID] = r
	t.held.add(r, 1)
}

// Release drops a held lock and returns the IDs it let through, in order.
func (t *Table) Release(id uint64) ([]uint64, error) {
	r, ok := t.holders[id]
	if !ok {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "lock %d is not held", id)
	}
	delete(t.holders, id)
	t.held.add(r, -1)
	return t.grant(), nil
}

// Cancel withdraws a waiting request (its caller gave up) and returns the
// IDs that this let through.
func (t *Table) Cancel(id uint64) ([]uint64, error) {
	if _, ok := t.waitIDs[id]; !ok {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "lock %d is not waiting", id)
	}
	for i, w := range t.waiting {
		if w.ID == id {
			t.waiting = append(t.waiting[:i], t.waiting[i+1:]...)
			t.queued.add(w, -1)
			delete(t.waitIDs, id)
			break
		}
	}
	return t.grant(), nil
}

// grant lets through every waiting request compatible with the holders
// and with the requests still waiting before it.
func (t *Table) grant() []uint64 {
	if len(t.waiting) == 0 {
		return nil
	}
	var granted []uint64
	var still census
	kept := t.waiting[:0]
	for _, w := range t.waiting {
		if !t.held.conflicts(w) && !still.conflicts(w) {
			t.hold(w)
			delete(t.waitIDs, w.ID)
			granted = append(granted, w.ID)
			continue
		}
		still.add(w, 1)
		kept = append(kept, w)
	}
	clear(t.waiting[len(kept):])
	t.waiting, t.queued = kept, still
	return granted
}

// live reports whether id is held or waiting.
func (t *Table) live(id uint64) bool {
	_, held := t.holders[id]
	_, waiting := t.waitIDs[id]
	return held || waiting
}

// Held reports whether id holds its lock.
func (t *Table) Held(id uint64) bool { _, ok := t.holders[id]; return ok }

// Waiting is how many requests wait.
func (t *Table) Waiting() int { return len(t.waiting) }
