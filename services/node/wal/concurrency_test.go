package wal_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node/wal"
	"github.com/streamwal/streamwal/services/read"
)

// ledger is what the writers were told: the plain inserts acknowledged,
// the transactions committed (their body payloads in order), and the
// payloads that must never be read (rolled back, abandoned, expired,
// fenced).
type ledger struct {
	mu        sync.Mutex
	plain     map[string]streamwal.VChannel
	committed map[messages.TxnID][]string
	txnVC     map[messages.TxnID]streamwal.VChannel
	forbidden map[string]bool
}

func newLedger() *ledger {
	return &ledger{plain: map[string]streamwal.VChannel{}, committed: map[messages.TxnID][]string{},
		txnVC: map[messages.TxnID]streamwal.VChannel{}, forbidden: map[string]bool{}}
}

func (l *ledger) acked(payload string, v streamwal.VChannel) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.plain[payload] = v
}

func (l *ledger) commit(id messages.TxnID, v streamwal.VChannel, body []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.committed[id], l.txnVC[id] = body, v
}

func (l *ledger) forbid(payloads ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range payloads {
		l.forbidden[p] = true
	}
}

// carried is a transaction left open at the end of a term, to be finished
// by the next owner.
type carried struct {
	v    streamwal.VChannel
	tc   messages.TxnContext
	body []string
}

// TestConcurrentWritersAcrossTerms is the WAL's end-to-end invariant test:
// 10 writers per term, half plain inserts and half transactions (some
// committed, some rolled back, some abandoned to expire, some committed
// after expiry and refused), over terms 1 to 3 (the first change of owner
// fencing a WAL that was never closed), with transactions carried across
// the change of owner, while live readers follow both VChannels and the
// whole PChannel. Every reader must see strictly increasing TimeTicks,
// every acknowledged insert and committed transaction exactly once (each
// transaction as one Txn of the right bodies), and nothing else; and a
// reader starting at any message's LastConfirmedMessageID, filtering on its
// TimeTick, must see exactly the messages from it on.
func TestConcurrentWritersAcrossTerms(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	vs := []streamwal.VChannel{e.vchannel(1), e.vchannel(2)}
	book := newLedger()
	readers := map[string]*liveReader{}
	var carry []carried
	var prev *wal.WAL
	for term := uint64(1); term <= 3; term++ {
		if term == 3 {
			require.NoError(t, prev.Close())
		}
		cfg := e.config(term)
		cfg.SyncInterval = 20 * time.Millisecond
		w, err := wal.Open(ctx, cfg)
		require.NoError(t, err)
		if term == 2 {
			// The term-1 WAL was never closed: the barrier fenced it.
			_, err := prev.Append(ctx, e.insert(vs[0], "fenced"))
			require.ErrorIs(t, err, streamwal.ErrFenced)
			book.forbid("fenced")
			require.ErrorIs(t, prev.Err(), streamwal.ErrFenced)
			require.NoError(t, prev.Close())
		}
		if term == 1 {
			for _, v := range vs {
				e.createCollection(w, v)
			}
			readers["pchannel"] = e.follow(streamwal.VChannel{}, 2)
			for _, v := range vs {
				readers[v.String()] = e.follow(v, 1)
			}
		}
		finishCarried(t, w, book, carry, term)
		runWriters(t, e, w, vs, book, term)
		carry = leaveOpen(t, e, w, vs, book, term)
		prev = w
	}
	for _, c := range carry {
		book.forbid(c.body...) // never committed: they expire
	}
	for _, v := range vs {
		_, err := prev.Append(ctx, e.insert(v, "end-"+v.String()))
		require.NoError(t, err)
		book.acked("end-"+v.String(), v)
	}
	for name, r := range readers {
		got := r.wait(t)
		var want func(streamwal.VChannel) bool
		if name == "pchannel" {
			want = func(streamwal.VChannel) bool { return true }
		} else {
			want = func(v streamwal.VChannel) bool { return v.String() == name }
		}
		checkRead(t, name, got, book, want)
	}
	checkLastConfirmed(t, e, readers["pchannel"].got)
	require.NoError(t, prev.Close())
}

