package client

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
	"github.com/streamwal/streamwal/telemetry"
)

// BroadcastRequest is a message of a broadcast type for several channels.
type BroadcastRequest struct {
	Type *messages.Type
	// VChannels are the VChannel targets; the coordinator adds the
	// CChannel where the type takes it, and every PChannel for a cluster
	// barrier (leave VChannels empty then).
	VChannels []streamwal.VChannel
	// Scope names what the resource keys are about.
	Scope messages.KeyScope
	// Payload, or Body for the built-in types with a JSON body.
	Payload []byte
	Body    any
	// IdempotencyKey makes a retry (by this client or any other) return
	// the original's result; when empty the client makes one up, so that
	// its own retries are safe.
	IdempotencyKey string
	// AppendFirst is a VChannel target appended before every other.
	AppendFirst streamwal.VChannel
}

// BroadcastResult is the broadcast's ID and where each target's replica
// landed, by target name.
type BroadcastResult struct {
	ID       uint64
	Appended map[string]AppendResult
}

// Broadcast runs a broadcast through the coordinator, retrying through a
// coordinator takeover until ctx ends.
func (c *Client) Broadcast(ctx context.Context, req BroadcastRequest) (BroadcastResult, error) {
	ctx = c.opts.hooks.OnBroadcastCallStart(ctx, telemetry.BroadcastCallEvent{Type: req.Type, VChannels: req.VChannels})
	res, err := c.broadcast(ctx, req)
	c.opts.hooks.OnBroadcastCallEnd(ctx, telemetry.BroadcastCallEndEvent{ID: res.ID, Err: err})
	return res, err
}

// broadcast runs a broadcast under ctx (which the hooks made).
func (c *Client) broadcast(ctx context.Context, req BroadcastRequest) (BroadcastResult, error) {
	if req.Type == nil {
		return BroadcastResult{}, streamwal.Errorf(streamwal.CodeInvalidArgument, "broadcast without a type")
	}
	payload := req.Payload
	if req.Body != nil {
		var err error
		if payload, err = messages.MarshalBody(req.Type, req.Body); err != nil {
			return BroadcastResult{}, err
		}
	}
	key := req.IdempotencyKey
	if key == "" {
		key = "c-" + nuid.Next()
	}
	wreq := wire.BroadcastRequest{Type: req.Type.Name, Payload: payload, IdempotencyKey: key,
		DBName: req.Scope.DBName, CollectionName: req.Scope.CollectionName, SnapshotName: req.Scope.SnapshotName}
	for _, v := range req.VChannels {
		wreq.VChannels = append(wreq.VChannels, v.String())
	}
	if !req.AppendFirst.IsZero() {
		wreq.AppendFirst = req.AppendFirst.String()
	}
	wreq.TraceParent, wreq.TraceState = c.traceContext(ctx, req.Type)
	var reply wire.BroadcastReply
	if err := c.callCoord(ctx, streamwal.CoordBroadcast, wreq, &reply); err != nil {
		return BroadcastResult{}, err
	}
	out := BroadcastResult{ID: reply.ID, Appended: map[string]AppendResult{}}
	for name, r := range reply.Appended {
		out.Appended[name] = resultOf(r)
	}
	return out, nil
}

// AckBroadcast acknowledges a target of an AckSyncUp broadcast
// (TruncateCollection, FlushAll) from the consuming side.
func (c *Client) AckBroadcast(ctx context.Context, id uint64, target string) error {
	return c.callCoord(ctx, streamwal.CoordBroadcastAck, wire.BroadcastAckRequest{ID: id, Target: target}, nil)
}

// callCoord calls the active coordinator, retrying retriable errors (a
// takeover in progress) with backoff until ctx ends. Every coordinator
// call the client makes is idempotent.
func (c *Client) callCoord(ctx context.Context, op streamwal.CoordOp, req, reply any) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 20*time.Millisecond, c.opts.retryMax
	subject := c.opts.cluster.CoordSubject(op)
	for {
		callCtx, cancel := context.WithTimeout(ctx, c.callTimeout(op))
		err := wire.Call(callCtx, c.nc, subject, req, reply)
		cancel()
		if err == nil || !streamwal.IsRetriable(err) {
			return err
		}
		if sleep(ctx, b.NextBackOff()) != nil {
			if op == streamwal.CoordBroadcast && !errors.Is(err, nats.ErrNoResponders) {
				// The coordinator may have taken it and go on with it.
				return streamwal.Errorf(streamwal.CodeUnknownOutcome, "broadcast in flight when the caller gave up: %w", err)
			}
			return err
		}
	}
}

// callTimeout bounds one coordinator request: a broadcast may wait for
// other broadcasts' keys and for its callback, so it gets the caller's
// whole deadline.
func (c *Client) callTimeout(op streamwal.CoordOp) time.Duration {
	if op == streamwal.CoordBroadcast || op == streamwal.CoordBroadcastAck {
		return time.Hour
	}
	return c.opts.timeout
}

// Collection names a collection and its shape.
type Collection struct {
	DBName string
	Name   string
	// ID identifies the collection in the cluster (positive).
	ID int64
	// Shards is its VChannel count (default 1).
	Shards int
	// Partitions are the partitions it starts with.
	Partitions []int64
	// Schema is the application's schema document, kept verbatim.
	Schema json.RawMessage
	// IdempotencyKey, if set, makes a retry of the DDL call it is passed
	// to (by any client) return the original's result; by default each
	// call makes up its own, which covers the client's own retries.
	IdempotencyKey string
}

// ref is the collection's reference in lifecycle bodies.
func (col Collection) ref() messages.CollectionRef {
	return messages.CollectionRef{DBName: col.DBName, CollectionName: col.Name, CollectionID: col.ID}
}

