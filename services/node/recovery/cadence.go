package recovery

import "time"

// Defaults of a [Cadence] (DESIGN.md §10).
const (
	DefaultInterval = 10 * time.Second
	DefaultDirty    = 100
)

// Cadence decides when a persist round is due: every Interval while
// anything changed, and at once past Dirty changed messages. The zero
// value uses the defaults. It is a pure function of its arguments.
type Cadence struct {
	// Interval is the longest a change waits for a round (default 10 s).
	Interval time.Duration
	// Dirty is the count of consumed messages since the last round that
	// makes one due at once (default 100).
	Dirty int
}

// Due reports whether a round is due at now, the last one having run at
// last with dirty messages consumed since: never without a change, at
// once from Dirty changes, otherwise once Interval has passed.
func (c Cadence) Due(now, last time.Time, dirty int) bool {
	return dirty > 0 && (dirty >= c.dirty() || now.Sub(last) >= c.interval())
}

// Next is when a round after last is due by time alone: the moment to arm
// a timer for.
func (c Cadence) Next(last time.Time) time.Time { return last.Add(c.interval()) }

// interval is Interval or its default.
func (c Cadence) interval() time.Duration {
	if c.Interval <= 0 {
		return DefaultInterval
	}
	return c.Interval
}

// dirty is Dirty or its default.
func (c Cadence) dirty() int {
	if c.Dirty <= 0 {
		return DefaultDirty
	}
	return c.Dirty
}
