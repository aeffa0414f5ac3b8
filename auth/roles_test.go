package auth_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/auth"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/embedded/system"
	wjs "github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord"
	"github.com/streamwal/streamwal/services/node"
	"github.com/streamwal/streamwal/services/node/recovery"
	"github.com/streamwal/streamwal/services/node/shard"
)

// testPChannels is the PChannel count of the secured clusters.
const testPChannels = 2

// violationLog collects the permission violations nats-server logs.
type violationLog struct {
	mu    sync.Mutex
	lines []string
}

// Write keeps the log lines that report a violation.
func (l *violationLog) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("Violation")) {
		l.mu.Lock()
		l.lines = append(l.lines, string(p))
		l.mu.Unlock()
	}
	return len(p), nil
}

// all returns the violations logged so far.
func (l *violationLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// secured is a cluster whose server accepts only the users of an auth
// directory, each member connected with its role's seed.
type secured struct {
	sys  *system.System
	dir  auth.Dir
	spec auth.Spec
	log  *violationLog
	// extra are the options every connection needs besides its seed
	// (TLS).
	extra []nats.Option
}

// memberRoles are the roles of the system's connections.
var memberRoles = map[system.Member]auth.Role{
	system.MemberCoordinator: auth.RoleCoordinator,
	system.MemberNode:        auth.RoleNode,
	system.MemberClient:      auth.RoleClient,
}

// startSecured writes an auth directory, starts a server with its users
// (and TLS if given) and a system whose node stores segments and truncates
// its streams as soon as it may, and waits until every PChannel is served.
func startSecured(t *testing.T, tls *embedded.TLS, extra ...nats.Option) *secured {
	t.Helper()
	s := &secured{dir: auth.Dir(t.TempDir()), spec: spec(t, "sec", testPChannels), log: &violationLog{}, extra: extra}
	_, err := auth.Init(s.dir, s.spec, false)
	require.NoError(t, err)
	users, err := s.dir.Users(s.spec, auth.Roles...)
	require.NoError(t, err)
	opts := map[system.Member][]nats.Option{}
	for m, r := range memberRoles {
		o, err := s.dir.Option(r)
		require.NoError(t, err)
		opts[m] = append([]nats.Option{o}, extra...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.sys, err = system.Start(ctx, system.Options{Cluster: s.spec.Cluster,
		ServerOptions: embedded.Options{StoreDir: t.TempDir(), Users: users, TLS: tls,
			Logger: zerolog.New(s.log).Level(zerolog.WarnLevel)},
		Coord: coord.Config{PChannels: testPChannels},
		// Segments of 3 rows, flushed and truncated at once (truncation
		// never passes the duplicate window).
		Node: node.Config{SyncInterval: 50 * time.Millisecond, Backend: wjs.Options{DuplicateWindow: time.Second},
			Recovery: node.RecoveryOptions{Cadence: recovery.Cadence{Interval: 20 * time.Millisecond, Dirty: 1},
				Shard: shard.Config{MaxRows: 3}, Retain: node.RetainNothing, TruncateInterval: 50 * time.Millisecond}},
		ConnectOptions: func(m system.Member) []nats.Option { return opts[m] }})
	require.NoError(t, err)
	t.Cleanup(s.sys.Close)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("permission violations: %q", s.log.all())
		}
	})
	_, err = s.sys.WaitServing(ctx, false)
	require.NoError(t, err)
	return s
}

// roleConn is a connection under one role that keeps the asynchronous
// errors the server sends it (permission violations among them).
type roleConn struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

// connect connects under role r.
func (s *secured) connect(t *testing.T, r auth.Role) *roleConn {
	t.Helper()
	o, err := s.dir.Option(r)
	require.NoError(t, err)
	c := &roleConn{errs: make(chan error, 256)}
	opts := append([]nats.Option{o, nats.Name("test-" + string(r)), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case c.errs <- err:
		default:
		}
	})}, s.extra...)
	c.nc, err = s.sys.Server.Connect(opts...)
	require.NoError(t, err)
	t.Cleanup(c.nc.Close)
	c.js, err = jetstream.New(c.nc)
	require.NoError(t, err)
	return c
}

