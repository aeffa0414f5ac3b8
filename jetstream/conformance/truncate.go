package conformance

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// testTruncateReopen: truncation keeps the newest barrier and the stream's
// tail, writers keep working, a higher term reopens and fences the old
// writer, and terms at or below the newest barrier stay fenced.
func (e *env) testTruncateReopen(t *testing.T) {
	ctx := testContext(t)
	b := e.backend(t)
	p := e.pchannel(t, "trunc")
	v := vchannel(t, p, 1)
	earliest := func(through messages.MessageID) []*messages.ImmutableMessage {
		t.Helper()
		return mustReadRange(ctx, t, b, p, jetstream.ReadOptions{Start: jetstream.Earliest()}, through)
	}
	// history is every ID appended, in order: what Earliest delivers with
	// an archive, whatever was truncated.
	var history []messages.MessageID
	kept := func(stream []messages.MessageID, through messages.MessageID) []messages.MessageID {
		t.Helper()
		if !e.h.Archive {
			return stream
		}
		return upTo(history, through)
	}
	truncate := func(below messages.MessageID) {
		t.Helper()
		if err := b.Truncate(ctx, p, below); err != nil {
			t.Fatalf("truncate %s below %d: %v", p, below, err)
		}
	}
	appendN := func(w jetstream.Writer, n int, what string) []messages.MessageID {
		t.Helper()
		var ids []messages.MessageID
		for i := 0; i < n; {
			k := min(1+i%3, n-i)
			msgs := make([]*messages.MutableMessage, k)
			for j := range msgs {
				msgs[j] = e.insert(t, v, fmt.Sprintf("%s #%d", what, i+j), "")
			}
			got := appendOne(ctx, t, w, msgs...)
			if len(ids) > 0 && got[0] != ids[len(ids)-1]+1 {
				t.Fatalf("%s: append landed at %d after %d with a single writer", what, got[0], ids[len(ids)-1])
			}
			ids, i = append(ids, got...), i+k
		}
		history = append(history, ids...)
		return ids
	}
	open := func(b jetstream.Backend, term uint64) (jetstream.Writer, messages.MessageID) {
		t.Helper()
		w := openWriter(ctx, t, b, p, term)
		history = append(history, w.Barrier().ID())
		return w, w.Barrier().ID()
	}

	w1, b1 := open(b, 1)
	as := appendN(w1, 40, "term 1")
	truncate(as[25])
	sameIDs(t, "earliest after truncating below "+as[25].String(), earliest(as[39]),
		kept(append([]messages.MessageID{b1}, as[25:]...), as[39]))
	e.checkState(ctx, t, b, p, "after truncating below "+as[25].String(), jetstream.StreamState{
		First: as[25], Last: as[39], Messages: 15, ArchivedBelow: e.archivedBelow(as[25])})

	more := appendN(w1, 5, "term 1 after truncation")
	if more[0] != as[39]+1 {
		t.Errorf("after truncation the writer appended at %d, want %d", more[0], as[39]+1)
	}

	// A writer of a higher term on another connection opens after the
	// truncation and fences the first.
	w2, b2 := open(e.backend(t), 2)
	if b2 != more[4]+1 {
		t.Errorf("barrier of term 2 at %d, want %d (right after the tail)", b2, more[4]+1)
	}
	_, err := w1.Append(ctx, e.insert(t, v, "term 1 after term 2 opened", ""))
	expectCode(t, "append of the term 1 writer after term 2 opened", err, streamwal.ErrFenced)
	if !closedWithin(w1.Done(), promptly) {
		t.Errorf("the fenced writer did not stop")
	} else if err := w1.Err(); !errors.Is(err, streamwal.ErrFenced) {
		t.Errorf("the fenced writer's Err is %v, want ErrFenced", err)
	}
	ys := appendN(w2, 6, "term 2")
	want := append(append(append([]messages.MessageID{b1}, as[25:]...), more...), b2)
	sameIDs(t, "earliest after reopening", earliest(ys[5]), kept(append(want, ys...), ys[5]))

	// Truncating above the newest barrier keeps it, and drops the older.
	truncate(ys[2])
	sameIDs(t, "earliest after truncating above the barrier", earliest(ys[5]),
		kept(append([]messages.MessageID{b2}, ys[2:]...), ys[5]))

	// Truncating everything keeps only the newest barrier.
	truncate(ys[5] + 1)
	sameIDs(t, "earliest after truncating everything", earliest(b2), kept([]messages.MessageID{b2}, b2))
	e.checkState(ctx, t, b, p, "after truncating everything", jetstream.StreamState{
		First: ys[5] + 1, Last: ys[5], ArchivedBelow: e.archivedBelow(ys[5] + 1)})
	z := appendN(w2, 1, "term 2 after truncating everything")[0]
	if z != ys[5]+1 {
		t.Errorf("after truncating everything the writer appended at %d, want %d", z, ys[5]+1)
	}
	sameIDs(t, "earliest after appending", earliest(z), kept([]messages.MessageID{b2, z}, z))

	// Truncating beyond the tail removes everything but does not move it.
	truncate(z + 1000)
	sameIDs(t, "earliest after truncating beyond the tail", earliest(b2), kept([]messages.MessageID{b2}, b2))
	e.checkState(ctx, t, b, p, "after truncating beyond the tail", jetstream.StreamState{
		First: z + 1, Last: z, ArchivedBelow: e.archivedBelow(z + 1)})
	z2 := appendN(w2, 1, "term 2 after truncating beyond the tail")[0]
	if z2 != z+1 {
		t.Errorf("after truncating beyond the tail the writer appended at %d, want %d", z2, z+1)
	}

	// Truncation does not forget the terms.
	for _, term := range []uint64{1, 2} {
		w, err := b.OpenWriter(ctx, p, term)
		if err == nil {
			_ = w.Close()
		}
		expectCode(t, fmt.Sprintf("open under term %d after truncation", term), err, streamwal.ErrFenced)
	}
	w3, b3 := open(b, 3)
	if b3 != z2+1 {
		t.Errorf("barrier of term 3 at %d, want %d", b3, z2+1)
	}
	_, err = w2.Append(ctx, e.insert(t, v, "term 2 after term 3 opened", ""))
	expectCode(t, "append of the term 2 writer after term 3 opened", err, streamwal.ErrFenced)
	last := appendN(w3, 2, "term 3")
	got := earliest(last[1])
	sameIDs(t, "earliest at the end", got, kept([]messages.MessageID{b2, z2, b3, last[0], last[1]}, last[1]))
	checkTerms(t, "truncation", got)
}

