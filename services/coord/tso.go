package coord

import (
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// tsoWindow is how far ahead of the clock the oracle persists its bound.
const tsoWindow = 3 * time.Second

// oracle is the timestamp oracle's state, a plain data structure: TimeTicks
// follow the clock, never go backwards, and never pass the persisted
// bound, so that a successor that starts above the bound never repeats
// one, even if its clock is behind.
type oracle struct {
	last  messages.TimeTick // the largest handed out
	bound messages.TimeTick // persisted: nothing above it was handed out
}

// newOracle starts above a persisted bound.
func newOracle(bound messages.TimeTick) *oracle { return &oracle{last: bound, bound: bound} }

// reserve returns the range of n TimeTicks to hand out at now, and the
// bound to persist first if the range passes the current one (zero if
// not).
func (o *oracle) reserve(now time.Time, n uint32) (first, last, persist messages.TimeTick, err error) {
	if n == 0 || n > wire.MaxTSOCount {
		return 0, 0, 0, streamwal.Errorf(streamwal.CodeInvalidArgument, "allocate %d timeticks: want 1 to %d", n, wire.MaxTSOCount)
	}
	first = max(messages.TimeTickAt(now), o.last+1)
	last = first + messages.TimeTick(n) - 1
	if last > o.bound {
		persist = max(last, messages.TimeTickAt(now.Add(tsoWindow)))
	}
	return first, last, persist, nil
}

// commit records that the range ending at last was handed out, under a
// bound persisted at bound (zero: unchanged).
func (o *oracle) commit(last, bound messages.TimeTick) {
	o.last = max(o.last, last)
	o.bound = max(o.bound, bound)
}
