package client

import (
	"context"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// traceContext is the W3C trace context the hooks inject for a request
// of type t sent under ctx ("" without hooks that inject one): what a
// broadcast request carries for its replicas.
func (c *Client) traceContext(ctx context.Context, t *messages.Type) (parent, state string) {
	if len(c.opts.hooks) == 0 {
		return "", ""
	}
	header := map[string][]string{}
	c.opts.hooks.OnInject(ctx, t, header)
	if v := header[messages.HdrTraceParent]; len(v) > 0 {
		parent = v[0]
	}
	if v := header[messages.HdrTraceState]; len(v) > 0 {
		state = v[0]
	}
	return parent, state
}

// noteConsume tells the hooks that m was read under ctx, from JetStream
// (remote from the WAL's node).
func noteConsume(ctx context.Context, hooks telemetry.Hooks, m *messages.ImmutableMessage) {
	if len(hooks) > 0 {
		hooks.OnConsume(ctx, telemetry.ConsumeEvent{Message: m, Remote: true})
	}
}

// noteRequest reports an append request of n messages to the hooks.
func (c *Client) noteRequest(p streamwal.PChannel, n int, results []wire.AppendResult, err error, took time.Duration) {
	e := telemetry.ClientRequestEvent{PChannel: p, Messages: n, Code: streamwal.CodeOf(err), Latency: took}
	for _, r := range results {
		if r.Error != nil {
			e.Failed++
		}
	}
	c.opts.hooks.OnClientRequest(e)
}
