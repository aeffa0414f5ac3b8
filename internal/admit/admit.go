// Package admit bounds the work in flight, in bytes: a Gate admits claims
// while they fit within a limit over all keys and a limit per key (a
// PChannel), and a claim that does not fit waits for room up to a given
// wait, then is refused with streamwal.ErrResourceExhausted instead of
// queueing without bound. It is the backpressure of the client's appends
// and of a node's append requests (issue 19 item 7).
//
// A claim is admitted whole or not at all. A key (or the whole gate) with
// nothing in flight admits any claim, however large, so that one claim
// above a limit goes alone instead of never. Waiters are woken when room
// frees; they are not served in order, and a large claim may wait while
// small ones pass (until its wait runs out).
package admit

import (
	"context"
	"sync"
	"time"

	"github.com/streamwal/streamwal"
)

// Claim is weight (bytes) in flight under Key.
type Claim[K comparable] struct {
	Key    K
	Weight int64
}

// Gate admits claims within its limits. It is safe for concurrent use.
type Gate[K comparable] struct {
	total, perKey int64 // the limits (<= 0: none)

	mu      sync.Mutex
	used    int64
	byKey   map[K]int64
	waiters int           // callers of Acquire waiting for room
	freed   chan struct{} // closed (and replaced) when room frees while some wait
}

// New returns a gate that admits up to total bytes in flight over all
// keys and up to perKey under any one key; a limit <= 0 is no limit.
func New[K comparable](total, perKey int64) *Gate[K] {
	return &Gate[K]{total: total, perKey: perKey, byKey: map[K]int64{}, freed: make(chan struct{})}
}

// Acquire admits claims (of distinct keys) once they fit, waiting for
// room up to wait (none if wait <= 0) or until ctx ends; then it refuses
// them with a streamwal.CodeResourceExhausted error (which wraps ctx's
// error when ctx ended first). Admitted claims stay in flight until
// Released.
func (g *Gate[K]) Acquire(ctx context.Context, wait time.Duration, claims ...Claim[K]) error {
	freed, ok := g.enter(claims, false)
	if ok {
		return nil
	}
	if wait <= 0 {
		g.leave()
		return g.refusal(claims, wait)
	}
	defer g.leave()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-freed:
			if freed, ok = g.enter(claims, true); ok {
				return nil
			}
		case <-timer.C:
			return g.refusal(claims, wait)
		case <-ctx.Done():
			return streamwal.Errorf(streamwal.CodeResourceExhausted, "gave up waiting for room in flight: %w", ctx.Err())
		}
	}
}

// enter admits claims if they fit; otherwise it returns the channel that
// says room freed, counting the caller as a waiter unless it already
// waits.
func (g *Gate[K]) enter(claims []Claim[K], waiting bool) (<-chan struct{}, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fitsLocked(claims) {
		for _, c := range claims {
			g.addLocked(c.Key, c.Weight)
		}
		return nil, true
	}
	if !waiting {
		g.waiters++
	}
	return g.freed, false
}

// leave ends a wait.
func (g *Gate[K]) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.waiters--
}

// fitsLocked reports whether claims fit: under each limit, or where
// nothing is in flight.
func (g *Gate[K]) fitsLocked(claims []Claim[K]) bool {
	var sum int64
	for _, c := range claims {
		sum += c.Weight
		if in := g.byKey[c.Key]; g.perKey > 0 && in > 0 && in+c.Weight > g.perKey {
			return false
		}
	}
	return g.total <= 0 || g.used == 0 || g.used+sum <= g.total
}

// addLocked adds weight (negative: removes it) in flight under key.
func (g *Gate[K]) addLocked(key K, weight int64) {
	g.used += weight
	if in := g.byKey[key] + weight; in > 0 {
		g.byKey[key] = in
	} else {
		delete(g.byKey, key)
	}
}

// Release ends weight in flight under key, admitted by Acquire, and
// wakes the waiters.
func (g *Gate[K]) Release(key K, weight int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.addLocked(key, -weight)
	if g.waiters > 0 {
		close(g.freed)
		g.freed = make(chan struct{})
	}
}

// InFlight is the weight in flight, over all keys and under key.
func (g *Gate[K]) InFlight(key K) (total, under int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used, g.byKey[key]
}

// refusal is the error of claims that found no room within wait.
func (g *Gate[K]) refusal(claims []Claim[K], wait time.Duration) error {
	var sum int64
	for _, c := range claims {
		sum += c.Weight
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return streamwal.Errorf(streamwal.CodeResourceExhausted, "no room for %d bytes within %v: %d bytes in flight (limit %d, %d a key)",
		sum, wait, g.used, g.total, g.perKey)
}
