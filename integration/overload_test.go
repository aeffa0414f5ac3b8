package integration

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/node"
)

// The bounds of TestOverloadBoundsMemory: each client holds at most
// overloadClientBytes of appends (overloadPerPChannel for one PChannel),
// the node admits at most overloadNodeBytes of appends (again
// overloadPerPChannel for one PChannel); the live heap may grow by at
// most overloadHeapBound over what it held before the load (client, node
// and the embedded server are one process, so this is their sum).
const (
	overloadClients     = 2
	overloadProducers   = 32 // goroutines appending as fast as they can, per client
	overloadClientBytes = 1 << 20
	overloadNodeBytes   = 512 << 10
	overloadPerPChannel = 128 << 10
	overloadHeapBound   = 64 << 20
	overloadAcks        = 1000 // appends acknowledged before the load stops
	overloadPayload     = 1 << 10
)

// TestOverloadBoundsMemory offers far more load than the server absorbs
// and checks that the client's and the node's memory stay bounded: two
// remote clients, each with 32 goroutines calling AppendAsync with 1 KiB
// inserts as fast as they can over 16 PChannels (one goroutine waits for
// each future, so the test itself holds only what the client admitted),
// against one node whose admission holds less than the clients together
// keep in flight. It samples the live heap (runtime/metrics, as of each
// garbage collection) every millisecond and fails if it grows past
// overloadHeapBound (64 MiB) over its size before the load: it grew by
// about 8 MiB in the runs that set the bound, and by more than 150 MiB
// within a few seconds with the client's bounds lifted. Callers
// get streamwal.ErrResourceExhausted after the client's pending wait
// instead of waiting without bound (no AppendAsync blocks for more than
// a generous multiple of it); every other append is acknowledged, and
// every acknowledged message is read back from its VChannel.
func TestOverloadBoundsMemory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := system.Start(ctx, system.Options{Cluster: "it", ServerOptions: embedded.Options{StoreDir: t.TempDir()},
		Node: node.Config{Admission: node.AdmissionOptions{PerPChannel: overloadPerPChannel, Total: overloadNodeBytes}}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	waitServing(t, s, false)
	const pendingWait = 50 * time.Millisecond
	var clients []*client.Client
	for range overloadClients {
		nc, err := s.Server.Connect()
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		c, err := client.New(nc, client.WithCluster("it"), client.WithMaxPending(overloadClientBytes),
			client.WithMaxPendingPerPChannel(overloadPerPChannel), client.WithPendingWait(pendingWait))
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Close()) })
		clients = append(clients, c)
	}
	var vs []streamwal.VChannel
	for i := range 16 {
		got, err := clients[0].CreateCollection(ctx, client.Collection{DBName: "overload", Name: fmt.Sprint(i), ID: int64(i + 1)})
		require.NoError(t, err)
		vs = append(vs, got...)
	}

	o := newOverload(vs)
	heap := startHeapSampler(o.halt)
	for _, c := range clients {
		for g := range overloadProducers {
			o.produce(ctx, c, g)
		}
	}
	o.wait()
	peak := heap.finish()
	t.Logf("heap before %d MiB, peak %d MiB; %d acknowledged, %d refused busy; longest AppendAsync %v",
		heap.base>>20, peak>>20, o.acks.Load(), o.busy.Load(), time.Duration(o.longest.Load()))
	if fails := o.failures(); len(fails) > 0 {
		t.Fatalf("%d appends failed otherwise than busy, first: %v", len(fails), fails[0])
	}
	require.LessOrEqual(t, peak-heap.base, uint64(overloadHeapBound), "heap growth under overload")
	require.Positive(t, o.busy.Load(), "callers were refused as busy")
	require.Less(t, time.Duration(o.longest.Load()), pendingWait+10*time.Second, "an AppendAsync waited without bound")
	o.checkReadable(t, ctx, clients[0])
}

// overload is the load of TestOverloadBoundsMemory and what it saw.
type overload struct {
	vs      []streamwal.VChannel
	payload []byte
	stop    chan struct{} // closed when the load should stop
	once    sync.Once
	wg      sync.WaitGroup
	acks    atomic.Int64
	busy    atomic.Int64
	longest atomic.Int64 // the longest AppendAsync call, in ns
	mu      sync.Mutex
	acked   map[streamwal.VChannel][]messages.MessageID
	fails   []error
}

