package broadcast_test

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord/broadcast"
	"github.com/streamwal/streamwal/services/wire"
)

// targetName is the name a broadcaster gives a replica's target: its
// VChannel, or its PChannel for a cluster barrier.
func targetName(m *messages.MutableMessage) string {
	if m.VChannel().IsZero() {
		return m.PChannel().String()
	}
	return m.VChannel().String()
}

// landing is one replica that landed, in landing order.
type landing struct {
	target string
	id     uint64 // broadcast ID
	typ    string
	msg    *messages.MutableMessage
	res    wire.AppendResult
}

// appendHook runs before an append lands; it may block (honouring ctx)
// or fail the append.
type appendHook func(ctx context.Context, target string, m *messages.MutableMessage) error

// fakeAppender is an in-memory WAL: it records every call and every
// replica that landed, deduplicates by message ID (a repeated ID returns
// the first result and lands nothing, as the real WAL does), and can be
// told to fail a target's next appends.
type fakeAppender struct {
	mu      sync.Mutex
	calls   []landing // every call, landed or not (res unset)
	landed  []landing // every replica that landed, in order
	byMsgID map[string]wire.AppendResult
	seq     uint64
	fail    map[string][]error // per target: errors for the next calls, before landing
	lost    map[string][]error // per target: land, then answer with this error
	hook    appendHook
}

func newFakeAppender() *fakeAppender {
	return &fakeAppender{byMsgID: map[string]wire.AppendResult{}, fail: map[string][]error{}, lost: map[string][]error{}}
}

func (a *fakeAppender) Append(ctx context.Context, m *messages.MutableMessage) (wire.AppendResult, error) {
	target := targetName(m)
	bh := m.Header().Broadcast
	var id uint64
	if bh != nil {
		id = bh.ID
	}
	a.mu.Lock()
	a.calls = append(a.calls, landing{target: target, id: id, typ: m.Type().Name, msg: m})
	if errs := a.fail[target]; len(errs) > 0 {
		a.fail[target] = errs[1:]
		a.mu.Unlock()
		return wire.AppendResult{}, errs[0]
	}
	hook := a.hook
	a.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, target, m); err != nil {
			return wire.AppendResult{}, err
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if m.MsgID() != "" {
		if res, ok := a.byMsgID[m.MsgID()]; ok {
			return res, nil
		}
	}
	a.seq++
	res := wire.AppendResult{ID: messages.MessageID(a.seq), TimeTick: messages.TimeTick(1000 + a.seq)}
	if m.MsgID() != "" {
		a.byMsgID[m.MsgID()] = res
	}
	a.landed = append(a.landed, landing{target: target, id: id, typ: m.Type().Name, msg: m, res: res})
	if errs := a.lost[target]; len(errs) > 0 {
		a.lost[target] = errs[1:]
		return wire.AppendResult{}, errs[0]
	}
	return res, nil
}

// failNext makes the next calls for target fail with errs, in turn.
func (a *fakeAppender) failNext(target string, errs ...error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fail[target] = append(a.fail[target], errs...)
}

// loseReply makes the next append to target land but answer err.
func (a *fakeAppender) loseReply(target string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lost[target] = append(a.lost[target], err)
}

func (a *fakeAppender) setHook(h appendHook) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hook = h
}

// Landed returns the replicas that landed, in order.
func (a *fakeAppender) Landed() []landing {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.landed)
}

