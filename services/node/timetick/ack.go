package timetick

import (
	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
)

// AckManager tracks allocated TimeTicks until they are confirmed (their
// appends finished, successfully or not). Allocation order is TimeTick
// order; confirmation may come in any order. It is a plain data structure,
// not safe for concurrent use.
type AckManager struct {
	// pending are allocated, in order; confirmed marks those done but not
	// yet popped because a smaller one is still pending.
	pending   []messages.TimeTick
	confirmed map[messages.TimeTick]bool
	last      messages.TimeTick // the largest allocated
	popped    messages.TimeTick // the largest confirmed and popped
}

// NewAckManager starts with everything up to start confirmed (for example
// the RecoveryBarrier's TimeTick).
func NewAckManager(start messages.TimeTick) *AckManager {
	return &AckManager{confirmed: map[messages.TimeTick]bool{}, last: start, popped: start}
}

// Allocate registers t, which must be larger than every TimeTick allocated
// before.
func (m *AckManager) Allocate(t messages.TimeTick) error {
	if t <= m.last {
		return streamwal.Errorf(streamwal.CodeInternal, "timetick %d allocated after %d", t, m.last)
	}
	m.last = t
	m.pending = append(m.pending, t)
	return nil
}

// Confirm marks t done. Confirming an unknown or already confirmed
// TimeTick is an error and changes nothing.
func (m *AckManager) Confirm(t messages.TimeTick) error {
	if t > m.last || t <= m.popped || m.confirmed[t] || !m.isPending(t) {
		return streamwal.Errorf(streamwal.CodeInternal, "timetick %d is not pending", t)
	}
	m.confirmed[t] = true
	for len(m.pending) > 0 && m.confirmed[m.pending[0]] {
		delete(m.confirmed, m.pending[0])
		m.popped = m.pending[0]
		m.pending = m.pending[1:]
	}
	return nil
}

// isPending reports whether t was allocated and not yet popped.
func (m *AckManager) isPending(t messages.TimeTick) bool {
	lo, hi := 0, len(m.pending)
	for lo < hi {
		mid := (lo + hi) / 2
		if m.pending[mid] < t {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo < len(m.pending) && m.pending[lo] == t
}

// Watermark is the largest TimeTick T such that every TimeTick allocated
// at or below T is confirmed: below the smallest pending one, or the
// largest allocated when nothing is pending.
func (m *AckManager) Watermark() messages.TimeTick {
	if len(m.pending) == 0 {
		return m.last
	}
	return m.pending[0] - 1
}

// Last is the largest TimeTick allocated.
func (m *AckManager) Last() messages.TimeTick { return m.last }

// Pending is how many allocated TimeTicks await confirmation.
func (m *AckManager) Pending() int { return len(m.pending) - len(m.confirmed) }
