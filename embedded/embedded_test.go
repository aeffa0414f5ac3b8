package embedded_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/streamwal/streamwal/embedded"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const waitFor = 10 * time.Second

func connectJS(t *testing.T, connect func(...nats.Option) (*nats.Conn, error)) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := connect(nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return nc, js
}

func createStream(t *testing.T, js jetstream.JetStream, replicas int) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     "WAL",
		Subjects: []string{"wal.>"},
		Storage:  jetstream.FileStorage,
		Replicas: replicas,
	})
	require.NoError(t, err)
	return st
}

func publish(t *testing.T, js jetstream.JetStream, data string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	ack, err := js.Publish(ctx, "wal.records", []byte(data))
	require.NoError(t, err)
	return ack.Sequence
}

func readMsg(t *testing.T, js jetstream.JetStream, seq uint64) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	st, err := js.Stream(ctx, "WAL")
	require.NoError(t, err)
	msg, err := st.GetMsg(ctx, seq)
	require.NoError(t, err)
	return string(msg.Data)
}

func TestStartPublishAndRead(t *testing.T) {
	s := embedded.StartTest(t)

	assert.Positive(t, s.Port())
	assert.Equal(t, fmt.Sprintf("127.0.0.1:%d", s.Port()), s.Addr())
	assert.Equal(t, "nats://"+s.Addr(), s.ClientURL())
	assert.True(t, strings.HasPrefix(s.Name(), "streamwal-"), s.Name())
	assert.True(t, s.Running())
	assert.True(t, s.NATSServer().JetStreamEnabled())

	_, js := connectJS(t, s.Connect)
	createStream(t, js, 1)
	seq := publish(t, js, "hello")
	assert.Equal(t, uint64(1), seq)
	assert.Equal(t, "hello", readMsg(t, js, seq))
}

func TestOptionsAreApplied(t *testing.T) {
	for _, syncAlways := range []bool{false, true} {
		t.Run(fmt.Sprintf("SyncAlways=%v", syncAlways), func(t *testing.T) {
			s := embedded.StartTest(t, func(o *embedded.Options) {
				o.SyncAlways = syncAlways
				o.ServerName = "custom"
				o.MaxPayload = 2 << 20
				o.JetStreamMaxStore = 1 << 30
			})
			ns := s.NATSServer()
			cfg := ns.JetStreamConfig()
			require.NotNil(t, cfg)
			assert.Equal(t, syncAlways, cfg.SyncAlways)
			assert.Equal(t, int64(1<<30), cfg.MaxStore)
			assert.Contains(t, cfg.StoreDir, s.StoreDir())
			assert.Equal(t, "custom", ns.Name())

			nc, err := s.Connect()
			require.NoError(t, err)
			defer nc.Close()
			assert.Equal(t, int64(2<<20), nc.MaxPayload())
		})
	}
}

func TestDefaultMaxPayload(t *testing.T) {
	s := embedded.StartTest(t)
	nc, err := s.Connect()
	require.NoError(t, err)
	defer nc.Close()
	assert.Equal(t, int64(embedded.DefaultMaxPayload), nc.MaxPayload())
}

func TestRestartKeepsDataAndPort(t *testing.T) {
	s := embedded.StartTest(t, func(o *embedded.Options) { o.SyncAlways = true })
	port, before := s.Port(), s.NATSServer()
	nc, js := connectJS(t, s.Connect)
	createStream(t, js, 1)
	for i := range 3 {
		publish(t, js, fmt.Sprintf("msg-%d", i))
	}

	require.NoError(t, s.Restart())

	assert.Equal(t, port, s.Port())
	assert.NotSame(t, before, s.NATSServer())
	require.Eventually(t, nc.IsConnected, waitFor, 10*time.Millisecond, "client reconnects to the same URL")
	assert.Equal(t, "msg-1", readMsg(t, js, 2))
	assert.Equal(t, uint64(4), publish(t, js, "after restart"))
}

func TestShutdownIsIdempotent(t *testing.T) {
	s := embedded.StartTest(t)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(s.Shutdown)
	}
	wg.Wait()
	s.Shutdown()

	assert.False(t, s.Running())
	assert.Nil(t, s.NATSServer())
	_, err := s.Connect(nats.Timeout(time.Second))
	assert.Error(t, err)

	require.NoError(t, s.Restart(), "a shut-down server can be started again")
	assert.True(t, s.Running())
}

func TestStartFailsWhenPortIsTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()

	start := time.Now()
	_, err = embedded.Start(embedded.Options{
		StoreDir: t.TempDir(),
		Port:     l.Addr().(*net.TCPAddr).Port,
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Error listening on port")
	assert.Less(t, time.Since(start), embedded.DefaultStartTimeout, "fails fast, not by timeout")
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of the
// nats-server goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestLoggerReceivesNATSServerLogs(t *testing.T) {
	var buf syncBuffer
	s := embedded.StartTest(t, func(o *embedded.Options) {
		o.Logger = zerolog.New(&buf).Level(zerolog.InfoLevel)
	})
	s.Shutdown()
	out := buf.String()
	assert.Contains(t, out, `"component":"nats-server"`)
	assert.Contains(t, out, `"level":"info"`)
	assert.Contains(t, out, `"server":"`+s.Name()+`"`)
	assert.NotContains(t, out, `"level":"debug"`)
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name   string
		mutate func(*embedded.Options)
	}{
		{"empty StoreDir", func(o *embedded.Options) { o.StoreDir = "" }},
		{"negative Port", func(o *embedded.Options) { o.Port = -1 }},
		{"Port too large", func(o *embedded.Options) { o.Port = 65536 }},
		{"Host with port", func(o *embedded.Options) { o.Host = "127.0.0.1:4222" }},
		{"Host with space", func(o *embedded.Options) { o.Host = "local host" }},
		{"Host bad IPv6", func(o *embedded.Options) { o.Host = "::zz" }},
		{"ServerName with space", func(o *embedded.Options) { o.ServerName = "a b" }},
		{"negative MaxPayload", func(o *embedded.Options) { o.MaxPayload = -1 }},
		{"MaxPayload too large", func(o *embedded.Options) { o.MaxPayload = embedded.MaxMaxPayload + 1 }},
		{"negative JetStreamMaxMemory", func(o *embedded.Options) { o.JetStreamMaxMemory = -1 }},
		{"negative JetStreamMaxStore", func(o *embedded.Options) { o.JetStreamMaxStore = -1 }},
		{"negative StartTimeout", func(o *embedded.Options) { o.StartTimeout = -time.Second }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := embedded.Options{StoreDir: dir}
			tt.mutate(&o)
			require.ErrorIs(t, o.Validate(), embedded.ErrInvalidOptions)
			_, err := embedded.Start(o)
			require.ErrorIs(t, err, embedded.ErrInvalidOptions)
		})
	}
}

func TestValidateAcceptsDefaultsAndLimits(t *testing.T) {
	valid := []embedded.Options{
		{StoreDir: "x"},
		{StoreDir: "x", Host: "::1", Port: 65535, MaxPayload: embedded.MaxMaxPayload},
		{StoreDir: "x", Host: "localhost", JetStreamMaxMemory: 1, JetStreamMaxStore: 1},
	}
	for _, o := range valid {
		assert.NoError(t, o.Validate(), "%+v", o)
	}
}

func TestValidateCluster(t *testing.T) {
	tests := []struct {
		name string
		opts embedded.ClusterOptions
	}{
		{"empty BaseDir", embedded.ClusterOptions{}},
		{"Size 1", embedded.ClusterOptions{BaseDir: "x", Size: 1}},
		{"Name with space", embedded.ClusterOptions{BaseDir: "x", Name: "a b"}},
		{"template Port", embedded.ClusterOptions{BaseDir: "x", Server: embedded.Options{Port: 4222}}},
		{"template StoreDir", embedded.ClusterOptions{BaseDir: "x", Server: embedded.Options{StoreDir: "y"}}},
		{"bad template", embedded.ClusterOptions{BaseDir: "x", Server: embedded.Options{MaxPayload: -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorIs(t, tt.opts.Validate(), embedded.ErrInvalidOptions)
			_, err := embedded.StartCluster(tt.opts)
			require.ErrorIs(t, err, embedded.ErrInvalidOptions)
		})
	}
	assert.NoError(t, embedded.ClusterOptions{BaseDir: "x"}.Validate())
}

func TestClusterSurvivesLossOfOneServer(t *testing.T) {
	c := embedded.StartTestCluster(t, func(o *embedded.ClusterOptions) { o.Server.SyncAlways = true })
	require.Len(t, c.Servers(), 3)
	require.Len(t, c.ClientURLs(), 3)
	require.NotNil(t, c.Leader())
	for _, s := range c.Servers() {
		assert.True(t, s.NATSServer().JetStreamIsClustered(), s.Name())
	}

	_, js := connectJS(t, c.Connect)
	st := createStream(t, js, 3)
	publish(t, js, "before")

	victim := streamLeaderIndex(t, c, st)
	require.NoError(t, c.StopServer(victim))
	assert.False(t, c.Servers()[victim].Running())

	seq := publishEventually(t, js, "during")
	assert.Equal(t, uint64(2), seq)
	assert.Equal(t, "before", readMsg(t, js, 1))
	assert.Equal(t, "during", readMsg(t, js, 2))

	require.NoError(t, c.RestartServer(victim))
	assert.Equal(t, uint64(3), publish(t, js, "after"))
	require.Error(t, c.StopServer(3))
}

// streamLeaderIndex returns the index of the member leading stream st.
func streamLeaderIndex(t *testing.T, c *embedded.Cluster, st jetstream.Stream) int {
	t.Helper()
	info, err := st.Info(context.Background())
	require.NoError(t, err)
	require.NotNil(t, info.Cluster)
	for i, s := range c.Servers() {
		if s.Name() == info.Cluster.Leader {
			return i
		}
	}
	t.Fatalf("stream leader %q is not a cluster member", info.Cluster.Leader)
	return -1
}

// publishEventually retries a publish while the stream elects a new leader.
func publishEventually(t *testing.T, js jetstream.JetStream, data string) uint64 {
	t.Helper()
	var seq uint64
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		// The message ID makes a retry after a client-side timeout (whose
		// first attempt may have landed) resolve to the same sequence.
		ack, err := js.Publish(ctx, "wal.records", []byte(data), jetstream.WithMsgID(data))
		if err != nil {
			return false
		}
		seq = ack.Sequence
		return true
	}, waitFor, 10*time.Millisecond)
	return seq
}
