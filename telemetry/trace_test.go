package telemetry_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
)

// Hooks implements every hook interface that follows work through a
// context.
var (
	_ telemetry.InjectHook            = telemetry.Hooks(nil)
	_ telemetry.AppendCallHook        = telemetry.Hooks(nil)
	_ telemetry.TxnHook               = telemetry.Hooks(nil)
	_ telemetry.BroadcastCallHook     = telemetry.Hooks(nil)
	_ telemetry.ConsumeHook           = telemetry.Hooks(nil)
	_ telemetry.MessageAppendHook     = telemetry.Hooks(nil)
	_ telemetry.BroadcastCallbackHook = telemetry.Hooks(nil)
	_ telemetry.ReplicateAppendHook   = telemetry.Hooks(nil)
)

// tagKey is the context key of a tagger's tags.
type tagKey struct{ name string }

// tagger follows Append calls: it adds its name to the context at the
// start and records, at the end, the tags it finds of itself and of the
// others.
type tagger struct {
	name  string
	start []string // the taggers whose tags the context had at the start
	end   []string // the taggers whose tags the context had at the end
	errs  []error
}

func (g *tagger) seen(ctx context.Context, names ...string) []string {
	var out []string
	for _, n := range names {
		if ctx.Value(tagKey{n}) != nil {
			out = append(out, n)
		}
	}
	return out
}

func (g *tagger) OnAppendCallStart(ctx context.Context, _ telemetry.AppendCallEvent) context.Context {
	g.start = g.seen(ctx, "a", "b")
	return context.WithValue(ctx, tagKey{g.name}, true)
}

func (g *tagger) OnAppendCallEnd(ctx context.Context, err error) {
	g.end = g.seen(ctx, "a", "b")
	g.errs = append(g.errs, err)
}

// TestContextHooksChain: in a list, each hook gets the context the one
// before it returned, and every hook gets the last one at the end, so
// that each finds what it kept; a hook of another event is skipped.
func TestContextHooksChain(t *testing.T) {
	a, b := &tagger{name: "a"}, &tagger{name: "b"}
	hs := telemetry.Hooks{a, &opens{}, telemetry.Hooks{b}}
	ctx := hs.OnAppendCallStart(context.Background(), telemetry.AppendCallEvent{})
	failed := errors.New("failed")
	hs.OnAppendCallEnd(ctx, failed)
	require.Empty(t, a.start)
	require.Equal(t, []string{"a"}, b.start, "b starts under a's context")
	require.Equal(t, []string{"a", "b"}, a.end)
	require.Equal(t, []string{"a", "b"}, b.end)
	require.Equal(t, []error{failed}, a.errs)
	require.Equal(t, []error{failed}, b.errs)

	bg := context.Background()
	require.Equal(t, bg, telemetry.Hooks{&opens{}}.OnAppendCallStart(bg, telemetry.AppendCallEvent{}), "nobody follows: the context given")
}

// TestHas: a hook is found at any depth of a list, and only one that
// implements the interface.
func TestHas(t *testing.T) {
	g := &tagger{name: "a"}
	require.True(t, telemetry.Has[telemetry.AppendCallHook](g))
	require.True(t, telemetry.Has[telemetry.AppendCallHook](telemetry.Hooks{&opens{}, telemetry.Hooks{g}}))
	require.False(t, telemetry.Has[telemetry.AppendCallHook](telemetry.Hooks{&opens{}, telemetry.Hooks{}}), "a list implements it, but holds no hook that does")
	require.False(t, telemetry.Has[telemetry.MessageAppendHook](telemetry.Hooks{g}))
	require.False(t, telemetry.Has[telemetry.MessageAppendHook](nil))
}

// TestNoContextHooksAllocateNothing: the events of the append path cost
// no allocation without a hook that follows them.
func TestNoContextHooksAllocateNothing(t *testing.T) {
	var none telemetry.Hooks
	other := telemetry.Hooks{&opens{}}
	c, err := messages.NewCodec("test", nil)
	require.NoError(t, err)
	v, err := p1.VChannel(1, 0)
	require.NoError(t, err)
	m, err := c.New(messages.TypeInsert, v, []byte("x"))
	require.NoError(t, err)
	msgs := []*messages.MutableMessage{m}
	header := map[string][]string{}
	bg := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		for _, hs := range []telemetry.Hooks{none, other} {
			ctx := hs.OnAppendCallStart(bg, telemetry.AppendCallEvent{Messages: msgs})
			hs.OnInject(ctx, m.Type(), header)
			hs.OnAppendCallEnd(ctx, nil)
			ctx = hs.OnMessageAppendStart(bg, telemetry.MessageAppendEvent{PChannel: p1, Message: m, Header: header})
			hs.OnMessageAppendEnd(ctx, telemetry.MessageAppendEndEvent{})
			ctx = hs.OnReplicateAppendStart(bg, telemetry.ReplicateAppendEvent{PChannel: p1, Source: "prim", Replicas: msgs})
			hs.OnReplicateAppendEnd(ctx, telemetry.ReplicateAppendEndEvent{})
		}
	})
	require.Zero(t, allocs)
	require.Empty(t, header)
}
