package node

import (
	"context"

	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
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

// traceAppend tells the message hooks of each message of msgs (decoded
// from the request's messages wms, msgs[i] from wms[index[i]]) that its
// append starts; the zero appendTrace when no hook follows messages. The
// contexts of the messages are kept only once a hook returns one of its
// own (the OpenTelemetry adapter does for a message that carries a
// sampled trace context), so that a request whose messages nobody traces
// allocates nothing.
func (n *Node) traceAppend(msgs []*messages.MutableMessage, wms []wire.Message, index []int) appendTrace {
	if !n.followsMessages {
		return appendTrace{}
	}
	t := appendTrace{hooks: n.cfg.Hooks}
	bg := context.Background()
	for i, m := range msgs {
		ctx := t.hooks.OnMessageAppendStart(bg, telemetry.MessageAppendEvent{PChannel: m.PChannel(), Message: m, Header: wms[index[i]].Header})
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
