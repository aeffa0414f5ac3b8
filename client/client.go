// Package client is the StreamingClient (DESIGN.md §3): the Go library
// through which a service appends, runs transactions, broadcasts and reads,
// without knowing which node owns what.
//
// # Appending
//
// Append sends each message to its PChannel's append subject, answered
// only by the PChannel's current owner. Concurrent appends to one
// PChannel are coalesced: an append to a PChannel with nothing in flight
// goes out at once; while a request is in flight, later messages wait (up
// to WithLinger, 1 ms by default, or until a request's worth is queued)
// and go out together, at most WithMaxBatch messages and the connection's
// maximum payload a request, WithMaxInFlight requests a PChannel. A
// message too large for any request is an invalid argument. Throughput
// under fsync comes from keeping many appends in flight (AppendAsync):
// the node group-commits what waits into atomic batches of up to 1000
// messages, whose fixed cost on the server is several milliseconds.
//
// # Backpressure
//
// Memory stays bounded when more load is offered than the nodes absorb:
// the client holds at most WithMaxPending bytes of appends (128 MiB by
// default), queued or in flight until answered, and at most
// WithMaxPendingPerPChannel (16 MiB) for one PChannel. A call that finds
// no room waits for it (Append and AppendAsync alike: AppendAsync returns
// at once only while there is room), up to WithPendingWait (5 s) or its
// context, then fails with streamwal.ErrResourceExhausted, retriable,
// with nothing of it sent. A node refuses an append request with the
// same error when its own bounds are full (see the node package); the
// client retries that refusal as any retriable one, so the caller sees
// it only as a wait for room. So what the client holds for appends stays
// under its bound (as counted: each message's size in a request plus
// about 1 KiB) plus one call's worth, however many goroutines append;
// TestOverloadBoundsMemory (package integration) checks the heap under
// such overload with smaller bounds.
//
// # Order
//
// The messages of one Append (or AppendAsync) call land in the order
// given on each VChannel (indeed on each PChannel), whatever their
// number and size and whatever the retries: messages of other calls may
// land between them, and separate calls are not ordered among
// themselves. A call's part for one PChannel goes out in chunks of at
// most one request each, and a chunk goes out only once every message of
// the one before it was acknowledged, since the node serves concurrent
// requests concurrently; chunks of different calls coalesce into the
// same requests, and several requests are in flight per PChannel. When a
// call fails, what it stored is still in call order, and nothing of it
// goes out after a message that failed for good; a message that carries
// the ID of one stored before it keeps that one's place.
//
// # Retries
//
// Every message gets a client-generated message ID on its first attempt,
// so a retry of one that did land returns the stored message instead of
// writing it twice. Errors that say the owner is moving, unreachable or
// was replaced are retried until the caller's context ends, by request,
// not by message: the messages of a request that are worth a retry go
// back, in order, to the head of their PChannel's queue, ahead of what
// came since, and the PChannel sends nothing for one exponential backoff
// (WithRetryMaxInterval caps it; it starts over once a request lands
// whole). A request to a PChannel that times out doubles the timeout of
// the next ones, up to 4 times WithTimeout, until a request leaves
// nothing to retry: the node is most likely still at work on it, and a
// copy with the same deadline would only add to that work. What is left
// comes back as a typed error (errors.Is with the streamwal sentinels).
//
// The node refuses each message of a request on its own: if it refuses a
// message and stores a later one of the same call, a retry of the first
// lands above the second, unless an earlier attempt of it (still in
// flight on the node when it was refused) stored it below. A call whose
// retried message lands above a later one of it fails with
// streamwal.ErrInternal, its messages stored, rather than report success
// for messages out of order; the client sees this only in the answers it
// gets, not in a request that timed out.
//
// Messages of a transaction carry no message ID and are never retried: a
// body that may not have landed ends its transaction, and the caller
// starts a new one.
//
// # Local bypass
//
// When a client is given the nodes of its own process (WithLocal; an
// embedded deployment through embedded/system's System.Local) and one of
// them serves the PChannel, Append calls its WAL directly, with the same
// semantics and errors; without WithLocal every append goes through NATS.
//
// # Reading
//
// Read opens a scanner straight on JetStream, with no node in the path:
// TimeTick order, transactions assembled, a watermark, a Go iterator;
// JetStream's ordered consumer carries it through node failover and
// reconnects. ReadOptions.UntilNow makes it stop at the tail as it was
// when the read started.
//
// # Durable subscriptions
//
// Subscribe reads a VChannel or a collection as Read does, but keeps its
// position in the cluster under a name: each Delivery is acknowledged by
// the handler (Ack covers every message delivered before it on its
// VChannel, so acknowledging every hundredth message is enough), and a
// subscription opened again (by a restarted service) resumes right after
// the last acknowledged message, from its LastConfirmedMessageID, so that a
// transaction open there is delivered whole. Members of a group
// (SubscribeGroup) share the VChannels, each read by one member at a time
// under a lease; a member's VChannels move to the others when it stops or
// dies. The owner of a PChannel never truncates past a position, unless it
// was idle past its expiry. Subscriptions lists them, DeleteSubscription
// removes one.
package client

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/internal/admit"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/telemetry"
	"github.com/streamwal/streamwal/telemetry/oteltrace"
)