// client is a streamwal client under the client role, through NATS only.
func (s *secured) client(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(s.connect(t, auth.RoleClient).nc, client.WithCluster(s.spec.Cluster), client.WithoutLocalBypass())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// denied runs op, which must fail, and requires the server to have
// refused c a publish or a subscription to subject.
func (c *roleConn) denied(t *testing.T, subject string, op func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	err := op(ctx)
	cancel()
	require.Error(t, err, "%s must fail", subject)
	c.requireViolation(t, subject)
}

// requireViolation waits for the server's permission violation on subject.
func (c *roleConn) requireViolation(t *testing.T, subject string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), strconv.Quote(subject)) {
				return
			}
		case <-deadline:
			t.Fatalf("no permission violation on %s", subject)
		}
	}
}

// testCtx bounds a test's calls.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// The generated permissions are complete: a coordinator and a node
// connected with their seeds serve every PChannel, and a client with its
// seed creates a collection (a broadcast), appends, reads back (from the
// start, below the stream's truncation point, through the archive the
// node keeps in the object store, and from the tail), lists segments and
// gets the status, with no permission violation logged by the server.
func TestRolesServeAWorkload(t *testing.T) {
	s := startSecured(t, nil)
	workload(t, s)
}

// workload runs the client's operations on s and requires that the
// server refused nothing to anyone.
func workload(t *testing.T, s *secured) {
	t.Helper()
	ctx := testCtx(t)
	c := s.client(t)
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "db", Name: "col", ID: 1})
	require.NoError(t, err)
	v := vs[0]
	var first, last client.AppendResult
	for i := range 7 {
		m, err := c.Codec().New(messages.TypeInsert, v, fmt.Appendf(nil, "row-%d", i), messages.WithDML(0, 1))
		require.NoError(t, err)
		res, err := c.Append(ctx, m)
		require.NoError(t, err)
		if i == 0 {
			first = res[0]
		}
		last = res[0]
	}
	ch := waitStatus(t, c, v.PChannel(), func(ch client.ChannelStatus) bool {
		return ch.Checkpoint != nil && ch.Checkpoint.Consumed >= last.ID && ch.FirstID > first.ID
	})
	require.Empty(t, ch.StorageError)

	segs, err := c.Segments(ctx, v)
	require.NoError(t, err)
	flushed := 0
	for _, sg := range segs {
		if sg.Source == client.SourceObjectStore {
			flushed++
		}
	}
	require.Equal(t, 2, flushed, "7 rows at 3 a segment: %+v", segs)

	durablePosition(t, s, v)

	tail, err := c.Read(ctx, client.ReadOptions{VChannel: v, Start: client.Latest(), Types: []*messages.Type{messages.TypeInsert}})
	require.NoError(t, err)
	// A durable subscription keeps its position in the subscriptions
	// bucket, the one bucket a client writes.
	sub, err := c.Subscribe(ctx, "roles", client.SubscribeVChannel(v), client.SubscribeTypes(messages.TypeInsert),
		client.SubscribeStart(client.Latest()))
	require.NoError(t, err)
	m, err := c.Codec().New(messages.TypeInsert, v, []byte("tail"), messages.WithDML(0, 1))
	require.NoError(t, err)
	_, err = c.Append(ctx, m)
	require.NoError(t, err)
	got, err := tail.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, "tail", string(got.Payload()))
	require.NoError(t, tail.Close())
	d, err := sub.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, "tail", string(d.Message.Payload()))
	require.NoError(t, d.Ack(ctx))
	require.NoError(t, sub.Close())
	subs, err := c.Subscriptions(ctx)
	require.NoError(t, err)
	require.Len(t, subs, 1)
	require.Equal(t, d.Message.ID(), subs[0].Positions[0].ID)

	// Each node reads the coordinator's lease and view, for its
	// readiness.
	for _, n := range s.sys.Nodes() {
		require.Eventually(t, func() bool { return n.Ready() == nil }, 30*time.Second, 20*time.Millisecond, "node %s ready", n.ID())
	}

	// Read from the start: below the truncation point, through the
	// archive. The nodes stop first, so that no truncation runs during
	// the read (a read of the archive that races with truncation is not
	// what this test is about).
	for _, n := range s.sys.Nodes() {
		s.sys.StopNode(n.ID(), false)
	}
	sc, err := c.Read(ctx, client.ReadOptions{VChannel: v, Start: client.Earliest(), Types: []*messages.Type{messages.TypeInsert}})
	require.NoError(t, err)
	for i := range 7 {
		m, err := sc.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("row-%d", i), string(m.Payload()))
	}
	got, err = sc.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, "tail", string(got.Payload()))
	require.NoError(t, sc.Close())

	require.Empty(t, s.log.all(), "the server refused a permission to a streamwal component")
}

