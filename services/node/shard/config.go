package shard

import (
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/streamwal/streamwal"
)

// Defaults of the seal policies (DESIGN.md §9, §10).
const (
	DefaultCapacity     = 112 << 20
	DefaultJitter       = 0.1
	DefaultLifetime     = 24 * time.Hour
	DefaultIdle         = 10 * time.Minute
	DefaultIdleMinBytes = 16 << 20
)

// Off turns off a byte or row limit of Config (Capacity, MaxRows,
// IdleMinBytes) that zero would set to its default.
const Off = math.MaxUint64

// Config sets the seal policies of a manager. A zero field takes its
// default.
type Config struct {
	// Capacity is the size in bytes at which a segment seals (default
	// 112 MiB; Off: never by size). A segment's own capacity is
	// Capacity*(1-Jitter*u), u drawn uniformly in [0, 1) from Rand when
	// the segment is created, so it lies in [Capacity*(1-Jitter),
	// Capacity].
	Capacity uint64
	// Jitter is the fraction of Capacity a segment's capacity may fall
	// short by, in [0, 1] (default 0.1; negative: no jitter).
	Jitter float64
	// MaxRows is the row count at which a segment seals (0 or Off: never
	// by rows).
	MaxRows uint64
	// Lifetime is how long after its creation a segment seals (default
	// 24 h; negative: never by age).
	Lifetime time.Duration
	// Idle is how long without an insert a segment of at least
	// IdleMinBytes landed seals (default 10 min; negative: never when
	// idle).
	Idle time.Duration
	// IdleMinBytes is the size an idle segment needs to seal (default
	// 16 MiB; 1: any segment with data; Off: never when idle).
	IdleMinBytes uint64
	// Memory is the node-wide account of growing bytes, shared by the
	// managers of one node (nil: no memory policy).
	Memory *Memory
	// Rand draws the jitter of a new segment's capacity, in [0, 1)
	// (default: math/rand/v2).
	Rand func() float64
}

// normalize fills in defaults and checks the fields.
func (c Config) normalize() (Config, error) {
	if c.Capacity == 0 {
		c.Capacity = DefaultCapacity
	}
	switch {
	case math.IsNaN(c.Jitter) || c.Jitter > 1:
		return c, streamwal.Errorf(streamwal.CodeInvalidArgument, "shard config: jitter %v is not in [0, 1]", c.Jitter)
	case c.Jitter == 0:
		c.Jitter = DefaultJitter
	case c.Jitter < 0:
		c.Jitter = 0
	}
	if c.MaxRows == 0 {
		c.MaxRows = Off
	}
	c.Lifetime = duration(c.Lifetime, DefaultLifetime)
	c.Idle = duration(c.Idle, DefaultIdle)
	if c.IdleMinBytes == 0 {
		c.IdleMinBytes = DefaultIdleMinBytes
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	return c, nil
}

// duration maps zero to def and negative to off (0).
func duration(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// capacity is the jittered capacity of a segment drawn with u in [0, 1).
func (c *Config) capacity(u float64) uint64 {
	if c.Capacity == Off {
		return Off
	}
	if !(u >= 0) || u >= 1 {
		u = 0
	}
	cut := uint64(float64(c.Capacity) * c.Jitter * u)
	floor := minus(c.Capacity, uint64(float64(c.Capacity)*c.Jitter))
	return max(c.Capacity-min(cut, c.Capacity), floor, 1)
}

// derived is the jitter draw of a segment created by Apply: fixed by its
// ID (splitmix64), so that every replay of a stream agrees.
func derived(id int64) float64 {
	z := uint64(id) + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

// Memory is the node-wide account of growing bytes: the bytes, landed and
// in flight, of every growing segment of the node's managers (one per
// PChannel). It is safe for concurrent use. A segment's bytes leave it
// when the segment is sealed, whatever the reason: from then on no insert
// adds to it, so a manager relieving pressure sees the effect of each
// seal at once and never seals more than it must.
//
// Above High, a manager's Tick seals its own largest growing segments
// first until the node's total is at or below Low.
type Memory struct {
	high, low uint64
	growing   atomic.Uint64
}

// NewMemory returns an account with high water mark high (0: the memory
// policy never fires) and low water mark low (0: high*3/4; at most high).
func NewMemory(high, low uint64) *Memory {
	if low == 0 {
		low = high - high/4
	}
	return &Memory{high: high, low: min(low, high)}
}

// Growing is the node's growing bytes.
func (m *Memory) Growing() uint64 { return m.growing.Load() }

// High is the high water mark.
func (m *Memory) High() uint64 { return m.high }

// Low is the low water mark.
func (m *Memory) Low() uint64 { return m.low }

// above reports whether the memory policy fires.
func (m *Memory) above() bool { return m.high > 0 && m.Growing() > m.high }

// count adds bytes of a growing segment to the account.
func (m *Manager) count(s *segment, bytes uint64) {
	if s.State != Growing || bytes == 0 {
		return
	}
	s.mem += bytes
	if mem := m.cfg.Memory; mem != nil {
		mem.growing.Add(bytes)
	}
}

// uncount takes up to bytes of s back from the account.
func (m *Manager) uncount(s *segment, bytes uint64) {
	bytes = min(bytes, s.mem)
	if bytes == 0 {
		return
	}
	s.mem -= bytes
	if mem := m.cfg.Memory; mem != nil {
		mem.growing.Add(^(bytes - 1))
	}
}
