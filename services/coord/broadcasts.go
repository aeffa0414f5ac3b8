package coord

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/coord/broadcast"
	"github.com/streamwal/streamwal/services/wire"
)

// startBroadcaster creates the tenure's broadcaster and resumes the
// unfinished tasks of earlier tenures.
func (t *tenure) startBroadcaster(ctx context.Context) error {
	codec, err := messages.NewCodec(t.c.cfg.Cluster, t.c.cfg.Registry)
	if err != nil {
		return err
	}
	t.bc = broadcast.New(broadcast.Config{
		Codec:    codec,
		Appender: &appender{nc: t.c.cfg.Conn, codec: codec},
		Store: &taskStore{s: newStore(t.c.buckets[streamwal.BucketBroadcast]), kv: t.c.buckets[streamwal.BucketBroadcast],
			onDeposed: t.depose},
		NewID: t.newBroadcastID,
		Callbacks: map[string]broadcast.Callback{
			messages.TypeDropCollection.Name:       t.ctl.dropCollection,
			messages.TypeAlterReplicateConfig.Name: t.replicateConfigured,
		},
		Logger: t.log,
		Hooks:  t.c.cfg.Hooks,
	})
	t.codec = codec
	return t.bc.Resume(ctx)
}

// newBroadcastID draws a broadcast ID from the oracle: unique and
// increasing across tenures.
func (t *tenure) newBroadcastID(ctx context.Context) (uint64, error) {
	reply, err := t.handleTSO(ctx, wire.TSORequest{Count: 1})
	if err != nil {
		return 0, err
	}
	return uint64(reply.First), nil
}

// runBroadcast runs a broadcast; its targets follow the type's
// dispatch, with the CChannel and the PChannels filled in here.
func (t *tenure) runBroadcast(ctx context.Context, req wire.BroadcastRequest) (wire.BroadcastReply, error) {
	typ, err := t.codec.Registry().Lookup(req.Type)
	if err != nil {
		return wire.BroadcastReply{}, err
	}
	targets, err := t.ctl.targets(typ, req.VChannels)
	if err != nil {
		return wire.BroadcastReply{}, err
	}
	if err := checkCollection(typ, req, targets); err != nil {
		return wire.BroadcastReply{}, err
	}
	if typ == messages.TypeAlterReplicateConfig {
		if err := t.checkReplicateConfig(ctx, req.Payload); err != nil {
			return wire.BroadcastReply{}, err
		}
	}
	r := broadcast.Request{Type: typ, Targets: targets, Payload: req.Payload, IdempotencyKey: req.IdempotencyKey,
		TraceParent: req.TraceParent, TraceState: req.TraceState,
		Scope: messages.KeyScope{DBName: req.DBName, CollectionName: req.CollectionName, SnapshotName: req.SnapshotName}}
	if req.AppendFirst != "" {
		if r.AppendFirst, err = streamwal.ParseVChannel(req.AppendFirst); err != nil {
			return wire.BroadcastReply{}, err
		}
	}
	res, err := t.bc.Broadcast(ctx, r)
	if err != nil {
		return wire.BroadcastReply{}, err
	}
	return wire.BroadcastReply{ID: res.ID, Appended: res.Appended}, nil
}

// handleBroadcastAck acknowledges a target of an AckSyncUp broadcast.
func (t *tenure) handleBroadcastAck(ctx context.Context, req wire.BroadcastAckRequest) (wire.None, error) {
	return wire.None{}, t.bc.Ack(ctx, req.ID, req.Target)
}

// checkCollection refuses a collection DDL whose body names another
// collection than its VChannels, or another name than its resource keys:
// one part would land (the CChannel takes anything) and the rest be
// refused, so bad input must be caught before anything is written.
func checkCollection(typ *messages.Type, req wire.BroadcastRequest, tg messages.Targets) error {
	if typ.Body == nil || len(tg.VChannels) == 0 {
		return nil
	}
	var ref messages.CollectionRef
	if json.Unmarshal(req.Payload, &ref) != nil || ref.CollectionID == 0 {
		return nil
	}
	for _, v := range tg.VChannels {
		if v.CollectionID() != ref.CollectionID {
			return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s of collection %d targets %s", typ, ref.CollectionID, v)
		}
	}
	if req.CollectionName != "" && ref.CollectionName != "" && (req.CollectionName != ref.CollectionName || req.DBName != ref.DBName) {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "%s names %s.%s but its keys %s.%s", typ, ref.DBName, ref.CollectionName, req.DBName, req.CollectionName)
	}
	return nil
}

