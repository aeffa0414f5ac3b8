package admit

// Waiters is how many callers of Acquire wait for room, for tests.
func (g *Gate[K]) Waiters() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiters
}
