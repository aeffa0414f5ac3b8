package recovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
)

// Sentinels of the Store contract; implementations wrap them with the key.
var (
	// ErrNotFound: the key does not exist (or was deleted).
	ErrNotFound = errors.New("recovery: key not found")
	// ErrConflict: a compare-and-set write met another revision than the
	// one it was conditioned on.
	ErrConflict = errors.New("recovery: revision mismatch")
)

// Store is the key-value storage a [Persister] writes: a JetStream KV
// bucket in production ([NewKV]), a [Memory] in tests. Revisions are
// positive and grow with every write of the store; revision 0 means "the
// key is absent". Implementations are safe for concurrent use.
type Store interface {
	// Get returns key's value and revision, or an error matching
	// ErrNotFound if the key is absent.
	Get(ctx context.Context, key string) (value []byte, rev uint64, err error)
	// Put writes value iff the key's current revision is rev (rev 0: only
	// if the key is absent) and returns the new revision; otherwise it
	// returns an error matching ErrConflict and writes nothing.
	Put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
	// Delete removes key, whatever its revision; deleting an absent key is
	// not an error.
	Delete(ctx context.Context, key string) error
}

// notFound wraps ErrNotFound with the key.
func notFound(key string) error { return fmt.Errorf("get %s: %w", key, ErrNotFound) }

// conflict wraps ErrConflict with the key and the expected revision.
func conflict(key string, rev uint64) error {
	return fmt.Errorf("put %s at revision %d: %w", key, rev, ErrConflict)
}

// Memory is an in-memory [Store], safe for concurrent use. Its revisions
// grow across keys, as a KV bucket's do.
type Memory struct {
	mu   sync.Mutex
	seq  uint64
	keys map[string]memEntry
}

// memEntry is one stored value.
type memEntry struct {
	value []byte
	rev   uint64
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory { return &Memory{keys: map[string]memEntry{}} }

// Get implements [Store].
func (m *Memory) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, unavailable("get", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.keys[key]
	if !ok {
		return nil, 0, notFound(key)
	}
	return bytes.Clone(e.value), e.rev, nil
}

// Put implements [Store].
func (m *Memory) Put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, unavailable("put", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.keys[key].rev != rev {
		return 0, conflict(key, rev)
	}
	m.seq++
	m.keys[key] = memEntry{value: bytes.Clone(value), rev: m.seq}
	return m.seq, nil
}

// Delete implements [Store].
func (m *Memory) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return unavailable("delete", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.keys, key)
	return nil
}

// The operations a [Faulty] reports to its hooks.
const (
	OpGet    = "get"
	OpPut    = "put"
	OpDelete = "delete"
)

// Faulty wraps a Store and injects failures, for tests of crashes between
// writes and of unknown outcomes. Its hooks are called with the operation
// (OpGet, OpPut, OpDelete) and the key; they must be safe for concurrent
// use if the Faulty is used concurrently. A Faulty with nil hooks behaves
// as its Store.
type Faulty struct {
	// Store is the wrapped store.
	Store Store
	// Fail is called before the operation: a non-nil error is returned
	// instead of calling Store, so the operation did not happen.
	Fail func(op, key string) error
	// After is called once Store's operation succeeded: a non-nil error is
	// returned instead of its result, so the operation took effect but the
	// caller is told it failed (an unknown outcome).
	After func(op, key string) error
}

// Get implements [Store].
func (f *Faulty) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	if err := f.before(OpGet, key); err != nil {
		return nil, 0, err
	}
	v, rev, err := f.Store.Get(ctx, key)
	if err != nil {
		return nil, 0, err
	}
	if err := f.after(OpGet, key); err != nil {
		return nil, 0, err
	}
	return v, rev, nil
}

// Put implements [Store].
func (f *Faulty) Put(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if err := f.before(OpPut, key); err != nil {
		return 0, err
	}
	rev, err := f.Store.Put(ctx, key, value, rev)
	if err != nil {
		return 0, err
	}
	if err := f.after(OpPut, key); err != nil {
		return 0, err
	}
	return rev, nil
}

// Delete implements [Store].
func (f *Faulty) Delete(ctx context.Context, key string) error {
	if err := f.before(OpDelete, key); err != nil {
		return err
	}
	if err := f.Store.Delete(ctx, key); err != nil {
		return err
	}
	return f.after(OpDelete, key)
}

// before runs the Fail hook, if any.
func (f *Faulty) before(op, key string) error {
	if f.Fail == nil {
		return nil
	}
	return f.Fail(op, key)
}

// after runs the After hook, if any.
func (f *Faulty) after(op, key string) error {
	if f.After == nil {
		return nil
	}
	return f.After(op, key)
}
