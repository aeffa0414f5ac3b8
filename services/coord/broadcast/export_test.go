package broadcast

// KeysWaiting is how many broadcasts wait for their resource keys (for
// tests that must know a broadcast is queued behind another).
func (b *Broadcaster) KeysWaiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.locks.Waiting()
}

// KeysHeld reports whether broadcast id holds its resource keys.
func (b *Broadcaster) KeysHeld(id uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.locks.Held(id)
}
