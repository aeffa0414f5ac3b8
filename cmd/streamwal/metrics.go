package main

import (
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/streamwal/streamwal/logging"
	"github.com/streamwal/streamwal/telemetry"
	"github.com/streamwal/streamwal/telemetry/endpoint"
)

// flagMetricsAddr is the flag of the operational endpoint.
const flagMetricsAddr = "metrics-addr"

// metricsFlags are the flags of a process's telemetry: its operational
// endpoint and the export of its traces.
type metricsFlags struct {
	addr  string
	pprof bool
	otlp  string // traces receiver (flagOTLPEndpoint)
}

// add registers the flags on fl.
func (f *metricsFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&f.addr, flagMetricsAddr, "", "serve /metrics (Prometheus text), /healthz and /readyz over HTTP on HOST:PORT (default: off)")
	fl.BoolVar(&f.pprof, "pprof", false, "with --"+flagMetricsAddr+": serve Go's profiler on /debug/pprof/ too")
	fl.StringVar(&f.otlp, flagOTLPEndpoint, "", "export traces (the appends of messages that carry a trace context, broadcast callbacks)\n"+
		"over OTLP/HTTP to this URL, such as http://localhost:4318/v1/traces (default: off)")
}

// check refuses an address that is not HOST:PORT, and --pprof without an
// address.
func (f *metricsFlags) check() error {
	if err := checkOTLP(f.otlp); err != nil {
		return err
	}
	if f.addr == "" {
		if f.pprof {
			return fmt.Errorf("--pprof needs --%s (it is served on that listener)", flagMetricsAddr)
		}
		return nil
	}
	_, port, err := net.SplitHostPort(f.addr)
	if err != nil {
		return fmt.Errorf("--%s %q: want HOST:PORT: %w", flagMetricsAddr, f.addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("--%s %q: port %q is not a number from 0 to 65535", flagMetricsAddr, f.addr, port)
	}
	return nil
}

// start serves the endpoint when an address is given, says where on w,
// and returns the hooks that feed its metrics (none without an endpoint).
func (f *metricsFlags) start(log zerolog.Logger, w io.Writer) (*endpoint.Endpoint, telemetry.Hooks, error) {
	if f.addr == "" {
		return nil, nil, nil
	}
	e, err := endpoint.Start(endpoint.Options{Addr: f.addr, Pprof: f.pprof, Logger: logging.Component(log, "metrics")})
	if err != nil {
		return nil, nil, fmt.Errorf("--%s: %w", flagMetricsAddr, err)
	}
	printEndpoint(w, e, f.pprof)
	return e, telemetry.Hooks{e.Metrics()}, nil
}

// closeEndpoint stops e, if any.
func closeEndpoint(e *endpoint.Endpoint) {
	if e != nil {
		_ = e.Close()
	}
}

// printEndpoint says where e serves, if anywhere.
func printEndpoint(w io.Writer, e *endpoint.Endpoint, pprof bool) {
	if e == nil {
		return
	}
	extra := ""
	if pprof {
		extra = ", /debug/pprof/"
	}
	fmt.Fprintf(w, "metrics on http://%s/metrics (/healthz, /readyz%s)\n", e.Addr(), extra)
}

// setReady makes e's /readyz answer with check, if e runs.
func setReady(e *endpoint.Endpoint, check func() error) {
	if e != nil {
		e.SetReady(check)
	}
}
