package node

import (
	"context"

	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
)

// appendTrace is what the hooks that follow messages
// (telemetry.MessageAppendHook) keep of an append request's messages:
// the context each returned, by the message's index in the request's
// decoded messages (nil where they kept none). The zero appendTrace
// tells nobody anything.
type appendTrace struct {
	hooks telemetry.Hooks
	ctxs  []context.Context
}

// traceAppend tells the message hooks of each message of msgs that its
// append starts, with the encoded headers header(i) of msgs[i] as they
// reached the node; the zero appendTrace when no hook follows messages.
// The contexts of the messages are kept only once a hook returns one of
// its own (the OpenTelemetry adapter does for a message that carries a
// sampled trace context), so that a request whose messages nobody traces
// allocates nothing.
func (n *Node) traceAppend(msgs []*messages.MutableMessage, header func(i int) map[string][]string) appendTrace {
	if !n.followsMessages {
		return appendTrace{}
	}
	t := appendTrace{hooks: n.cfg.Hooks}
	bg := context.Background()
	for i, m := range msgs {
		ctx := t.hooks.OnMessageAppendStart(bg, telemetry.MessageAppendEvent{PChannel: m.PChannel(), Message: m, Header: header(i)})
		if ctx == bg {
			continue
		}
		if t.ctxs == nil {
			t.ctxs = make([]context.Context, len(msgs))
		}
		t.ctxs[i] = ctx
	}
	return t
}

// traceHeader is the header of a message handed over in this process
// (the local bypass), as a request would carry its trace context: nil
// without one.
func traceHeader(m *messages.MutableMessage) map[string][]string {
	parent, state := m.Trace()
	if parent == "" {
		return nil
	}
	h := map[string][]string{messages.HdrTraceParent: {parent}}
	if state != "" {
		h[messages.HdrTraceState] = []string{state}
	}
	return h
}

// end tells the hooks each message's outcome: where it landed, or its
// error.
func (t appendTrace) end(out []*messages.ImmutableMessage, errs []error) {
	if t.hooks == nil {
		return
	}
	for i := range out {
		ctx := context.Background()
		if t.ctxs != nil && t.ctxs[i] != nil {
			ctx = t.ctxs[i]
		}
		e := telemetry.MessageAppendEndEvent{Err: errs[i]}
		if e.Err == nil {
			e.Message = out[i]
		}
		t.hooks.OnMessageAppendEnd(ctx, e)
	}
}