// runWriters runs 10 concurrent writers of 120 operations each.
func runWriters(t *testing.T, e *env, w *wal.WAL, vs []streamwal.VChannel, book *ledger, term uint64) {
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(term, uint64(g)))
			v := vs[g%len(vs)]
			for i := range 120 {
				name := fmt.Sprintf("t%d-g%d-i%d", term, g, i)
				if rng.IntN(2) == 0 {
					if _, err := w.Append(context.Background(), e.insert(v, name)); err != nil {
						t.Errorf("insert %s: %v", name, err)
						return
					}
					book.acked(name, v)
					continue
				}
				if err := runTxn(e, w, v, book, name, rng); err != nil {
					t.Errorf("txn %s: %v", name, err)
					return
				}
			}
			if err := commitAfterExpiry(e, w, v, book, fmt.Sprintf("t%d-g%d-expired", term, g)); err != nil {
				t.Errorf("commit after expiry: %v", err)
			}
		}()
	}
	wg.Wait()
}

// runTxn begins a transaction with 0 to 4 bodies and commits it (70%),
// rolls it back (15%) or abandons it to expire (15%).
func runTxn(e *env, w *wal.WAL, v streamwal.VChannel, book *ledger, name string, rng *rand.Rand) error {
	ctx := context.Background()
	fate := rng.IntN(100)
	keepalive := 30 * time.Second
	if fate >= 85 {
		keepalive = 5 * time.Millisecond
	}
	tc, err := w.BeginTxn(ctx, v, keepalive)
	if err != nil {
		return err
	}
	var body []string
	for b := range rng.IntN(5) {
		p := fmt.Sprintf("%s-b%d", name, b)
		body = append(body, p)
		if _, err := w.Append(ctx, e.insert(v, p, messages.WithTxn(tc))); err != nil {
			if fate >= 85 && streamwal.CodeOf(err) == streamwal.CodeTxnExpired {
				break // abandoned anyway, and expired sooner than it took to fill
			}
			return err
		}
	}
	switch {
	case fate < 70:
		if _, err := w.CommitTxn(ctx, v, tc); err != nil {
			return err
		}
		book.commit(tc.ID, v, body)
	case fate < 85:
		if _, err := w.RollbackTxn(ctx, v, tc); err != nil {
			return err
		}
		book.forbid(body...)
	default:
		book.forbid(body...)
	}
	return nil
}

// commitAfterExpiry begins a transaction with the shortest keepalive,
// appends a body, waits until the clock is past its deadline by more than
// the TimeTick batch can lag, and checks that its commit is refused.
func commitAfterExpiry(e *env, w *wal.WAL, v streamwal.VChannel, book *ledger, name string) error {
	ctx := context.Background()
	tc, err := w.BeginTxn(ctx, v, messages.MinKeepalive)
	if err != nil {
		return err
	}
	book.forbid(name)
	body, err := w.Append(ctx, e.insert(v, name, messages.WithTxn(tc)))
	if err != nil {
		return nil // already expired: the body was refused, which is the point
	}
	past := body.TimeTick().Physical().Add(messages.MinKeepalive + 2*20*time.Millisecond)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(past); {
		if time.Now().After(deadline) {
			return fmt.Errorf("clock did not move")
		}
		if err := w.Sync(ctx); err != nil {
			return err
		}
	}
	if err := w.Sync(ctx); err != nil {
		return err
	}
	if _, err := w.CommitTxn(ctx, v, tc); streamwal.CodeOf(err) != streamwal.CodeTxnExpired {
		return fmt.Errorf("commit of an expired txn: want TXN_EXPIRED, got %v", err)
	}
	return nil
}

