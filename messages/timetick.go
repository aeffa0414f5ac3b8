package messages

import (
	"strconv"
	"time"

	"github.com/streamwal/streamwal"
)

// LogicalBits is the width of a TimeTick's logical counter.
const LogicalBits = 18

// MaxLogical is the largest logical counter of a TimeTick.
const MaxLogical = 1<<LogicalBits - 1

// maxPhysicalMillis is the largest physical part a TimeTick can carry.
const maxPhysicalMillis = 1<<(64-LogicalBits) - 1

// TimeTick is a hybrid timestamp: physical milliseconds since the Unix epoch
// shifted left by LogicalBits, plus a logical counter. TimeTicks are drawn
// from the coordinator's timestamp oracle and are strictly increasing within
// one PChannel; they are comparable only within one PChannel. Zero means
// "not assigned".
type TimeTick uint64

// NewTimeTick composes a TimeTick from a physical time (truncated to the
// millisecond) and a logical counter.
func NewTimeTick(physical time.Time, logical uint32) (TimeTick, error) {
	ms := physical.UnixMilli()
	if ms < 0 || ms > maxPhysicalMillis {
		return 0, streamwal.Errorf(streamwal.CodeInvalidArgument, "timetick physical time %v out of range", physical)
	}
	if logical > MaxLogical {
		return 0, streamwal.Errorf(streamwal.CodeInvalidArgument, "timetick logical %d exceeds %d", logical, MaxLogical)
	}
	return TimeTick(uint64(ms)<<LogicalBits | uint64(logical)), nil
}

// TimeTickAt returns the smallest TimeTick at physical time t (logical 0).
// Times before the epoch map to 0.
func TimeTickAt(t time.Time) TimeTick {
	ms := t.UnixMilli()
	if ms <= 0 {
		return 0
	}
	if ms > maxPhysicalMillis {
		ms = maxPhysicalMillis
	}
	return TimeTick(uint64(ms) << LogicalBits)
}

// PhysicalMillis returns the physical part in Unix milliseconds.
func (t TimeTick) PhysicalMillis() int64 { return int64(uint64(t) >> LogicalBits) }

// Physical returns the physical part as a time.
func (t TimeTick) Physical() time.Time { return time.UnixMilli(t.PhysicalMillis()).UTC() }

// Logical returns the logical counter.
func (t TimeTick) Logical() uint32 { return uint32(uint64(t) & MaxLogical) }

// String renders the physical time and the logical counter, for humans:
// "2026-11-29T15:04:05.123Z+7".
func (t TimeTick) String() string {
	return t.Physical().Format("2006-01-02T15:04:05.000Z07:00") + "+" + strconv.FormatUint(uint64(t.Logical()), 10)
}

// ParseTimeTick parses the decimal wire form of a TimeTick.
func ParseTimeTick(s string) (TimeTick, error) {
	n, err := parseUint(s)
	if err != nil {
		return 0, invalid("timetick %q: %v", s, err)
	}
	return TimeTick(n), nil
}

// MessageID identifies an appended message: the JetStream stream sequence of
// the message in its PChannel's stream. Totally ordered within a PChannel;
// zero means "none".
type MessageID uint64

// String renders the decimal sequence.
func (id MessageID) String() string { return strconv.FormatUint(uint64(id), 10) }

// ParseMessageID parses the decimal wire form of a MessageID.
func ParseMessageID(s string) (MessageID, error) {
	n, err := parseUint(s)
	if err != nil {
		return 0, invalid("message id %q: %v", s, err)
	}
	return MessageID(n), nil
}

// parseUint parses a canonical decimal uint64 (no sign, no leading zeros).
func parseUint(s string) (uint64, error) {
	if len(s) > 1 && s[0] == '0' {
		return 0, errLeadingZero
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errNotDecimal
		}
		n = n*10 + uint64(s[i]-'0')
	}
	if s == "" || len(s) >= maxSafeDigits {
		return strconv.ParseUint(s, 10, 64) // empty, or may overflow
	}
	return n, nil
}

// maxSafeDigits is the length from which a decimal may overflow a uint64.
const maxSafeDigits = 20

// invalid builds an invalid-argument error.
func invalid(format string, args ...any) error {
	return streamwal.Errorf(streamwal.CodeInvalidArgument, format, args...)
}
