package hfl

// EmbeddedWaiters exposes the waiter count to the external tests.
func EmbeddedWaiters(s *EmbeddedStore) int { return s.waitersLen() }
