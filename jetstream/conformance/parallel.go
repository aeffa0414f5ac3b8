package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
)

// Sizes of the parallel append/read test.
const (
	parallelPChannels = 3
	parallelTerms     = 3
	parallelAppenders = 8
	parallelScanners  = 2
	// maxReported bounds the violations one check prints in full.
	maxReported = 20
)

// ackedAppend is one acknowledged Append.
type ackedAppend struct {
	term   uint64
	key    string   // "t<term> g<goroutine> i<index>"
	msgIDs []string // caller-chosen message IDs; "" where the writer chose
	ids    []messages.MessageID
}

// parallelPayload is the payload of message k of n of append i of
// goroutine g under term.
func parallelPayload(term uint64, g, i, k, n int) string {
	return fmt.Sprintf("t=%d g=%d i=%d k=%d n=%d", term, g, i, k, n)
}

// parseParallelPayload inverts parallelPayload.
func parseParallelPayload(b []byte) (key string, k, n int, err error) {
	var term uint64
	var g, i int
	if _, err := fmt.Sscanf(string(b), "t=%d g=%d i=%d k=%d n=%d", &term, &g, &i, &k, &n); err != nil {
		return "", 0, 0, fmt.Errorf("payload %q: %v", b, err)
	}
	return fmt.Sprintf("t%d g%d i%d", term, g, i), k, n, nil
}

// testParallelAppendRead: three PChannels in parallel, each written under
// terms 1 to 3 by concurrent appenders and read by two scanners.
func (e *env) testParallelAppendRead(t *testing.T) {
	for i := range parallelPChannels {
		t.Run(fmt.Sprintf("pchannel%d", i), func(t *testing.T) {
			t.Parallel()
			e.parallelPChannel(t)
		})
	}
}

// parallelPChannel runs the test on one PChannel.
func (e *env) parallelPChannel(t *testing.T) {
	ctx := testContext(t)
	bw, bs := e.backend(t), e.backend(t)
	p := e.pchannel(t, "par")
	vs := []streamwal.VChannel{vchannel(t, p, 1), vchannel(t, p, 2)}

	// The scanners start before anything is written and follow the writers.
	var target atomic.Uint64 // the last acknowledged ID, once known
	scanCtx, stopScans := context.WithCancel(ctx)
	defer stopScans()
	results := make([][]*messages.ImmutableMessage, parallelScanners)
	scanErrs := make([]error, parallelScanners)
	var scans sync.WaitGroup
	for s := range parallelScanners {
		sc, err := bs.Read(ctx, p, jetstream.ReadOptions{Start: jetstream.Earliest()})
		if err != nil {
			t.Fatalf("read %s from earliest: %v", p, err)
		}
		t.Cleanup(func() { _ = sc.Close() })
		scans.Go(func() {
			results[s], scanErrs[s] = scanUntil(scanCtx, sc, &target)
			_ = sc.Close()
		})
	}

	var acked []*ackedAppend
	barriers := map[uint64]messages.MessageID{}
	for term := uint64(1); term <= parallelTerms; term++ {
		w := openWriter(ctx, t, bw, p, term)
		barriers[term] = w.Barrier().ID()
		got := e.parallelTerm(ctx, t, w, vs, term)
		acked = append(acked, got...)
		if err := w.Close(); err != nil {
			t.Errorf("close writer of term %d: %v", term, err)
		}
		if !errors.Is(w.Err(), streamwal.ErrClosed) {
			t.Errorf("a closed writer's Err is %v, want ErrClosed", w.Err())
		}
		_, err := w.Append(ctx, e.insert(t, vs[0], "after close", ""))
		expectCode(t, "append on a closed writer", err, streamwal.ErrClosed)
		if t.Failed() {
			break
		}
	}
	last := barriers[1]
	total := 0
	for _, a := range acked {
		last = max(last, a.ids[len(a.ids)-1])
		total += len(a.ids)
	}
	target.Store(uint64(last))
	if !waitDone(&scans, readBudget) {
		stopScans()
		scans.Wait()
	}
	for s := range parallelScanners {
		if scanErrs[s] != nil {
			t.Errorf("scanner %d: %v", s, scanErrs[s])
		}
		verifyParallel(t, fmt.Sprintf("scanner %d", s), results[s], acked, barriers)
	}
	t.Logf("%s: %d appends (%d messages) under %d terms, each scanner read %d messages",
		p, len(acked), total, parallelTerms, len(results[0]))
}

// waitDone waits for wg for at most d.
func waitDone(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// scanUntil reads sc until it delivered the target ID (once the target is
// known) or ctx ends. It polls Next with a short deadline so that it notices
// a target set after it caught up.
func scanUntil(ctx context.Context, sc jetstream.Scanner, target *atomic.Uint64) ([]*messages.ImmutableMessage, error) {
	var out []*messages.ImmutableMessage
	for {
		if tg := target.Load(); tg != 0 && uint64(lastID(out)) >= tg {
			return out, nil
		}
		nctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		m, err := sc.Next(nctx)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				continue
			}
			return out, fmt.Errorf("after %d messages (last %d), target %d: %w", len(out), lastID(out), target.Load(), err)
		}
		out = append(out, m)
	}
}

