package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// faultKind is what the fault test injects.
type faultKind int

const (
	faultRestart faultKind = iota
	faultDrop
)

// Sizes of the fault test.
const (
	faultAppenders = 6
	// faultAttemptTimeout bounds one attempt of an append; an attempt that
	// runs out is retried with the same message IDs, so the retry path runs
	// whenever a fault stalls the writer.
	faultAttemptTimeout = 2 * time.Second
	// faultProgress is how many messages must be acknowledged before each
	// fault and after the last.
	faultProgress = 200
	// faultBudget bounds each wait for progress.
	faultBudget = 60 * time.Second
	// dupRetries is how many ErrDuplicate answers an append retries.
	dupRetries = 5
)

// faultStats counts what the fault test saw.
type faultStats struct {
	appends, msgs                          atomic.Int64
	unknown, unavailable, dup, abandoned   atomic.Int64
	dupStuck, closedRetries, reopenedAfter atomic.Int64
}

// faultAppend is one append of the fault test and its final outcome.
type faultAppend struct {
	msgIDs []string
	ids    []messages.MessageID // nil if it never got IDs (ErrDuplicate)
}

// writerRef is the current writer of the fault test; it is replaced by a
// writer of the next term if it dies.
type writerRef struct {
	mu      sync.Mutex
	w       jetstream.Writer
	b       jetstream.Backend
	p       streamwal.PChannel
	reopens int
	// barriers are the IDs of every barrier the test's writers landed.
	barriers []messages.MessageID
}

func (r *writerRef) get() jetstream.Writer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.w
}

// reopen replaces old, if it is still current, by a writer of the next term.
func (r *writerRef) reopen(ctx context.Context, old jetstream.Writer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w != old {
		return nil
	}
	_ = old.Close()
	for {
		w, err := r.b.OpenWriter(ctx, r.p, old.Term()+1)
		if err == nil {
			r.w, r.reopens = w, r.reopens+1
			r.barriers = append(r.barriers, w.Barrier().ID())
			return nil
		}
		if !errors.Is(err, streamwal.ErrUnavailable) || ctx.Err() != nil {
			return fmt.Errorf("reopen %s under term %d: %w", r.p, old.Term()+1, err)
		}
	}
}