// Calls returns every append call, in order.
func (a *fakeAppender) Calls() []landing {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

// landedOf returns the replicas of broadcast id that landed.
func (a *fakeAppender) landedOf(id uint64) []landing {
	var out []landing
	for _, l := range a.Landed() {
		if l.id == id {
			out = append(out, l)
		}
	}
	return out
}

// callsTo counts the calls for target of broadcast id.
func (a *fakeAppender) callsTo(id uint64, target string) int {
	n := 0
	for _, c := range a.Calls() {
		if c.id == id && c.target == target {
			n++
		}
	}
	return n
}

// fakeStore keeps tasks in a map, as JSON like the real bucket does (so a
// saved task is a snapshot the broadcaster cannot change afterwards).
type fakeStore struct {
	mu       sync.Mutex
	tasks    map[uint64][]byte
	saves    []broadcast.Task
	failSave func(t *broadcast.Task) error
	listErr  error
	deletes  []uint64
}

func newFakeStore() *fakeStore { return &fakeStore{tasks: map[uint64][]byte{}} }

func (s *fakeStore) Save(ctx context.Context, t *broadcast.Task) error {
	if err := ctx.Err(); err != nil {
		return streamwal.Errorf(streamwal.CodeUnavailable, "save: %v", err)
	}
	data, err := json.Marshal(t)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failSave != nil {
		if err := s.failSave(t); err != nil {
			return err
		}
	}
	s.tasks[t.ID] = data
	var c broadcast.Task
	if err := json.Unmarshal(data, &c); err != nil {
		return err
	}
	s.saves = append(s.saves, c)
	return nil
}

func (s *fakeStore) List(ctx context.Context) ([]*broadcast.Task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listErr != nil {
		return nil, s.listErr
	}
	var out []*broadcast.Task
	for _, data := range s.tasks {
		t := &broadcast.Task{}
		if err := json.Unmarshal(data, t); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

func (s *fakeStore) Delete(ctx context.Context, id uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tasks, id)
	s.deletes = append(s.deletes, id)
	return nil
}

// put stores a task as an earlier coordinator would have left it.
func (s *fakeStore) put(t *testing.T, task broadcast.Task) {
	t.Helper()
	data, err := json.Marshal(task)
	require.NoError(t, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tasks[task.ID] = data
}

// get returns a copy of task id (nil if absent).
func (s *fakeStore) get(id uint64) *broadcast.Task {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, ok := s.tasks[id]
	if !ok {
		return nil
	}
	t := &broadcast.Task{}
	if err := json.Unmarshal(data, t); err != nil {
		panic(err)
	}
	return t
}

// ids lists the stored task IDs, sorted.
func (s *fakeStore) ids() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.tasks))
}

func (s *fakeStore) setFailSave(f func(t *broadcast.Task) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failSave = f
}

// state returns the stored state of task id ("" if absent).
func (s *fakeStore) state(id uint64) broadcast.State {
	if t := s.get(id); t != nil {
		return t.State
	}
	return ""
}

// callbackLog records the callbacks that ran, in order, and can fail the
// next ones.
type callbackLog struct {
	mu    sync.Mutex
	ran   []uint64
	tries map[uint64]int
	fail  int // fail this many calls (any task) before succeeding
	seen  func(t *broadcast.Task)
}

func (c *callbackLog) callback(ctx context.Context, t *broadcast.Task) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tries == nil {
		c.tries = map[uint64]int{}
	}
	c.tries[t.ID]++
	if c.seen != nil {
		c.seen(t)
	}
	if c.fail > 0 {
		c.fail--
		return streamwal.Errorf(streamwal.CodeUnavailable, "callback refused for the test")
	}
	c.ran = append(c.ran, t.ID)
	return nil
}

func (c *callbackLog) Ran() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.ran)
}

func (c *callbackLog) Tries(id uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tries[id]
}

// env is a broadcaster over fakes.
type env struct {
	t      *testing.T
	codec  *messages.Codec
	app    *fakeAppender
	store  *fakeStore
	cbs    *callbackLog
	nextID atomic.Uint64
	idHook func() // runs in NewID, if set before New
	b      *broadcast.Broadcaster

	p0, p1, p2       streamwal.PChannel
	v1, v2, v3, cchn streamwal.VChannel
}

// newEnv builds fakes and channels; start makes the broadcaster.
func newEnv(t *testing.T) *env {
	t.Helper()
	codec, err := messages.NewCodec("test", nil)
	require.NoError(t, err)
	e := &env{t: t, codec: codec, app: newFakeAppender(), store: newFakeStore(), cbs: &callbackLog{}}
	e.nextID.Store(100)
	ps, err := streamwal.PChannels("pchan", 3)
	require.NoError(t, err)
	e.p0, e.p1, e.p2 = ps[0], ps[1], ps[2]
	e.v1, err = e.p0.VChannel(1, 0)
	require.NoError(t, err)
	e.v2, err = e.p1.VChannel(1, 1)
	require.NoError(t, err)
	e.v3, err = e.p2.VChannel(2, 0)
	require.NoError(t, err)
	e.cchn = e.p0.CChannel()
	return e
}

