package main

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/telemetry/oteltrace"
)

// otlpReceiver is an OTLP/HTTP traces receiver that keeps the spans it
// is sent, as trace ID -> span names.
type otlpReceiver struct {
	mu    sync.Mutex
	spans map[string][]string
}

// ServeHTTP decodes one export request.
func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	var export collector.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &export)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range export.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				id := hex.EncodeToString(s.TraceId)
				r.spans[id] = append(r.spans[id], s.Name)
			}
		}
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collector.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// names returns the span names received for a trace.
func (r *otlpReceiver) names(traceID string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.spans[traceID]...)
}

// TestServeExportsTraces: serve --otlp-endpoint exports, over OTLP/HTTP,
// the node's spans of an append made by a traced client, in the client's
// trace (wal.append and its wal.appendimpl); a bad endpoint is refused.
func TestServeExportsTraces(t *testing.T) {
	_, err := runBinary(t, "", "serve", "--otlp-endpoint", "localhost:4318")
	require.ErrorContains(t, err, "--otlp-endpoint")

	recv := &otlpReceiver{spans: map[string][]string{}}
	collectorSrv := httptest.NewServer(recv)
	defer collectorSrv.Close()
	p := startServe(t, t.TempDir(), "--pchannels", "2", "--otlp-endpoint", collectorSrv.URL+"/v1/traces")
	url := p.waitURL(serveTimeout)
	vchannels := createCollection(t, url, 1)
	v, err := streamwal.ParseVChannel(vchannels[0])
	require.NoError(t, err)

	mine := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mine))
	c, err := client.Connect(url, client.WithoutLocalBypass(), client.WithTracerProvider(tp))
	require.NoError(t, err)
	defer closeLater(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = c.AppendBytes(ctx, v, []byte("traced"))
	require.NoError(t, err)
	require.NotEmpty(t, mine.GetSpans(), "the client traced its append")
	traceID := mine.GetSpans()[0].SpanContext.TraceID().String()

	deadline := time.Now().Add(30 * time.Second)
	for {
		got := recv.names(traceID)
		if slices.Contains(got, oteltrace.SpanAppend) && slices.Contains(got, oteltrace.SpanAppendImpl) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve exported %v of the client's trace %s, want %s and %s", got, traceID, oteltrace.SpanAppend, oteltrace.SpanAppendImpl)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