// leaveOpen begins one transaction per VChannel with a body and leaves it
// open for the next owner.
func leaveOpen(t *testing.T, e *env, w *wal.WAL, vs []streamwal.VChannel, book *ledger, term uint64) []carried {
	var out []carried
	for _, v := range vs {
		tc, err := w.BeginTxn(context.Background(), v, time.Minute)
		require.NoError(t, err)
		p := fmt.Sprintf("t%d-carried-%s-b0", term, v)
		_, err = w.Append(context.Background(), e.insert(v, p, messages.WithTxn(tc)))
		require.NoError(t, err)
		out = append(out, carried{v: v, tc: tc, body: []string{p}})
	}
	return out
}

// finishCarried adds a body to each carried transaction and commits it
// under the new owner.
func finishCarried(t *testing.T, w *wal.WAL, book *ledger, carry []carried, term uint64) {
	for _, c := range carry {
		p := fmt.Sprintf("t%d-continued-%s-b1", term, c.v)
		m, err := w.Append(context.Background(), mustInsert(t, w, c.v, p, c.tc))
		require.NoError(t, err, "body of a carried transaction")
		require.Equal(t, c.tc.ID, m.Txn().ID)
		_, err = w.CommitTxn(context.Background(), c.v, c.tc)
		require.NoError(t, err, "commit of a carried transaction")
		book.commit(c.tc.ID, c.v, append(c.body, p))
	}
}

// mustInsert builds a transaction body.
func mustInsert(t *testing.T, w *wal.WAL, v streamwal.VChannel, payload string, tc messages.TxnContext) *messages.MutableMessage {
	codec, err := messages.NewCodec("test", nil)
	require.NoError(t, err)
	m, err := codec.New(messages.TypeInsert, v, []byte(payload), messages.WithTxn(tc))
	require.NoError(t, err)
	return m
}

// liveReader follows a VChannel (or the PChannel) from the first message
// until it has read `ends` end markers.
type liveReader struct {
	got  []*messages.ImmutableMessage
	err  error
	done chan struct{}
}

