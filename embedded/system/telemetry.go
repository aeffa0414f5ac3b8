package system

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
	"github.com/streamwal/streamwal/telemetry/endpoint"
	"github.com/streamwal/streamwal/telemetry/oteltrace"
)

// ErrNotReady is wrapped by Ready's errors.
var ErrNotReady = errors.New("not ready")

// readyViewTimeout bounds Ready's question to the coordinator.
const readyViewTimeout = 2 * time.Second

// startEndpoint serves Options.MetricsAddr, if set, and adds its metrics
// hook to every coordinator's and node's hooks.
func (s *System) startEndpoint() error {
	if s.opts.MetricsAddr == "" {
		return nil
	}
	e, err := endpoint.Start(endpoint.Options{Addr: s.opts.MetricsAddr, Pprof: s.opts.Pprof, Logger: s.opts.Logger})
	if err != nil {
		return err
	}
	s.endpoint = e
	m := telemetry.Hook(e.Metrics())
	s.opts.Coord.Hooks = append(slices.Clip(s.opts.Coord.Hooks), m)
	s.opts.Node.Hooks = append(slices.Clip(s.opts.Node.Hooks), m)
	return nil
}

// wireTracing adds the OpenTelemetry tracing adapter on
// Options.TracerProvider, if set, to every coordinator's and node's
// hooks.
func (s *System) wireTracing() {
	if s.opts.TracerProvider == nil {
		return
	}
	h := telemetry.Hook(oteltrace.New(s.opts.TracerProvider))
	s.opts.Coord.Hooks = append(slices.Clip(s.opts.Coord.Hooks), h)
	s.opts.Node.Hooks = append(slices.Clip(s.opts.Node.Hooks), h)
}

// serveReady makes the endpoint's /readyz answer with Ready.
func (s *System) serveReady() {
	if s.endpoint != nil {
		s.endpoint.SetReady(s.Ready)
	}
}

// closeEndpoint stops serving MetricsAddr.
func (s *System) closeEndpoint() {
	if s.endpoint != nil {
		_ = s.endpoint.Close()
	}
}

// MetricsAddr is the address the system's endpoint listens on (its port
// picked if Options.MetricsAddr gave 0), or "" without one.
func (s *System) MetricsAddr() string {
	if s.endpoint == nil {
		return ""
	}
	return s.endpoint.Addr()
}

// Ready reports whether the system serves, from what its components
// confirm: every coordinator is active or a healthy standby, every node
// serves what it was asked to, and the active coordinator's view has
// every PChannel ASSIGNED and confirmed served (a system is a whole
// cluster).
func (s *System) Ready() error {
	var errs []error
	for _, c := range s.Coordinators() {
		errs = append(errs, c.Ready())
	}
	for _, n := range s.Nodes() {
		errs = append(errs, n.Ready())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyViewTimeout)
	defer cancel()
	v, err := s.View(ctx)
	if err != nil {
		return fmt.Errorf("%w: no coordinator answered: %v", ErrNotReady, err)
	}
	return unserved(v)
}

// unserved names the PChannels of v not served.
func unserved(v wire.View) error {
	if len(v.Channels) == 0 {
		return fmt.Errorf("%w: the coordinator knows no PChannel yet", ErrNotReady)
	}
	var missing []string
	for _, a := range v.Channels {
		if a.State != wire.Assigned || !a.Serving {
			missing = append(missing, fmt.Sprintf("%s (%s)", a.PChannel, a.State))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: not served: %v", ErrNotReady, missing)
	}
	return nil
}