// upTo returns the IDs of ids through the first at or above through.
func upTo(ids []messages.MessageID, through messages.MessageID) []messages.MessageID {
	for i, id := range ids {
		if id >= through {
			return ids[:i+1]
		}
	}
	return ids
}

// archivedBelow is the archive's end a truncation below id leaves: id with
// an archive, 0 without.
func (e *env) archivedBelow(id messages.MessageID) messages.MessageID {
	if !e.h.Archive {
		return 0
	}
	return id
}

// checkState checks what State reports of p.
func (e *env) checkState(ctx context.Context, t *testing.T, b jetstream.Backend, p streamwal.PChannel, what string, want jetstream.StreamState) {
	t.Helper()
	got, err := b.State(ctx, p)
	if err != nil {
		t.Errorf("state %s: %v", what, err)
		return
	}
	if got != want {
		t.Errorf("state %s: %+v, want %+v", what, got, want)
	}
}

// checkTerms checks that every message carries the term of the barrier
// before it and that barrier terms grow.
func checkTerms(t *testing.T, what string, ms []*messages.ImmutableMessage) int {
	t.Helper()
	bad := 0
	var term uint64
	for _, m := range ms {
		if m.Type() == messages.TypeRecoveryBarrier {
			if m.Term() <= term {
				bad++
				if bad <= maxReported {
					t.Errorf("%s: barrier %d has term %d after a barrier of term %d", what, m.ID(), m.Term(), term)
				}
			}
			term = m.Term()
			continue
		}
		if m.Term() != term {
			bad++
			if bad <= maxReported {
				t.Errorf("%s: message %d (%s) has term %d after the barrier of term %d", what, m.ID(), m.MsgID(), m.Term(), term)
			}
		}
	}
	return bad
}