// Defaults.
const (
	DefaultCluster     = "local"
	DefaultTimeout     = 5 * time.Second
	DefaultMaxBatch    = 1000
	DefaultMaxInFlight = 4
	DefaultLinger      = time.Millisecond
	// DefaultMaxPending bounds the bytes of appends a client holds,
	// queued or in flight, over all PChannels (see WithMaxPending).
	DefaultMaxPending = 128 << 20
	// DefaultMaxPendingPerPChannel bounds them for one PChannel.
	DefaultMaxPendingPerPChannel = 16 << 20
	// DefaultPendingWait is how long an append waits for room before it
	// fails with streamwal.ErrResourceExhausted.
	DefaultPendingWait = 5 * time.Second
)

// options are the client's settings.
type options struct {
	cluster     streamwal.Cluster
	registry    *messages.Registry
	timeout     time.Duration
	maxBatch    int
	maxInFlight int
	linger      time.Duration
	retryMax    time.Duration
	maxPending  int // bytes held over all PChannels
	maxPerPChan int // bytes held for one PChannel
	pendingWait time.Duration
	local       Local
	logger      zerolog.Logger
	natsOpts    []nats.Option
	hooks       telemetry.Hooks
}

// Option configures a client.
type Option func(*options)

// WithHooks adds telemetry hooks (package telemetry) that receive the
// client's events: each append request (telemetry.ClientRequestHook),
// each Append call, transaction and Broadcast call, each message sent
// (telemetry.InjectHook: what its headers carry) and each message read
// (telemetry.ConsumeHook). Package telemetry/oteltrace turns them into
// OpenTelemetry spans (see WithTracerProvider).
func WithHooks(hooks ...telemetry.Hook) Option {
	return func(o *options) { o.hooks = append(o.hooks, hooks...) }
}

// WithCluster names the streamwal cluster (default "local").
func WithCluster(c streamwal.Cluster) Option { return func(o *options) { o.cluster = c } }

// WithRegistry sets the message types (default: the built-ins).
func WithRegistry(r *messages.Registry) Option { return func(o *options) { o.registry = r } }

// WithTimeout bounds one request to a node or the coordinator (default
// 5 s); while append requests to a PChannel time out, its next requests
// get up to 4 times as long (see the package doc). The caller's context
// bounds the whole call, retries included.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithMaxBatch bounds the messages coalesced into one append request.
func WithMaxBatch(n int) Option { return func(o *options) { o.maxBatch = n } }

// WithMaxInFlight bounds the append requests in flight per PChannel.
func WithMaxInFlight(n int) Option { return func(o *options) { o.maxInFlight = n } }

// WithLinger bounds how long appends wait for company while a request to
// their PChannel is already in flight (default 1 ms). An append to a
// PChannel with nothing in flight goes out at once, and a full batch never
// waits; 0 sends whatever is queued as soon as a request may go.
func WithLinger(d time.Duration) Option { return func(o *options) { o.linger = d } }

// WithMaxPending bounds the bytes of appends the client holds, queued or
// in flight until answered, over all PChannels (default 128 MiB, counted
// as each message's size in a request plus about 1 KiB for what the
// client keeps of it): under more load than the nodes absorb, appends
// wait for room (see WithPendingWait) instead of queueing without bound.
// A call larger than the bound goes alone when nothing else is held.
func WithMaxPending(bytes int) Option { return func(o *options) { o.maxPending = bytes } }

// WithMaxPendingPerPChannel bounds, as WithMaxPending, the bytes held for
// one PChannel (default 16 MiB), so that one slow PChannel cannot take
// the whole client's room.
func WithMaxPendingPerPChannel(bytes int) Option { return func(o *options) { o.maxPerPChan = bytes } }

// WithPendingWait bounds how long an append (Append, AppendAsync, a
// transaction's message) waits for room under the client's
// pending bounds (default 5 s; 0 refuses at once): past it, the call
// fails with streamwal.ErrResourceExhausted and nothing of it was sent.
// The caller's context bounds the wait too.
func WithPendingWait(d time.Duration) Option { return func(o *options) { o.pendingWait = d } }

// WithRetryMaxInterval caps the backoff between retries (default 1 s).
func WithRetryMaxInterval(d time.Duration) Option { return func(o *options) { o.retryMax = d } }