// parallelTerm runs the concurrent appenders of one term and returns what
// they got acknowledged.
func (e *env) parallelTerm(ctx context.Context, t *testing.T, w jetstream.Writer, vs []streamwal.VChannel, term uint64) []*ackedAppend {
	perG := (e.h.ParallelMessages + parallelAppenders - 1) / parallelAppenders
	out := make([][]*ackedAppend, parallelAppenders)
	var wg sync.WaitGroup
	for g := range parallelAppenders {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), term))
			for i, sent := 0, 0; sent < perG; i++ {
				n := 1
				if rng.IntN(2) == 0 {
					n = 2 + rng.IntN(4)
				}
				a := &ackedAppend{term: term, key: fmt.Sprintf("t%d g%d i%d", term, g, i)}
				msgs := make([]*messages.MutableMessage, n)
				for k := range n {
					id := ""
					if (g+i)%2 == 0 {
						id = fmt.Sprintf("%s-t%d-g%d-i%d-k%d", w.PChannel(), term, g, i, k)
					}
					m, err := e.newInsert(vs[(i+k)%len(vs)], parallelPayload(term, g, i, k, n), id)
					if err != nil {
						t.Errorf("build message: %v", err)
						return
					}
					msgs[k], a.msgIDs = m, append(a.msgIDs, id)
				}
				ids, err := w.Append(ctx, msgs...)
				if err != nil {
					t.Errorf("term %d goroutine %d: append %d messages: %v", term, g, n, err)
					return
				}
				if err := contiguous(ids, n); err != nil {
					t.Errorf("term %d goroutine %d: %v", term, g, err)
					return
				}
				a.ids = ids
				out[g] = append(out[g], a)
				sent += n
			}
		})
	}
	wg.Wait()
	var all []*ackedAppend
	for _, o := range out {
		all = append(all, o...)
	}
	return all
}

// verifyParallel checks what one scanner read against what was
// acknowledged.
func verifyParallel(t *testing.T, who string, msgs []*messages.ImmutableMessage, acked []*ackedAppend, barriers map[uint64]messages.MessageID) {
	t.Helper()
	reported := 0
	fail := func(format string, args ...any) {
		reported++
		if reported <= maxReported {
			t.Errorf(who+": "+format, args...)
		}
	}
	byKey := map[string]*ackedAppend{}
	want := 0
	for _, a := range acked {
		byKey[a.key] = a
		want += len(a.ids)
	}
	seen := map[string]bool{}   // "key k"
	msgIDs := map[string]bool{} // every message ID read
	termBarriers := map[uint64]int{}
	var term uint64
	for i, m := range msgs {
		if i > 0 && m.ID() <= msgs[i-1].ID() {
			fail("MessageID %d delivered after %d", m.ID(), msgs[i-1].ID())
		}
		if m.Type() == messages.TypeRecoveryBarrier {
			term++
			if err := barrierProblem(m, term); err != nil {
				fail("barrier number %d: %v", term, err)
			}
			termBarriers[m.Term()]++
			if id, ok := barriers[m.Term()]; !ok || id != m.ID() {
				fail("barrier of term %d at %d, but the writer's Barrier() said %d", m.Term(), m.ID(), id)
			}
			continue
		}
		key, k, n, err := parseParallelPayload(m.Payload())
		if err != nil {
			fail("message %d: %v", m.ID(), err)
			continue
		}
		a := byKey[key]
		switch {
		case a == nil:
			fail("message %d (%s) was never acknowledged", m.ID(), m.Payload())
			continue
		case k >= len(a.ids) || n != len(a.ids):
			fail("message %d (%s) does not fit its append of %d", m.ID(), m.Payload(), len(a.ids))
			continue
		case seen[fmt.Sprint(key, k)]:
			fail("message %d (%s) delivered twice", m.ID(), m.Payload())
			continue
		}
		seen[fmt.Sprint(key, k)] = true
		if m.ID() != a.ids[k] {
			fail("message %s k=%d read at %d, its Append returned %d", key, k, m.ID(), a.ids[k])
		}
		if m.Term() != a.term || m.Term() != term {
			fail("message %d has term %d, appended under %d after the barrier of term %d", m.ID(), m.Term(), a.term, term)
		}
		switch {
		case a.msgIDs[k] != "" && m.MsgID() != a.msgIDs[k]:
			fail("message %d has message ID %q, appended with %q", m.ID(), m.MsgID(), a.msgIDs[k])
		case m.MsgID() == "":
			fail("message %d has no message ID", m.ID())
		case msgIDs[m.MsgID()]:
			fail("message ID %q read twice (again at %d)", m.MsgID(), m.ID())
		}
		msgIDs[m.MsgID()] = true
		if k > 0 {
			prev := msgs[i-1]
			pk, pi, _, err := parseParallelPayload(prev.Payload())
			if prev.Type() == messages.TypeRecoveryBarrier || err != nil || pk != key || pi != k-1 {
				fail("message %d (%s): the previous message %d is not part %d of the same append", m.ID(), m.Payload(), prev.ID(), k-1)
			}
		}
	}
	if len(seen) != want {
		missing := 0
		for _, a := range acked {
			for k := range a.ids {
				if !seen[fmt.Sprint(a.key, k)] {
					missing++
					if missing <= 5 {
						fail("acknowledged message %s k=%d at %d not read", a.key, k, a.ids[k])
					}
				}
			}
		}
		fail("read %d of %d acknowledged messages (%d missing)", len(seen), want, missing)
	}
	for tm := uint64(1); tm <= uint64(len(barriers)); tm++ {
		if termBarriers[tm] != 1 {
			fail("%d barriers of term %d, want 1", termBarriers[tm], tm)
		}
	}
	if term != uint64(len(barriers)) {
		fail("read %d barriers, want %d", term, len(barriers))
	}
	if reported > maxReported {
		t.Errorf("%s: %d violations in all", who, reported)
	}
}
