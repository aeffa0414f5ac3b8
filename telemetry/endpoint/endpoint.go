// Package endpoint serves a process's operational HTTP endpoints on one
// listener: /metrics (OpenTelemetry metrics of the telemetry hooks, in the
// Prometheus text format, with the Go runtime's and the process's own),
// /healthz (the process runs), /readyz (its components serve, as a check
// the process sets says) and, when asked, /debug/pprof/.
package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/telemetry/otelmetrics"
)

// Options configure an endpoint.
type Options struct {
	// Addr is the HOST:PORT to listen on (port 0 picks a free one).
	Addr string
	// Pprof serves net/http/pprof under /debug/pprof/.
	Pprof bool
	// Logger receives the server's errors (default: none).
	Logger zerolog.Logger
	// Service is the service.name of the metrics' resource (target_info),
	// default "streamwal".
	Service string
}

// Endpoint is a running HTTP server of a process's operational endpoints.
type Endpoint struct {
	ln       net.Listener
	srv      *http.Server
	provider *sdkmetric.MeterProvider
	metrics  *otelmetrics.Metrics
	ready    atomic.Pointer[func() error]
	done     chan struct{}
}

// errStarting is /readyz's answer before the process set its check.
var errStarting = errors.New("starting")

// Start listens on o.Addr and serves. Readiness is "starting" (503) until
// SetReady.
func Start(o Options) (*Endpoint, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeInternal, "prometheus exporter: %v", err)
	}
	if o.Service == "" {
		o.Service = "streamwal"
	}
	res := resource.NewSchemaless(attribute.String("service.name", o.Service))
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))
	m, err := otelmetrics.New(provider)
	if err != nil {
		_ = provider.Shutdown(context.Background())
		return nil, err
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		_ = provider.Shutdown(context.Background())
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "metrics address %q: %v", o.Addr, err)
	}
	e := &Endpoint{ln: ln, provider: provider, metrics: m, done: make(chan struct{})}
	e.srv = &http.Server{Handler: e.mux(reg, o.Pprof), ReadHeaderTimeout: 5 * time.Second}
	log := o.Logger
	go func() {
		defer close(e.done)
		if err := e.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Str("addr", ln.Addr().String()).Msg("metrics endpoint stopped")
		}
	}()
	return e, nil
}

// mux routes the endpoints.
func (e *Endpoint) mux(reg *prometheus.Registry, withPprof bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", e.serveReady)
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// serveReady answers 200 when the readiness check passes, 503 with its
// error otherwise.
func (e *Endpoint) serveReady(w http.ResponseWriter, _ *http.Request) {
	err := errStarting
	if check := e.ready.Load(); check != nil {
		err = (*check)()
	}
	if err != nil {
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = fmt.Fprintln(w, "ready")
}

// SetReady sets the check /readyz runs at each request: nil error means
// ready.
func (e *Endpoint) SetReady(check func() error) { e.ready.Store(&check) }

// Metrics is the hook to put in the components' Hooks: what it records
// is served on /metrics.
func (e *Endpoint) Metrics() *otelmetrics.Metrics { return e.metrics }

// Addr is the address listened on (with the port picked for port 0).
func (e *Endpoint) Addr() string { return e.ln.Addr().String() }

// Close stops serving, within a second for requests in flight.
func (e *Endpoint) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := e.srv.Shutdown(ctx)
	if err != nil {
		_ = e.srv.Close()
	}
	<-e.done
	return errors.Join(err, e.provider.Shutdown(ctx))
}