// targets builds a broadcast's targets from its type's dispatch.
func (ctl *control) targets(typ *messages.Type, vchannels []string) (messages.Targets, error) {
	var tg messages.Targets
	for _, name := range vchannels {
		v, err := streamwal.ParseVChannel(name)
		if err != nil {
			return tg, err
		}
		tg.VChannels = append(tg.VChannels, v)
	}
	switch typ.Dispatch {
	case messages.DispatchVChannelsAndCChannel, messages.DispatchCChannel:
		c, err := streamwal.ParseVChannel(ctl.alloc.CChannel)
		if err != nil {
			return tg, err
		}
		tg.CChannel = c
	case messages.DispatchAllPChannels:
		for _, name := range ctl.names {
			p, err := streamwal.ParsePChannel(name)
			if err != nil {
				return tg, err
			}
			tg.PChannels = append(tg.PChannels, p)
		}
	}
	return tg, nil
}

// dropCollection is DropCollection's callback: the collection's VChannels
// leave the allocation.
func (ctl *control) dropCollection(ctx context.Context, task *broadcast.Task) error {
	var body messages.DropCollectionBody
	if err := jsonDecode(task.Payload, &body); err != nil {
		return err
	}
	var err error
	if cerr := ctl.call(ctx, func() { err = ctl.release(body.CollectionID) }); cerr != nil {
		return cerr
	}
	return err
}

// appender appends broadcast replicas through the owners' append subjects.
type appender struct {
	nc    wire.Requester
	codec *messages.Codec
}

// Append implements broadcast.Appender.
func (a *appender) Append(ctx context.Context, m *messages.MutableMessage) (wire.AppendResult, error) {
	nm, err := a.codec.Encode(m)
	if err != nil {
		return wire.AppendResult{}, err
	}
	req := wire.AppendRequest{Messages: []wire.Message{{Subject: nm.Subject, Header: nm.Header, Data: nm.Data}}}
	var reply wire.AppendReply
	if err := wire.Call(ctx, a.nc, a.codec.Cluster().AppendSubject(m.PChannel()), req, &reply); err != nil {
		return wire.AppendResult{}, err
	}
	if len(reply.Results) != 1 {
		return wire.AppendResult{}, streamwal.Errorf(streamwal.CodeInternal, "append reply with %d results", len(reply.Results))
	}
	res := reply.Results[0]
	return res, res.Error.Err()
}

// taskStore keeps broadcast tasks in the broadcast bucket.
type taskStore struct {
	s         *store
	kv        njs.KeyValue
	onDeposed func()
}

// Save implements broadcast.Store. A refused write deposes the tenure, so
// that the broadcaster stops with it and the successor resumes the task.
func (ts *taskStore) Save(ctx context.Context, t *broadcast.Task) error {
	err := ts.s.put(ctx, streamwal.BroadcastTaskKey(t.ID), t)
	if errors.Is(err, errDeposed) && ts.onDeposed != nil {
		ts.onDeposed()
	}
	return err
}

// List implements broadcast.Store.
func (ts *taskStore) List(ctx context.Context) ([]*broadcast.Task, error) {
	keys, err := ts.kv.ListKeys(ctx)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeUnavailable, "list broadcast tasks: %v", err)
	}
	defer func() { _ = keys.Stop() }()
	var out []*broadcast.Task
	for key := range keys.Keys() {
		if !strings.HasPrefix(key, streamwal.BroadcastTaskPrefix) {
			continue
		}
		t := &broadcast.Task{}
		found, err := ts.s.load(ctx, key, t)
		if err != nil {
			return nil, err
		}
		if found {
			out = append(out, t)
		}
	}
	return out, nil
}

// Delete implements broadcast.Store.
func (ts *taskStore) Delete(ctx context.Context, id uint64) error {
	return ts.s.delete(ctx, streamwal.BroadcastTaskKey(id))
}

// jsonDecode decodes a JSON body.
func jsonDecode(data []byte, out any) error {
	if err := json.Unmarshal(data, out); err != nil {
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "decode body: %v", err)
	}
	return nil
}