// newOverload prepares a load over vs.
func newOverload(vs []streamwal.VChannel) *overload {
	return &overload{vs: vs, payload: make([]byte, overloadPayload), stop: make(chan struct{}),
		acked: map[streamwal.VChannel][]messages.MessageID{}}
}

// halt stops the load.
func (o *overload) halt() { o.once.Do(func() { close(o.stop) }) }

// produce starts a goroutine that appends through c as fast as it can
// until the load stops, one waiter goroutine per admitted append.
func (o *overload) produce(ctx context.Context, c *client.Client, g int) {
	o.wg.Go(func() {
		for i := g; ; i++ {
			select {
			case <-o.stop:
				return
			default:
			}
			v := o.vs[i%len(o.vs)]
			m, err := c.Codec().New(messages.TypeInsert, v, o.payload, messages.WithDML(0, 1))
			if err != nil {
				o.fail(err)
				return
			}
			start := time.Now()
			f := c.AppendAsync(ctx, m)
			o.noteCall(time.Since(start))
			o.wg.Go(func() { o.settle(v, f) })
		}
	})
}

// noteCall keeps the longest AppendAsync call.
func (o *overload) noteCall(d time.Duration) {
	for {
		cur := o.longest.Load()
		if int64(d) <= cur || o.longest.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// settle waits for one append and books its outcome; the load stops
// once enough were acknowledged.
func (o *overload) settle(v streamwal.VChannel, f *client.AppendFuture) {
	res, err := f.Wait()
	switch {
	case err == nil:
		o.mu.Lock()
		o.acked[v] = append(o.acked[v], res[0].ID)
		o.mu.Unlock()
		if o.acks.Add(1) >= overloadAcks {
			o.halt()
		}
	case streamwal.CodeOf(err) == streamwal.CodeResourceExhausted:
		o.busy.Add(1)
	default:
		o.fail(err)
	}
}

// fail records an unexpected error and stops the load.
func (o *overload) fail(err error) {
	o.mu.Lock()
	o.fails = append(o.fails, err)
	o.mu.Unlock()
	o.halt()
}

// failures are the unexpected errors.
func (o *overload) failures() []error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.fails
}

// wait waits for the producers and every append they made.
func (o *overload) wait() { o.wg.Wait() }

// checkReadable reads every VChannel to its end and checks that each
// acknowledged message is there.
func (o *overload) checkReadable(t *testing.T, ctx context.Context, c *client.Client) {
	for _, v := range o.vs {
		want := map[messages.MessageID]bool{}
		for _, id := range o.acked[v] {
			want[id] = true
		}
		sc, err := c.Read(ctx, client.ReadOptions{VChannel: v, Start: client.Earliest(), UntilNow: true,
			Types: []*messages.Type{messages.TypeInsert}})
		require.NoError(t, err)
		for m, err := range sc.All(ctx) {
			require.NoError(t, err)
			delete(want, m.ID())
		}
		require.NoError(t, sc.Close())
		require.Empty(t, want, "acknowledged on %s but not read back", v)
	}
}

// heapSampler samples the live heap (as of each garbage collection)
// until finished, and stops the load as soon as it grows past the bound,
// so that a failing run does not exhaust the machine's memory.
type heapSampler struct {
	base uint64
	peak atomic.Uint64
	done chan struct{}
	wg   sync.WaitGroup
}

// heapLive is the runtime metric sampled: the bytes of heap objects
// marked live by the last garbage collection (what the process holds,
// without the collector's headroom for garbage).
const heapLive = "/gc/heap/live:bytes"

// startHeapSampler measures the live heap after a collection and samples
// it every millisecond; it calls halt if the growth passes the bound.
func startHeapSampler(halt func()) *heapSampler {
	runtime.GC()
	h := &heapSampler{base: readHeap(), done: make(chan struct{})}
	h.wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-h.done:
				return
			case <-tick.C:
			}
			v := readHeap()
			if v > h.peak.Load() {
				h.peak.Store(v)
			}
			if v > h.base+overloadHeapBound {
				halt()
			}
		}
	})
	return h
}

// finish stops sampling and returns the peak.
func (h *heapSampler) finish() uint64 {
	close(h.done)
	h.wg.Wait()
	return max(h.peak.Load(), h.base)
}

// readHeap reads the live heap.
func readHeap() uint64 {
	s := []metrics.Sample{{Name: heapLive}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