// config is the broadcaster's configuration over the env's fakes.
func (e *env) config() broadcast.Config {
	cb := e.cbs.callback
	return broadcast.Config{
		Codec:    e.codec,
		Appender: e.app,
		Store:    e.store,
		NewID: func(ctx context.Context) (uint64, error) {
			if e.idHook != nil {
				e.idHook()
			}
			return e.nextID.Add(1), nil
		},
		Callbacks: map[string]broadcast.Callback{
			messages.TypeCreateCollection.Name:   cb,
			messages.TypeTruncateCollection.Name: cb,
			messages.TypeCreateDatabase.Name:     cb,
		},
	}
}

// start makes and resumes a broadcaster, closed at the end of the test.
func (e *env) start(cfg broadcast.Config) *broadcast.Broadcaster {
	e.t.Helper()
	b := broadcast.New(cfg)
	require.NoError(e.t, b.Resume(context.Background()))
	e.t.Cleanup(b.Close)
	e.b = b
	return b
}

// ids counts the IDs handed out.
func (e *env) ids() uint64 { return e.nextID.Load() - 100 }

func mustBody(t *testing.T, typ *messages.Type, body any) []byte {
	t.Helper()
	data, err := messages.MarshalBody(typ, body)
	require.NoError(t, err)
	return data
}

// createCollection broadcasts collection db/name with the given shards.
func (e *env) createCollection(db, name string, id int64, vs ...streamwal.VChannel) broadcast.Request {
	var names []string
	for _, v := range vs {
		names = append(names, v.String())
	}
	return broadcast.Request{
		Type:    messages.TypeCreateCollection,
		Targets: messages.Targets{VChannels: vs, CChannel: e.cchn},
		Scope:   messages.KeyScope{DBName: db, CollectionName: name},
		Payload: mustBody(e.t, messages.TypeCreateCollection, messages.CreateCollectionBody{
			CollectionRef: messages.CollectionRef{DBName: db, CollectionName: name, CollectionID: id}, VChannels: names}),
	}
}

// truncate broadcasts TruncateCollection (AckSyncUp).
func (e *env) truncate(db, name string, id int64, vs ...streamwal.VChannel) broadcast.Request {
	return broadcast.Request{
		Type:    messages.TypeTruncateCollection,
		Targets: messages.Targets{VChannels: vs, CChannel: e.cchn},
		Scope:   messages.KeyScope{DBName: db, CollectionName: name},
		Payload: mustBody(e.t, messages.TypeTruncateCollection, messages.TruncateCollectionBody{
			CollectionRef: messages.CollectionRef{DBName: db, CollectionName: name, CollectionID: id}}),
	}
}

// createDatabase broadcasts CreateDatabase (CChannel only).
func (e *env) createDatabase(db string) broadcast.Request {
	return broadcast.Request{
		Type:    messages.TypeCreateDatabase,
		Targets: messages.Targets{CChannel: e.cchn},
		Scope:   messages.KeyScope{DBName: db},
		Payload: []byte(`{"db_name":"` + db + `"}`),
	}
}

// outcome is a Broadcast call's return.
type outcome struct {
	res broadcast.Result
	err error
}

// goBroadcast runs Broadcast in a goroutine; the channel gets its outcome.
func (e *env) goBroadcast(ctx context.Context, req broadcast.Request) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		res, err := e.b.Broadcast(ctx, req)
		ch <- outcome{res, err}
	}()
	return ch
}

// recv waits for an outcome (the test fails after 10 s).
func recv(t *testing.T, ch <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(10 * time.Second):
		require.FailNow(t, "broadcast did not return")
		return outcome{}
	}
}

// pending reports whether a broadcast has not returned yet.
func pending(ch <-chan outcome) bool {
	select {
	case o := <-ch:
		panic("broadcast returned early: " + errString(o.err))
	default:
		return true
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// gate blocks the appends it matches until opened; arrivals counts the
// appends waiting at it.
type gate struct {
	open     chan struct{}
	once     sync.Once
	arrivals atomic.Int64
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

// wait blocks until the gate opens or ctx ends.
func (g *gate) wait(ctx context.Context) error {
	g.arrivals.Add(1)
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return streamwal.Errorf(streamwal.CodeUnavailable, "append: %v", ctx.Err())
	}
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

const waitFor = 10 * time.Second
const tick = time.Millisecond

// nowUTC is the time as tasks record it.
func (e *env) nowUTC() time.Time { return time.Now().UTC() }
