package timetick

import (
	"context"
	"sync"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// MaxBatch bounds one Allocate call: the most a request to the
// coordinator's oracle may ask for.
const MaxBatch = wire.MaxTSOCount

// Oracle hands out hybrid timestamps.
type Oracle interface {
	// Allocate reserves n (1..MaxBatch) consecutive TimeTicks, all larger
	// than any it returned before, and returns the first.
	Allocate(ctx context.Context, n uint32) (messages.TimeTick, error)
}

// LocalOracle is an in-process Oracle: the physical part follows the clock,
// and it never goes backwards, even if the clock does. It is safe for
// concurrent use.
type LocalOracle struct {
	mu   sync.Mutex
	now  func() time.Time
	last messages.TimeTick
}

// NewLocalOracle returns an oracle reading now (time.Now when nil).
func NewLocalOracle(now func() time.Time) *LocalOracle {
	if now == nil {
		now = time.Now
	}
	return &LocalOracle{now: now}
}

// Allocate implements Oracle.
func (o *LocalOracle) Allocate(ctx context.Context, n uint32) (messages.TimeTick, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if n == 0 || n > MaxBatch {
		return 0, streamwal.Errorf(streamwal.CodeInvalidArgument, "allocate %d timeticks: want 1 to %d", n, MaxBatch)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	first := max(messages.TimeTickAt(o.now()), o.last+1)
	o.last = first + messages.TimeTick(n) - 1
	return first, nil
}

// Allocator serves TimeTicks one at a time from batches drawn from an
// Oracle. It is not safe for concurrent use: the WAL calls it under the
// lock that orders its appends.
type Allocator struct {
	oracle Oracle
	batch  uint32
	next   messages.TimeTick
	end    messages.TimeTick // exclusive
}

// NewAllocator draws batches of size batch (1..MaxBatch) from oracle.
func NewAllocator(oracle Oracle, batch uint32) (*Allocator, error) {
	if oracle == nil || batch == 0 || batch > MaxBatch {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "allocator needs an oracle and a batch in [1, %d]", MaxBatch)
	}
	return &Allocator{oracle: oracle, batch: batch}, nil
}

// Next returns the next TimeTick, strictly larger than every one before.
func (a *Allocator) Next(ctx context.Context) (messages.TimeTick, error) {
	if a.next == a.end {
		first, err := a.oracle.Allocate(ctx, a.batch)
		if err != nil {
			return 0, err
		}
		if first < a.next {
			return 0, streamwal.Errorf(streamwal.CodeInternal, "oracle went backwards: %d after %d", first, a.next)
		}
		a.next, a.end = first, first+messages.TimeTick(a.batch)
	}
	t := a.next
	a.next++
	return t, nil
}

// Reset drops the rest of the current batch, so that the next TimeTick
// comes from a fresh allocation (after recovery, or after the oracle's
// clock moved far ahead of a stale batch).
func (a *Allocator) Reset() { a.end = a.next }