// testFaults: concurrent appenders with idempotent retries while the
// harness restarts the server or drops the connections.
func (e *env) testFaults(t *testing.T, kind faultKind) {
	ctx := testContext(t)
	sd := seed(t)
	b, bs := e.backend(t), e.backend(t)
	p := e.pchannel(t, "fault")
	v := vchannel(t, p, 1)
	w := openWriter(ctx, t, b, p, 1)
	ref := &writerRef{w: w, b: b, p: p, barriers: []messages.MessageID{w.Barrier().ID()}}
	defer func() { _ = ref.get().Close() }()
	var st faultStats
	start := time.Now()

	// A scanner follows the stream through the faults.
	var target atomic.Uint64
	scanCtx, stopScan := context.WithCancel(ctx)
	defer stopScan()
	sc, err := bs.Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Earliest()})
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	var scanned []*messages.ImmutableMessage
	var scanErr error
	var scanWG sync.WaitGroup
	scanWG.Go(func() {
		scanned, scanErr = scanUntil(scanCtx, sc, &target)
		_ = sc.Close()
	})

	var (
		stop    atomic.Bool
		acked   atomic.Int64
		mu      sync.Mutex
		appends []*faultAppend
		wg      sync.WaitGroup
	)
	for g := range faultAppenders {
		rng := rand.New(rand.NewPCG(sd, uint64(g)))
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				n := 1 + rng.IntN(4)
				fa := &faultAppend{}
				msgs := make([]*messages.MutableMessage, n)
				for k := range n {
					id := fmt.Sprintf("x-g%d-%d-%d", g, i, k)
					m, err := e.newInsert(v, id, id)
					if err != nil {
						t.Errorf("build: %v", err)
						return
					}
					msgs[k], fa.msgIDs = m, append(fa.msgIDs, id)
				}
				if !e.faultAppend(ctx, t, ref, &st, fa, msgs) {
					return
				}
				mu.Lock()
				appends = append(appends, fa)
				mu.Unlock()
				st.appends.Add(1)
				st.msgs.Add(int64(n))
				acked.Add(int64(n))
				if rng.IntN(4) == 0 {
					runtime.Gosched()
				}
			}
		})
	}

	faults := 3
	if kind == faultRestart {
		faults = 2
	}
	progress := func(what string) bool {
		want := acked.Load() + faultProgress
		if !waitFor(ctx, faultBudget, func() bool { return acked.Load() >= want }) {
			t.Errorf("%s: only %d of %d messages acknowledged after %v", what, acked.Load(), want, faultBudget)
			return false
		}
		return true
	}
	injected := 0
	for i := range faults {
		if !progress(fmt.Sprint("before fault ", i+1)) {
			break
		}
		switch kind {
		case faultRestart:
			e.h.RestartServer(t)
		case faultDrop:
			e.h.DropConnections(t)
		}
		injected++
	}
	progress("after the last fault")
	stop.Store(true)
	if !waitDone(&wg, faultBudget) {
		t.Errorf("appenders did not finish within %v of the stop", faultBudget)
		stopScan()
		wg.Wait()
	}
	if t.Failed() {
		stopScan()
		scanWG.Wait()
		return
	}

	// Everything acknowledged is there, once, at its MessageID.
	ref.mu.Lock()
	last := ref.barriers[len(ref.barriers)-1]
	barriers := append([]messages.MessageID(nil), ref.barriers...)
	ref.mu.Unlock()
	for _, fa := range appends {
		if len(fa.ids) > 0 {
			last = max(last, fa.ids[len(fa.ids)-1])
		}
	}
	all := mustReadRange(ctx, t, e.backend(t), p, jetstream.ReadOptions{Start: jetstream.Earliest()}, last)
	e.checkFaultStream(t, all, appends, barriers)

	// The scanner that ran through the faults read the same.
	target.Store(uint64(last))
	if !waitDone(&scanWG, readBudget) {
		stopScan()
		scanWG.Wait()
	}
	if scanErr != nil {
		t.Errorf("the scanner running through the faults: %v", scanErr)
	}
	if err := strictlyIncreasing(scanned); err != nil {
		t.Errorf("the scanner running through the faults: %v", err)
	}
	sameIDs(t, "the scanner running through the faults", scanned, idsOf(all))

	t.Logf("%d faults in %v: %d appends (%d messages) acknowledged; retries after unknown outcome %d, unavailable %d, duplicate %d, abandoned attempt %d; %d appends answered only ErrDuplicate; writer reopened %d times",
		injected, time.Since(start).Round(time.Millisecond), st.appends.Load(), st.msgs.Load(), st.unknown.Load(), st.unavailable.Load(),
		st.dup.Load(), st.abandoned.Load(), st.dupStuck.Load(), ref.reopens)
}