func (e *env) follow(v streamwal.VChannel, ends int) *liveReader {
	s := e.scan(v, read.Earliest())
	r := &liveReader{done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	go func() {
		defer close(r.done)
		defer cancel()
		for m, err := range s.All(ctx) {
			if err != nil {
				r.err = err
				return
			}
			r.got = append(r.got, m)
			if m.Type() == messages.TypeInsert && strings.HasPrefix(string(m.Payload()), "end-") {
				if ends--; ends == 0 {
					return
				}
			}
		}
	}()
	return r
}

// wait returns what the reader read.
func (r *liveReader) wait(t *testing.T) []*messages.ImmutableMessage {
	<-r.done
	require.NoError(t, r.err)
	return r.got
}

// checkRead checks one reader's messages against the ledger.
func checkRead(t *testing.T, name string, got []*messages.ImmutableMessage, book *ledger, want func(streamwal.VChannel) bool) {
	seen := map[string]int{}
	txns := map[messages.TxnID]int{}
	for i, m := range got {
		if i > 0 {
			require.Greater(t, m.TimeTick(), got[i-1].TimeTick(), "%s: timeticks must strictly increase at message %d", name, m.ID())
		}
		switch m.Type() {
		case messages.TypeInsert:
			p := string(m.Payload())
			require.False(t, book.forbidden[p], "%s: read %q, which must never appear", name, p)
			seen[p]++
		case messages.TypeTxn:
			id := m.Txn().ID
			txns[id]++
			var body []string
			for _, b := range m.TxnBody() {
				require.False(t, book.forbidden[string(b.Payload())], "%s: read %q in txn %d", name, b.Payload(), id)
				body = append(body, string(b.Payload()))
			}
			require.Equal(t, book.committed[id], body, "%s: txn %d", name, id)
		case messages.TypeCreateCollection:
		default:
			t.Fatalf("%s: unexpected %s at %d", name, m.Type(), m.ID())
		}
	}
	for p, v := range book.plain {
		if want(v) {
			require.Equal(t, 1, seen[p], "%s: insert %q read %d times", name, p, seen[p])
		}
	}
	for id, v := range book.txnVC {
		if want(v) {
			require.Equal(t, 1, txns[id], "%s: txn %d read %d times", name, id, txns[id])
		}
	}
	for p, n := range seen {
		_, ok := book.plain[p]
		require.True(t, ok && n == 1, "%s: read %q %d times, acknowledged %v", name, p, n, ok)
	}
	for id := range txns {
		_, ok := book.committed[id]
		require.True(t, ok, "%s: read txn %d that was never committed", name, id)
	}
}

// checkLastConfirmed starts readers at the LastConfirmedMessageID of
// random messages, filtering on their TimeTick, and checks that each reads
// exactly the messages from that TimeTick on.
func checkLastConfirmed(t *testing.T, e *env, all []*messages.ImmutableMessage) {
	rng := rand.New(rand.NewPCG(7, 7))
	last := all[len(all)-1]
	for range 20 {
		m := all[rng.IntN(len(all))]
		s, err := read.Open(context.Background(), read.Options{Backend: e.backend, Codec: e.codec, PChannel: e.p,
			Start: read.From(m.LastConfirmed()), MinTimeTick: m.TimeTick()})
		require.NoError(t, err)
		got := e.readUntil(s, last.ID())
		require.NoError(t, s.Close())
		var want []messages.MessageID
		for _, x := range all {
			if x.TimeTick() >= m.TimeTick() {
				want = append(want, x.ID())
			}
		}
		require.Equal(t, want, ids(got), "reading from %d (LastConfirmed of %d, %s)", m.LastConfirmed(), m.ID(), m.Type())
	}
}

// ids lists the MessageIDs of msgs.
func ids(msgs []*messages.ImmutableMessage) []messages.MessageID {
	out := make([]messages.MessageID, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID()
	}
	return out
}

// TestRetriesOfOneMessageIDWhileInFlight: 32 goroutines append, at once,
// copies of 8 messages (a client's retries of requests the WAL is still at
// work on, each copy a new request): every call returns the one message
// stored for its ID, none is refused because another copy is in flight,
// and the VChannel holds each message once.
func TestRetriesOfOneMessageIDWhileInFlight(t *testing.T) {
	e := newEnv(t)
	w := e.open(1)
	defer w.Close()
	v := e.vchannel(1)
	e.createCollection(w, v)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ids, copies = 8, 32
	got := make([][]*messages.ImmutableMessage, ids)
	for i := range got {
		got[i] = make([]*messages.ImmutableMessage, copies)
	}
	var wg sync.WaitGroup
	for c := range copies {
		wg.Go(func() {
			msgs := make([]*messages.MutableMessage, ids)
			for i := range msgs {
				msgs[i] = e.insert(v, fmt.Sprintf("m%d", i), messages.WithMsgID(fmt.Sprintf("retry-%d", i)))
			}
			out, errs := w.AppendMany(ctx, msgs)
			for i := range out {
				if errs[i] != nil {
					t.Errorf("copy %d of message %d: %v", c, i, errs[i])
					continue
				}
				got[i][c] = out[i]
			}
		})
	}
	wg.Wait()
	var last messages.MessageID
	for i, copies := range got {
		for c, m := range copies {
			if m == nil || copies[0] == nil {
				continue
			}
			require.Equal(t, copies[0].ID(), m.ID(), "message %d: copy %d stored at another ID", i, c)
			require.Equal(t, fmt.Sprintf("m%d", i), string(m.Payload()))
			last = max(last, m.ID())
		}
	}
	sc := e.scan(v, read.Earliest())
	defer sc.Close()
	seen := map[string]int{}
	for _, m := range e.readUntil(sc, last) {
		if m.Type() == messages.TypeInsert {
			seen[string(m.Payload())]++
		}
	}
	for i := range ids {
		require.Equal(t, 1, seen[fmt.Sprintf("m%d", i)], "message %d stored %d times", i, seen[fmt.Sprintf("m%d", i)])
	}
}