// durablePosition keeps a client's position in v's stream in a durable
// consumer: created, fetched from, acknowledged, and found again.
func durablePosition(t *testing.T, s *secured, v streamwal.VChannel) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cli := s.connect(t, auth.RoleClient)
	stream := s.spec.Cluster.StreamName(v.PChannel())
	cfg := jetstream.ConsumerConfig{Durable: "reader", AckPolicy: jetstream.AckExplicitPolicy,
		FilterSubject: s.spec.Cluster.VChannelSubject(v, messages.TypeInsert.Token)}
	cons, err := cli.js.CreateOrUpdateConsumer(ctx, stream, cfg)
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	require.NoError(t, err)
	var acked uint64
	for m := range batch.Messages() {
		require.NoError(t, m.DoubleAck(ctx))
		meta, err := m.Metadata()
		require.NoError(t, err)
		acked = meta.Sequence.Stream
	}
	require.NoError(t, batch.Error())
	require.NotZero(t, acked)
	cons, err = cli.js.Consumer(ctx, stream, cfg.Durable)
	require.NoError(t, err)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.AckFloor.Consumer, "the position is kept")
	require.GreaterOrEqual(t, info.AckFloor.Stream, acked, "the position is kept")
	require.NoError(t, cli.js.DeleteConsumer(ctx, stream, cfg.Durable))
}

// waitStatus waits until p's status satisfies ok and returns it.
func waitStatus(t *testing.T, c *client.Client, p streamwal.PChannel, ok func(client.ChannelStatus) bool) client.ChannelStatus {
	t.Helper()
	var last client.ChannelStatus
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var st client.Status
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err = c.Status(ctx)
		cancel()
		if err != nil {
			continue
		}
		for _, ch := range st.Channels {
			if ch.PChannel == p.String() {
				last = ch
			}
		}
		if ok(last) {
			return last
		}
	}
	t.Fatalf("status of %s never got there; last %+v (%v)", p, last, err)
	return last
}