// WithLogger sets the logger of retries and reads (default: none).
func WithLogger(l zerolog.Logger) Option { return func(o *options) { o.logger = l } }

// WithTracerProvider traces the client's work into tp: it is
// WithHooks(oteltrace.New(tp)), the OpenTelemetry adapter on the client's
// hooks (package telemetry/oteltrace). Each Append call is a
// wal.autocommit span with wal.dist_append within it, each transaction a
// wal.txn span, each Broadcast a wal.broadcast span, each message read a
// wal.dist_consume span linked to its producer's; every message sent
// carries the context it was sent in (W3C traceparent), for the nodes to
// continue. Without it (nor another hook) the client traces nothing and
// carries no trace context.
func WithTracerProvider(tp trace.TracerProvider) Option { return WithHooks(oteltrace.New(tp)) }

// WithNATSOptions adds options to the connection Connect opens
// (credentials, TLS, reconnect settings, ...), applied after Connect's own
// defaults (reconnect forever, name "streamwal-client") so that they may
// override them. New ignores them: its connection is the caller's.
func WithNATSOptions(opts ...nats.Option) Option {
	return func(o *options) { o.natsOpts = append(o.natsOpts, opts...) }
}

// Client is a connection to a streamwal cluster. It is safe for concurrent
// use.
type Client struct {
	nc      *nats.Conn
	ownsNC  bool
	opts    options
	codec   *messages.Codec
	backend *jetstream.JetStream

	pending *admit.Gate[streamwal.PChannel] // the bytes of appends held

	mu       sync.Mutex
	batchers map[streamwal.PChannel]*batcher
	subsKV   njs.KeyValue // the subscriptions bucket, once opened
	subs     map[*Subscription]struct{}
	closed   bool
	wg       sync.WaitGroup
}

// Connect dials a NATS URL (or several, comma-separated) and returns a
// client that closes the connection when it is closed. WithNATSOptions
// adds options to the connection.
func Connect(url string, opts ...Option) (*Client, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	natsOpts := append([]nats.Option{nats.MaxReconnects(-1), nats.Name("streamwal-client")}, o.natsOpts...)
	nc, err := nats.Connect(url, natsOpts...)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "connect %s: %v", url, err)
	}
	c, err := New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.ownsNC = true
	return c, nil
}

// New returns a client on an existing connection, which stays the
// caller's.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	o := options{cluster: DefaultCluster, timeout: DefaultTimeout, maxBatch: DefaultMaxBatch,
		maxInFlight: DefaultMaxInFlight, linger: DefaultLinger, retryMax: time.Second, logger: zerolog.Nop(),
		maxPending: DefaultMaxPending, maxPerPChan: DefaultMaxPendingPerPChannel, pendingWait: DefaultPendingWait}
	for _, f := range opts {
		f(&o)
	}
	if nc == nil {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "client needs a connection")
	}
	if o.timeout <= 0 || o.maxBatch <= 0 || o.maxInFlight <= 0 || o.retryMax <= 0 || o.linger < 0 {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "client timeout, batch, in-flight and retry bounds must be positive and the linger not negative")
	}
	if o.maxPending <= 0 || o.maxPerPChan <= 0 || o.pendingWait < 0 {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "client pending bounds must be positive and the pending wait not negative")
	}
	codec, err := messages.NewCodec(o.cluster, o.registry)
	if err != nil {
		return nil, err
	}
	// Archive: reads that start below a stream's truncation point go on
	// in the archive the nodes keep of what they truncated.
	be, err := jetstream.New(nc, codec, jetstream.Options{Logger: o.logger, Archive: true})
	if err != nil {
		return nil, err
	}
	return &Client{nc: nc, opts: o, codec: codec, backend: be, batchers: map[streamwal.PChannel]*batcher{},
		pending: admit.New[streamwal.PChannel](int64(o.maxPending), int64(o.maxPerPChan))}, nil
}

// Codec builds the messages to append (codec.New, codec.NewBody, ...).
func (c *Client) Codec() *messages.Codec { return c.codec }

// Cluster is the cluster the client talks to.
func (c *Client) Cluster() streamwal.Cluster { return c.opts.cluster }

// Close stops the client: appends still queued fail with
// streamwal.ErrClosed, and the connection is closed if Connect opened it.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	bs := c.batchers
	c.batchers = map[streamwal.PChannel]*batcher{}
	subs := c.subs
	c.subs = nil
	c.mu.Unlock()
	for s := range subs {
		_ = s.Close()
	}
	for _, b := range bs {
		b.close()
	}
	c.wg.Wait()
	_ = c.backend.Close()
	if c.ownsNC {
		c.nc.Close()
	}
	return nil
}

// errClosed refuses work after Close.
func errClosed() error { return streamwal.Errorf(streamwal.CodeClosed, "client is closed") }

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
