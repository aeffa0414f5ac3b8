package faulty

import (
	"slices"
	"sync/atomic"

	"github.com/streamwal/streamwal/messages"
)

// Pass lets every operation through: a backend wrapped with it behaves as
// the backend it wraps.
var Pass Injector = InjectorFunc(func(Call) Fault { return Fault{} })

// When injects f into every operation pred accepts.
func When(pred func(c Call) bool, f Fault) Injector {
	return InjectorFunc(func(c Call) Fault {
		if pred(c) {
			return f
		}
		return Fault{}
	})
}

// AppendsOf injects f into every append with a message of type t.
func AppendsOf(t *messages.Type, f Fault) Injector {
	return When(func(c Call) bool { return c.Op == OpAppend && c.HasType(t) }, f)
}

// Nth injects f into the nth operation of kind op (counting from 1), and
// lets every other one through.
func Nth(op Op, n int, f Fault) Injector {
	var seen atomic.Int64
	return InjectorFunc(func(c Call) Fault {
		if c.Op == op && seen.Add(1) == int64(n) {
			return f
		}
		return Fault{}
	})
}

// Once passes on the first fault inj decides that is not the zero Fault,
// and lets every operation after it through.
func Once(inj Injector) Injector {
	var fired atomic.Bool
	return InjectorFunc(func(c Call) Fault {
		if fired.Load() {
			return Fault{}
		}
		f := inj.Inject(c)
		if f.zero() || !fired.CompareAndSwap(false, true) {
			return Fault{}
		}
		return f
	})
}

// First asks each injector in turn and returns the first fault that is
// not the zero Fault.
func First(injs ...Injector) Injector {
	return InjectorFunc(func(c Call) Fault {
		for _, inj := range injs {
			if f := inj.Inject(c); !f.zero() {
				return f
			}
		}
		return Fault{}
	})
}

// Switch injects its fault into the operations of its kinds while it is
// on, and counts the faults it injected. It starts off; it is safe for
// concurrent use.
type Switch struct {
	f        Fault
	ops      []Op
	on       atomic.Bool
	injected atomic.Int64
}

// NewSwitch returns a switch, off, that injects f into the operations of
// the kinds ops (of every kind when none is given).
func NewSwitch(f Fault, ops ...Op) *Switch {
	return &Switch{f: f, ops: ops}
}

// On starts injecting.
func (s *Switch) On() { s.on.Store(true) }

// Off stops injecting.
func (s *Switch) Off() { s.on.Store(false) }

// Injected counts the faults injected so far.
func (s *Switch) Injected() int64 { return s.injected.Load() }

// Inject implements [Injector].
func (s *Switch) Inject(c Call) Fault {
	if !s.on.Load() || len(s.ops) > 0 && !slices.Contains(s.ops, c.Op) {
		return Fault{}
	}
	s.injected.Add(1)
	return s.f
}
