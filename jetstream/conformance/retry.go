package conformance

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// testIdempotentRetry: an append repeated with the message IDs of one that
// landed writes nothing and answers the original's MessageIDs (the package
// doc's promise), for one message and for several.
func (e *env) testIdempotentRetry(t *testing.T) {
	ctx := testContext(t)
	b := e.backend(t)
	p := e.pchannel(t, "retry")
	v := vchannel(t, p, 1)
	w := openWriter(ctx, t, b, p, 1)
	last := w.Barrier().ID()
	build := func(ids ...string) []*messages.MutableMessage {
		out := make([]*messages.MutableMessage, len(ids))
		for i, id := range ids {
			out[i] = e.insert(t, v, id, id)
		}
		return out
	}
	for _, c := range []struct {
		name string
		ids  []string
	}{
		{"one message", []string{"r-1"}},
		{"three messages", []string{"r-2", "r-3", "r-4"}},
	} {
		orig := appendOne(ctx, t, w, build(c.ids...)...)
		last = orig[len(orig)-1]
		for try := range 2 {
			got, err := w.Append(ctx, build(c.ids...)...)
			switch {
			case errors.Is(err, streamwal.ErrDuplicate):
				t.Errorf("%s, retry %d: ErrDuplicate; want the original MessageIDs %v (the package doc: duplicates resolve to the sequence of the original)", c.name, try, orig)
			case err != nil:
				t.Errorf("%s, retry %d: %v", c.name, try, err)
			case !slices.Equal(got, orig):
				t.Errorf("%s, retry %d: MessageIDs %v, want the original %v", c.name, try, got, orig)
			}
			e.nothingWritten(ctx, t, fmt.Sprintf("retry %d of %s", try, c.name), w, v, &last)
		}
	}
	// A retry mixed with new messages: whatever the answer, no message ID
	// is stored twice and an acknowledged new message is there.
	got, err := w.Append(ctx, build("r-1", "r-5")...)
	t.Logf("append of a stored and a new message: %v, %v", got, err)
	mark := appendOne(ctx, t, w, e.insert(t, v, "mark", ""))[0]
	all := mustReadRange(ctx, t, b, p, jetstream.ReadOptions{Start: jetstream.Earliest()}, mark)
	seen := map[string]messages.MessageID{}
	for _, m := range all {
		if at, dup := seen[m.MsgID()]; dup {
			t.Errorf("message ID %q stored at %d and %d", m.MsgID(), at, m.ID())
		}
		seen[m.MsgID()] = m.ID()
	}
	if err != nil && !errors.Is(err, streamwal.ErrUnknownOutcome) && seen["r-5"] != 0 {
		t.Errorf("the mixed append failed with %v, but its new message landed at %d", err, seen["r-5"])
	}
	if err == nil && (len(got) != 2 || seen["r-5"] != got[1] || seen["r-1"] != got[0]) {
		t.Errorf("the mixed append answered %v, but r-1 is at %d and r-5 at %d", got, seen["r-1"], seen["r-5"])
	}
}
