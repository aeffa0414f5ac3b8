package main

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/streamwal/streamwal/telemetry"
	"github.com/streamwal/streamwal/telemetry/oteltrace"
)

// flagOTLPEndpoint is the flag that exports a process's traces.
const flagOTLPEndpoint = "otlp-endpoint"

// checkOTLP refuses an --otlp-endpoint that is not an http(s) URL.
func checkOTLP(endpoint string) error {
	if endpoint == "" {
		return nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--%s %q: want the URL of an OTLP/HTTP traces receiver, such as http://localhost:4318/v1/traces", flagOTLPEndpoint, endpoint)
	}
	return nil
}

// startTracing returns the hooks that trace a component's work (the
// OpenTelemetry adapter, telemetry/oteltrace) into a tracer provider that
// exports spans to endpoint over OTLP/HTTP (protobuf) in batches, as
// service, and its shutdown, which flushes what is left; no hooks and a
// no-op without an endpoint. Spans are sampled as the caller's trace
// context says: a node traces the appends of messages that carry one
// (the client's spans).
func startTracing(endpoint, service string) (telemetry.Hooks, func(), error) {
	if endpoint == "" {
		return nil, func() {}, nil
	}
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(endpoint))
	if err != nil {
		return nil, nil, fmt.Errorf("--%s: %w", flagOTLPEndpoint, err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", service))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return telemetry.Hooks{oteltrace.New(tp)}, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx)
	}, nil
}
