package conformance

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// testLifecycle: blocked scanners stop promptly on Close and on context
// cancellation; writers resolve queued appends on Close; a closed backend
// refuses new work while what it opened keeps working.
func (e *env) testLifecycle(t *testing.T) {
	ctx := testContext(t)
	b := e.backend(t)
	p := e.pchannel(t, "life")
	v := vchannel(t, p, 1)
	w := openWriter(ctx, t, b, p, 1)
	read := func(start jetstream.StartPosition) jetstream.Scanner {
		t.Helper()
		sc, err := b.Read(ctx, p, jetstream.ReadOptions{Start: start})
		if err != nil {
			t.Fatalf("read from %s: %v", start, err)
		}
		t.Cleanup(func() { _ = sc.Close() })
		return sc
	}
	// blocked runs Next in a goroutine and returns its result channel.
	blocked := func(ctx context.Context, sc jetstream.Scanner) <-chan error {
		started, res := make(chan struct{}), make(chan error, 1)
		go func() {
			close(started)
			m, err := sc.Next(ctx)
			if err == nil {
				err = fmt.Errorf("unexpected message %d", m.ID())
			}
			res <- err
		}()
		<-started
		return res
	}
	within := func(what string, res <-chan error) error {
		t.Helper()
		select {
		case err := <-res:
			return err
		case <-time.After(promptly):
			t.Fatalf("%s: Next still blocked %v later", what, promptly)
			return nil
		}
	}

	t.Run("ScannerClose", func(t *testing.T) {
		sc := read(jetstream.Latest())
		res := blocked(ctx, sc)
		if err := sc.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		expectCode(t, "Next blocked when the scanner closed", within("close", res), streamwal.ErrClosed)
		_, err := sc.Next(ctx)
		expectCode(t, "Next after Close", err, streamwal.ErrClosed)
		if err := sc.Close(); err != nil {
			t.Errorf("second close: %v", err)
		}
	})

	t.Run("ScannerCancel", func(t *testing.T) {
		sc := read(jetstream.Latest())
		cctx, cancel := context.WithCancel(ctx)
		res := blocked(cctx, sc)
		cancel()
		if err := within("cancel", res); !errors.Is(err, context.Canceled) {
			t.Errorf("Next blocked when its context was cancelled: %v, want context.Canceled", err)
		}
		// The scanner survives a cancelled Next.
		id := appendOne(ctx, t, w, e.insert(t, v, "after cancel", ""))[0]
		got, err := readThrough(ctx, sc, id)
		if err != nil {
			t.Fatalf("Next after a cancelled Next: %v", err)
		}
		sameIDs(t, "Next after a cancelled Next", got, []messages.MessageID{id})
		// A context that ends while Next waits gives its error.
		dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer dcancel()
		if err := within("deadline", blocked(dctx, sc)); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Next whose context expired: %v, want context.DeadlineExceeded", err)
		}
	})

	t.Run("AllStopsOnClose", func(t *testing.T) {
		sc := read(jetstream.Latest())
		res := make(chan error, 1)
		started := make(chan struct{})
		go func() {
			close(started)
			for m, err := range sc.All(ctx) {
				if err != nil {
					res <- err
					return
				}
				_ = m
			}
			res <- errors.New("All ended without an error")
		}()
		<-started
		appendOne(ctx, t, w, e.insert(t, v, "for all", ""))
		_ = sc.Close()
		expectCode(t, "All when the scanner closed", within("close", res), streamwal.ErrClosed)
	})

	t.Run("WriterCloseResolvesQueued", func(t *testing.T) {
		wc := openWriter(ctx, t, b, p, 2)
		var fs []*jetstream.AppendFuture
		var batches [][]string
		for i := range 200 {
			n := 1 + i%3
			msgs := make([]*messages.MutableMessage, n)
			ids := make([]string, n)
			for k := range n {
				ids[k] = fmt.Sprintf("close-%d-%d", i, k)
				msgs[k] = e.insert(t, v, ids[k], ids[k])
			}
			fs, batches = append(fs, wc.AppendAsync(ctx, msgs...)), append(batches, ids)
		}
		if err := wc.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if !closedWithin(wc.Done(), 0) {
			t.Errorf("Done not closed after Close returned")
		}
		if !errors.Is(wc.Err(), streamwal.ErrClosed) {
			t.Errorf("Err after Close: %v, want ErrClosed", wc.Err())
		}
		var lastAcked messages.MessageID
		var refused [][]string
		acked := map[string]messages.MessageID{}
		for i, f := range fs {
			if !closedWithin(f.Done(), 0) {
				t.Fatalf("append %d unresolved after Close returned", i)
			}
			ids, err := f.Result()
			switch {
			case err == nil:
				for k, id := range ids {
					acked[batches[i][k]] = id
					lastAcked = max(lastAcked, id)
				}
			case errors.Is(err, streamwal.ErrClosed):
				refused = append(refused, batches[i])
			case errors.Is(err, streamwal.ErrUnknownOutcome):
			default:
				t.Errorf("append %d queued before Close: %v", i, err)
			}
		}
		// The next writer's barrier ends what the closed one wrote.
		wn := openWriter(ctx, t, b, p, 3)
		got := mustReadRange(ctx, t, b, p, jetstream.ReadOptions{Start: jetstream.After(wc.Barrier().ID())}, wn.Barrier().ID())
		stored := map[string]messages.MessageID{}
		for _, m := range got[:len(got)-1] {
			if _, dup := stored[m.MsgID()]; dup {
				t.Errorf("message ID %q stored twice", m.MsgID())
			}
			stored[m.MsgID()] = m.ID()
		}
		for id, at := range acked {
			if stored[id] != at {
				t.Errorf("%q acknowledged at %d, stored at %d", id, at, stored[id])
			}
		}
		for _, ids := range refused {
			for _, id := range ids {
				if at, ok := stored[id]; ok {
					t.Errorf("%q refused with ErrClosed but stored at %d", id, at)
				}
			}
		}
		t.Logf("close resolved %d appends: %d messages acknowledged (last %d), %d appends refused", len(fs), len(acked), lastAcked, len(refused))
		w = wn
	})

	t.Run("ClosedBackend", func(t *testing.T) {
		bc := e.backend(t)
		q := e.pchannel(t, "life")
		wq := openWriter(ctx, t, bc, q, 1)
		sq, err := bc.Read(ctx, q, jetstream.ReadOptions{Start: jetstream.Earliest()})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sq.Close() }()
		if err := bc.Close(); err != nil {
			t.Errorf("close backend: %v", err)
		}
		nw, err := bc.OpenWriter(ctx, q, 2)
		if err == nil {
			_ = nw.Close()
		}
		expectCode(t, "open on a closed backend", err, streamwal.ErrClosed)
		sc, err := bc.Read(ctx, q, jetstream.ReadOptions{})
		if err == nil {
			_ = sc.Close()
		}
		expectCode(t, "read on a closed backend", err, streamwal.ErrClosed)
		expectCode(t, "truncate on a closed backend", bc.Truncate(ctx, q, 1), streamwal.ErrClosed)
		_, err = bc.State(ctx, q)
		expectCode(t, "state on a closed backend", err, streamwal.ErrClosed)
		// What it opened before keeps working.
		id := appendOne(ctx, t, wq, e.insert(t, vchannel(t, q, 1), "after backend close", ""))[0]
		got, err := readThrough(ctx, sq, id)
		if err != nil {
			t.Fatal(err)
		}
		sameIDs(t, "scanner of a closed backend", got, []messages.MessageID{wq.Barrier().ID(), id})
	})
}