// faultAppend appends msgs until it succeeds, retrying with the same
// message IDs; it reports false when the append is hopeless.
func (e *env) faultAppend(ctx context.Context, t *testing.T, ref *writerRef, st *faultStats, fa *faultAppend, msgs []*messages.MutableMessage) bool {
	dups := 0
	for {
		if ctx.Err() != nil {
			t.Errorf("append of %q never succeeded: %v", fa.msgIDs[0], ctx.Err())
			return false
		}
		w := ref.get()
		actx, cancel := context.WithTimeout(ctx, faultAttemptTimeout)
		ids, err := w.Append(actx, msgs...)
		cancel()
		switch {
		case err == nil:
			if err := contiguous(ids, len(msgs)); err != nil {
				t.Errorf("append of %q: %v", fa.msgIDs[0], err)
				return false
			}
			fa.ids = ids
			return true
		case errors.Is(err, streamwal.ErrUnknownOutcome):
			st.unknown.Add(1)
		case errors.Is(err, streamwal.ErrUnavailable):
			st.unavailable.Add(1)
		case errors.Is(err, streamwal.ErrDuplicate):
			st.dup.Add(1)
			if dups++; dups >= dupRetries {
				// The first attempt landed; the writer cannot say where.
				st.dupStuck.Add(1)
				return true
			}
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			st.abandoned.Add(1) // never started: never written
		case errors.Is(err, streamwal.ErrClosed) && ref.get() != w:
			st.closedRetries.Add(1) // another appender replaced the writer
		case errors.Is(err, streamwal.ErrFenced), errors.Is(err, streamwal.ErrUnrecoverable):
			t.Errorf("append of %q: the writer died: %v", fa.msgIDs[0], err)
			if err := ref.reopen(ctx, w); err != nil {
				t.Errorf("%v", err)
				return false
			}
		default:
			t.Errorf("append of %q failed with %q (code %s)", fa.msgIDs[0], err, streamwal.CodeOf(err))
			return false
		}
	}
}

// checkFaultStream checks the stream after the faults: every append there
// exactly once, at its MessageIDs, nothing else.
func (e *env) checkFaultStream(t *testing.T, all []*messages.ImmutableMessage, appends []*faultAppend, barriers []messages.MessageID) {
	reported := 0
	fail := func(format string, args ...any) {
		reported++
		if reported <= maxReported {
			t.Errorf(format, args...)
		}
	}
	if err := strictlyIncreasing(all); err != nil {
		fail("%v", err)
	}
	byID := map[messages.MessageID]*messages.ImmutableMessage{}
	byMsgID := map[string][]messages.MessageID{}
	for _, m := range all {
		byID[m.ID()] = m
		byMsgID[m.MsgID()] = append(byMsgID[m.MsgID()], m.ID())
	}
	known := map[string]bool{}
	stuck := 0
	for _, fa := range appends {
		for k, id := range fa.msgIDs {
			known[id] = true
			got := byMsgID[id]
			switch {
			case len(got) == 0:
				fail("acknowledged message %q is not in the stream (acknowledged at %v)", id, fa.ids)
			case len(got) > 1:
				fail("message %q stored %d times: %v", id, len(got), got)
			case fa.ids != nil && got[0] != fa.ids[k]:
				fail("message %q acknowledged at %d but stored at %d", id, fa.ids[k], got[0])
			}
		}
		if fa.ids == nil {
			stuck++
			if stuck <= 3 {
				t.Errorf("an append of %d messages retried after its first attempt landed got ErrDuplicate %d times, never the MessageIDs of the original (%q at %v): the package doc promises that such a retry resolves to the original's sequences",
					len(fa.msgIDs), dupRetries, fa.msgIDs[0], byMsgID[fa.msgIDs[0]])
			}
		}
	}
	if stuck > 3 {
		t.Errorf("%d appends in all got only ErrDuplicate", stuck)
	}
	isBarrier := map[messages.MessageID]bool{}
	for _, id := range barriers {
		isBarrier[id] = true
		if m := byID[id]; m == nil || m.Type() != messages.TypeRecoveryBarrier {
			fail("writer barrier %d is not in the stream", id)
		}
	}
	for _, m := range all {
		switch {
		case m.Type() == messages.TypeRecoveryBarrier:
			if !isBarrier[m.ID()] {
				fail("barrier %d of term %d was never opened by the test", m.ID(), m.Term())
			}
		case !known[m.MsgID()]:
			fail("message %d (%q) was never acknowledged", m.ID(), m.MsgID())
		}
	}
	if reported > maxReported {
		t.Errorf("%d violations in all", reported)
	}
}