// scope is the collection's resource-key scope.
func (col Collection) scope() messages.KeyScope {
	return messages.KeyScope{DBName: col.DBName, CollectionName: col.Name}
}

// VChannels allocates (or returns, when it exists) the collection's
// VChannels.
func (c *Client) VChannels(ctx context.Context, col Collection) ([]streamwal.VChannel, error) {
	shards := col.Shards
	if shards == 0 {
		shards = 1
	}
	reply, err := c.allocate(ctx, wire.AllocateRequest{CollectionID: col.ID, Shards: shards, DBName: col.DBName, Name: col.Name})
	if err != nil {
		return nil, err
	}
	return parseVChannels(reply.VChannels)
}

// lookup returns the VChannels of an allocated collection, allocating
// nothing. A collection without VChannels was dropped (dropped is true)
// or never created.
func (c *Client) lookup(ctx context.Context, col Collection) (vs []streamwal.VChannel, dropped bool, err error) {
	reply, err := c.allocate(ctx, wire.AllocateRequest{CollectionID: col.ID, Lookup: true, DBName: col.DBName, Name: col.Name})
	if err != nil {
		return nil, false, err
	}
	vs, err = parseVChannels(reply.VChannels)
	return vs, reply.Dropped, err
}

// allocate asks the coordinator for a collection's VChannels.
func (c *Client) allocate(ctx context.Context, req wire.AllocateRequest) (wire.AllocateReply, error) {
	var reply wire.AllocateReply
	err := c.callCoord(ctx, streamwal.CoordAllocate, req, &reply)
	return reply, err
}

// notFound is the error of a DDL on a collection that was never created.
func notFound(col Collection) error {
	return streamwal.Errorf(streamwal.CodeLifecycle, "collection %d: %w", col.ID, streamwal.ErrCollectionNotFound)
}

// parseVChannels parses VChannel names.
func parseVChannels(names []string) ([]streamwal.VChannel, error) {
	out := make([]streamwal.VChannel, len(names))
	for i, name := range names {
		v, err := streamwal.ParseVChannel(name)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// CreateCollection allocates the collection's VChannels and broadcasts its
// CreateCollection to them and the CChannel; it returns the VChannels.
// Creating a collection that exists succeeds (so a retry is safe); one
// that was dropped is refused (streamwal.ErrLifecycle): IDs are never
// reused.
func (c *Client) CreateCollection(ctx context.Context, col Collection) ([]streamwal.VChannel, error) {
	vs, err := c.VChannels(ctx, col)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = v.String()
	}
	body := messages.CreateCollectionBody{CollectionRef: col.ref(), PartitionIDs: col.Partitions, VChannels: names, Schema: col.Schema}
	_, err = c.Broadcast(ctx, BroadcastRequest{Type: messages.TypeCreateCollection, VChannels: vs, Scope: col.scope(),
		Body: body, IdempotencyKey: col.IdempotencyKey, AppendFirst: vs[0]})
	if errors.Is(err, streamwal.ErrCollectionExists) {
		return vs, nil // created before (a retry): creating is idempotent
	}
	return vs, err
}

// DropCollection broadcasts the collection's DropCollection; its
// VChannels are then released. Dropping a collection that was dropped
// does nothing, unless its IdempotencyKey names an earlier drop, whose
// result it returns; dropping one that was never created is refused
// (streamwal.ErrLifecycle, collection not found).
func (c *Client) DropCollection(ctx context.Context, col Collection) error {
	vs, dropped, err := c.lookup(ctx, col)
	if err != nil {
		return err
	}
	switch {
	case len(vs) > 0:
	case !dropped:
		return notFound(col)
	case col.IdempotencyKey == "":
		return nil // dropped before: nothing to drop
	}
	req := BroadcastRequest{Type: messages.TypeDropCollection, VChannels: vs, Scope: col.scope(),
		Body: messages.DropCollectionBody{CollectionRef: col.ref()}, IdempotencyKey: col.IdempotencyKey}
	if len(vs) > 0 {
		req.AppendFirst = vs[0]
	}
	_, err = c.Broadcast(ctx, req)
	return err
}

// CreatePartition broadcasts a CreatePartition of the collection. Creating
// a partition that exists succeeds; one that was dropped is refused.
func (c *Client) CreatePartition(ctx context.Context, col Collection, partition int64) error {
	return c.partition(ctx, messages.TypeCreatePartition, col, partition)
}

// DropPartition broadcasts a DropPartition of the collection.
func (c *Client) DropPartition(ctx context.Context, col Collection, partition int64) error {
	return c.partition(ctx, messages.TypeDropPartition, col, partition)
}

// partition broadcasts a partition DDL.
func (c *Client) partition(ctx context.Context, t *messages.Type, col Collection, partition int64) error {
	vs, dropped, err := c.lookup(ctx, col)
	if err != nil {
		return err
	}
	if dropped {
		return streamwal.Errorf(streamwal.CodeLifecycle, "collection %d: %w", col.ID, streamwal.ErrCollectionDropped)
	}
	if len(vs) == 0 {
		return notFound(col)
	}
	_, err = c.Broadcast(ctx, BroadcastRequest{Type: t, VChannels: vs, Scope: col.scope(),
		Body:           messages.PartitionBody{CollectionRef: col.ref(), PartitionID: partition},
		IdempotencyKey: col.IdempotencyKey, AppendFirst: vs[0]})
	if t == messages.TypeCreatePartition && errors.Is(err, streamwal.ErrPartitionExists) {
		return nil // created before (a retry): creating is idempotent
	}
	return err
}
