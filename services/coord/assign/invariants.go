package assign

import (
	"errors"
	"fmt"
	"maps"

	"github.com/streamwal/streamwal"
)

// checkInvariants reports what breaks the machine's invariants between
// two events (every persist answered). They hold whatever persists
// failed; tests check them after every step.
func (m *Machine) checkInvariants() error {
	var errs []error
	if len(m.pending) > 0 {
		errs = append(errs, fmt.Errorf("%d persists unanswered", len(m.pending)))
	}
	for _, ch := range m.channels {
		if err := m.checkChannel(ch); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ch.p, err))
		}
	}
	if len(m.byName) != len(m.channels) {
		errs = append(errs, fmt.Errorf("%d channels, %d by name", len(m.channels), len(m.byName)))
	}
	counts := maps.Clone(m.counts)
	m.countVChannels()
	if !maps.Equal(counts, m.counts) {
		errs = append(errs, fmt.Errorf("VChannel counts %v, but the allocation places %v", counts, m.counts))
	}
	return errors.Join(errs...)
}

// checkChannel checks one PChannel's record against its state.
func (m *Machine) checkChannel(ch *channel) error {
	r := ch.rec
	switch {
	case ch.next != nil:
		return errors.New("a proposal is left unanswered")
	case m.byName[ch.p] != ch:
		return errors.New("not found by its name")
	case r.Term > ch.fence:
		return fmt.Errorf("term %d above its fence %d", r.Term, ch.fence)
	case ch.opening && (r.State != streamwal.Assigning || r.Term != ch.fence):
		return fmt.Errorf("an open under way, but %s under term %d (fence %d)", r.State, r.Term, ch.fence)
	case (r.Node == "") != (r.State == streamwal.Uninitialized || r.State == streamwal.Unavailable):
		return fmt.Errorf("%s on node %q", r.State, r.Node)
	case r.Serving && r.State != streamwal.Assigned:
		return fmt.Errorf("served while %s", r.State)
	case r.Serving && r.Error != "":
		return fmt.Errorf("served with an open error %q", r.Error)
	case r.State != streamwal.Assigned && (r.Session != "" || r.Version != 0):
		return fmt.Errorf("%s with session %q version %d", r.State, r.Session, r.Version)
	case ch.retry.delay < 0 || ch.retry.delay > m.cfg.RetryMax:
		return fmt.Errorf("retry delay %v out of [0, %v]", ch.retry.delay, m.cfg.RetryMax)
	}
	return nil
}