// A client cannot publish into wal.>, write or delete a coordinator
// bucket, create, delete or purge a stream, nor take the append requests
// of nodes; a node cannot write or delete the coordinator's state nor
// delete a stream. Each is refused by the server (a permission violation)
// and changes nothing.
func TestRolesAreRefusedWhatIsNotTheirs(t *testing.T) {
	s := startSecured(t, nil)
	ctx := testCtx(t)
	c := s.client(t)
	vs, err := c.CreateCollection(ctx, client.Collection{DBName: "db", Name: "col", ID: 1})
	require.NoError(t, err)
	v := vs[0]
	p := v.PChannel()
	cl := s.spec.Cluster
	stream := cl.StreamName(p)
	assignments := cl.BucketName(streamwal.BucketAssignments)
	insert := cl.VChannelSubject(v, messages.TypeInsert.Token)
	admin := s.connect(t, auth.RoleAdmin)
	before := snapshot(t, admin, stream, insert, assignments)

	cli := s.connect(t, auth.RoleClient)
	cli.denied(t, insert, func(ctx context.Context) error { _, err := cli.js.Publish(ctx, insert, []byte("forged")); return err })
	view := streamwal.KVKeySubject(assignments, streamwal.KeyView)
	cli.denied(t, view, func(ctx context.Context) error { _, err := cli.js.Publish(ctx, view, []byte("{}")); return err })
	cli.denied(t, streamwal.JSAPISubject(streamwal.JSStreamDelete, streamwal.KVStreamName(assignments)),
		func(ctx context.Context) error { return cli.js.DeleteKeyValue(ctx, assignments) })
	cli.denied(t, streamwal.JSAPISubject(streamwal.JSStreamDelete, stream),
		func(ctx context.Context) error { return cli.js.DeleteStream(ctx, stream) })
	st, err := cli.js.Stream(ctx, stream)
	require.NoError(t, err, "a client may look at a stream")
	_, err = cli.js.KeyValue(ctx, cl.BucketName(streamwal.BucketLeader))
	require.NoError(t, err, "a client may look whether its cluster's lease bucket exists (to tell a missing cluster from a takeover)")
	cli.denied(t, streamwal.JSAPISubject(streamwal.JSStreamPurge, stream), func(ctx context.Context) error { return st.Purge(ctx) })
	other := cl.StreamName(mustPChannel(t, testPChannels))
	cli.denied(t, streamwal.JSAPISubject(streamwal.JSStreamCreate, other), func(ctx context.Context) error {
		_, err := cli.js.CreateStream(ctx, jetstream.StreamConfig{Name: other, Subjects: []string{cl.APIWildcard()}})
		return err
	})
	_, err = cli.nc.SubscribeSync(cl.AppendWildcard())
	require.NoError(t, err)
	cli.requireViolation(t, cl.AppendWildcard())

	nd := s.connect(t, auth.RoleNode)
	nd.denied(t, view, func(ctx context.Context) error { _, err := nd.js.Publish(ctx, view, []byte("{}")); return err })
	lease := streamwal.KVKeySubject(cl.BucketName(streamwal.BucketLeader), streamwal.KeyLeader)
	nd.denied(t, lease, func(ctx context.Context) error { _, err := nd.js.Publish(ctx, lease, []byte("node")); return err })
	nd.denied(t, streamwal.JSAPISubject(streamwal.JSStreamDelete, streamwal.KVStreamName(assignments)),
		func(ctx context.Context) error { return nd.js.DeleteKeyValue(ctx, assignments) })
	nd.denied(t, streamwal.JSAPISubject(streamwal.JSStreamDelete, stream),
		func(ctx context.Context) error { return nd.js.DeleteStream(ctx, stream) })

	// Replication: a node writes its PChannels' replicate checkpoints
	// (status and lag) and a client reads them, but neither writes the
	// topology, which is the coordinator's.
	repl := cl.BucketName(streamwal.BucketReplication)
	topology := streamwal.KVKeySubject(repl, streamwal.KeyReplicateTopology)
	nd.denied(t, topology, func(ctx context.Context) error { _, err := nd.js.Publish(ctx, topology, []byte("{}")); return err })
	cli.denied(t, topology, func(ctx context.Context) error { _, err := cli.js.Publish(ctx, topology, []byte("{}")); return err })
	kv, err := nd.js.KeyValue(ctx, repl)
	require.NoError(t, err, "a node binds the replication bucket")
	_, err = kv.Put(ctx, streamwal.ReplicateCheckpointKey(p), []byte("{}"))
	require.NoError(t, err, "a node writes its PChannel's replicate checkpoint")
	ckv, err := cli.js.KeyValue(ctx, repl)
	require.NoError(t, err, "a client reads replication's status")
	_, err = ckv.Get(ctx, streamwal.ReplicateCheckpointKey(p))
	require.NoError(t, err)

	require.Equal(t, before, snapshot(t, admin, stream, insert, assignments), "nothing changed")
	_, err = s.sys.WaitServing(ctx, false)
	require.NoError(t, err)
}

// mustPChannel is PChannel i of the secured clusters.
func mustPChannel(t *testing.T, i int) streamwal.PChannel {
	t.Helper()
	p, err := streamwal.NewPChannel("pchan", i)
	require.NoError(t, err)
	return p
}

// state is what the refused operations must not change.
type state struct {
	// forged: the client's forged insert is in the stream.
	forged       bool
	viewRevision uint64
	streams      []string
}

// snapshot reads, as admin, whether stream's last insert on subject is
// the forged one, the revision of the assignment view and the streams.
func snapshot(t *testing.T, admin *roleConn, stream, insert, assignments string) state {
	t.Helper()
	ctx := testCtx(t)
	st, err := admin.js.Stream(ctx, stream)
	require.NoError(t, err)
	var out state
	m, err := st.GetLastMsgForSubject(ctx, insert)
	if !errors.Is(err, jetstream.ErrMsgNotFound) {
		require.NoError(t, err)
		out.forged = string(m.Data) == "forged"
	}
	kv, err := admin.js.KeyValue(ctx, assignments)
	require.NoError(t, err)
	e, err := kv.Get(ctx, streamwal.KeyView)
	require.NoError(t, err)
	out.viewRevision = e.Revision()
	names := admin.js.StreamNames(ctx)
	for name := range names.Name() {
		out.streams = append(out.streams, name)
	}
	require.NoError(t, names.Err())
	slices.Sort(out.streams)
	return out
}
