package messages

import (
	"strings"
	"sync"

	"github.com/streamwal/streamwal"
)

// Registry maps type names and tokens to types. A new registry holds the
// built-in catalog; an application adds its own types with Register. A
// Registry is safe for concurrent use; registered types never change.
type Registry struct {
	mu      sync.RWMutex
	byName  map[string]*Type
	byToken map[streamwal.Token]*Type
	order   []*Type
}

// NewRegistry returns a registry holding the built-in catalog.
func NewRegistry() *Registry {
	r := &Registry{byName: map[string]*Type{}, byToken: map[streamwal.Token]*Type{}}
	for _, t := range builtinTypes {
		r.add(t)
	}
	return r
}

// TypeSpec declares an application type. Application types are DML-like
// (DispatchVChannel) or broadcast types; the WAL treats their payload as
// opaque bytes.
type TypeSpec struct {
	// Name is the header name: an upper-case ASCII letter, then letters and
	// digits. Its lower-cased form is the subject token.
	Name     string
	Dispatch Dispatch
	Lock     Lock
	Keys     []KeyRule
	// Flags may include FlagAckSyncUp, FlagUnreplicable, FlagNotTraced and
	// FlagTxnBody; the WAL-internal flags are refused.
	Flags Flags
}

// appFlags are the flags an application type may set.
const appFlags = FlagAckSyncUp | FlagUnreplicable | FlagNotTraced | FlagTxnBody

// Register validates spec and adds it. A name or token already taken, a
// WAL-internal flag or dispatch, or an inconsistent declaration is an
// ErrBadType error and registers nothing.
func (r *Registry) Register(spec TypeSpec) (*Type, error) {
	t := &Type{Name: spec.Name, Token: streamwal.Token(strings.ToLower(spec.Name)), Dispatch: spec.Dispatch,
		Lock: spec.Lock, Keys: append([]KeyRule(nil), spec.Keys...), Flags: spec.Flags}
	if err := t.validate(); err != nil {
		return nil, err
	}
	if spec.Flags&^appFlags != 0 {
		return nil, wrapInvalid(ErrBadType, "type %s: flags %b are reserved for the WAL", spec.Name, spec.Flags&^appFlags)
	}
	if spec.Dispatch == DispatchPChannel {
		return nil, wrapInvalid(ErrBadType, "type %s: PChannel-level dispatch is reserved for the WAL", spec.Name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byName[t.Name]; ok {
		return nil, wrapInvalid(ErrBadType, "type %s already registered", t.Name)
	}
	if old, ok := r.byToken[t.Token]; ok {
		return nil, wrapInvalid(ErrBadType, "type %s: token %q already used by %s", t.Name, t.Token, old.Name)
	}
	r.add(t)
	return t, nil
}

// add inserts a validated type; the caller holds the lock or owns r.
func (r *Registry) add(t *Type) {
	r.byName[t.Name] = t
	r.byToken[t.Token] = t
	r.order = append(r.order, t)
}

// Lookup returns the type of a name.
func (r *Registry) Lookup(name string) (*Type, error) {
	r.mu.RLock()
	t, ok := r.byName[name]
	r.mu.RUnlock()
	if !ok {
		return nil, wrapInvalid(ErrUnknownType, "%q", name)
	}
	return t, nil
}

// LookupToken returns the type of a subject token.
func (r *Registry) LookupToken(tok streamwal.Token) (*Type, error) {
	r.mu.RLock()
	t, ok := r.byToken[tok]
	r.mu.RUnlock()
	if !ok {
		return nil, wrapInvalid(ErrUnknownType, "token %q", tok)
	}
	return t, nil
}

// Types returns every registered type, built-ins first, in registration
// order.
func (r *Registry) Types() []*Type {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]*Type(nil), r.order...)
}

// Has reports whether t is this registry's type of its name.
func (r *Registry) Has(t *Type) bool {
	if t == nil {
		return false
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.byName[t.Name] == t
}
