package replicate

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/messages"
	"github.com/streamwal/streamwal/services/wire"
)

// Collections is this cluster's coordinator, told of the collections
// that replicated DDL creates and drops, so that its VChannel allocation
// follows the primary's (see the package doc).
type Collections interface {
	// Adopt gives a collection exactly the VChannels req.Adopt names.
	Adopt(ctx context.Context, req wire.AllocateRequest) error
	// Release forgets a dropped collection's VChannels.
	Release(ctx context.Context, id int64) error
}

// coordTimeout bounds one request to the coordinator.
const coordTimeout = 5 * time.Second

// Coordinator is the Collections of cluster c's coordinator, reached on
// nc (the node's connection).
func Coordinator(nc *nats.Conn, c streamwal.Cluster) Collections {
	return coordinator{nc: nc, c: c}
}

// coordinator asks the coordinator through its request subjects.
type coordinator struct {
	nc *nats.Conn
	c  streamwal.Cluster
}

// Adopt implements Collections.
func (co coordinator) Adopt(ctx context.Context, req wire.AllocateRequest) error {
	ctx, cancel := context.WithTimeout(ctx, coordTimeout)
	defer cancel()
	var reply wire.AllocateReply
	if err := wire.Call(ctx, co.nc, co.c.CoordSubject(streamwal.CoordAllocate), req, &reply); err != nil {
		return fmt.Errorf("coordinator of %s: adopt collection %d: %w", co.c, req.CollectionID, err)
	}
	return nil
}

// Release implements Collections.
func (co coordinator) Release(ctx context.Context, id int64) error {
	ctx, cancel := context.WithTimeout(ctx, coordTimeout)
	defer cancel()
	if err := wire.Call(ctx, co.nc, co.c.CoordSubject(streamwal.CoordRelease), wire.ReleaseRequest{CollectionID: id}, nil); err != nil {
		return fmt.Errorf("coordinator of %s: release collection %d: %w", co.c, id, err)
	}
	return nil
}

// learn tells the coordinator of the collections that the DDL of batch
// creates and drops, where it is to be appended (units[i] not nil),
// before it is (so at least once: the
// coordinator takes a repeat as done). Only the copy on the control
// channel is told, once per DDL, with the VChannels renamed onto this
// cluster's PChannels of the same index.
func (r *replicator) learn(ctx context.Context, batch []delivery, units [][]*messages.MutableMessage) error {
	if r.cfg.Collections == nil {
		return nil
	}
	for i, d := range batch {
		if units[i] == nil || !d.m.VChannel().IsControl() {
			continue
		}
		var err error
		switch d.m.Type() {
		case messages.TypeCreateCollection:
			err = r.adopt(ctx, d.m)
		case messages.TypeDropCollection:
			var body messages.DropCollectionBody
			if err = d.m.Body(&body); err == nil {
				err = r.cfg.Collections.Release(ctx, body.CollectionID)
			}
		}
		if err != nil {
			return fmt.Errorf("replicated %s %d: %w", d.m.Type(), d.m.ID(), err)
		}
	}
	return nil
}

// adopt tells the coordinator of the collection m creates.
func (r *replicator) adopt(ctx context.Context, m *messages.ImmutableMessage) error {
	var body messages.CreateCollectionBody
	if err := m.Body(&body); err != nil {
		return err
	}
	req := wire.AllocateRequest{CollectionID: body.CollectionID, DBName: body.DBName, Name: body.CollectionName}
	for _, name := range body.VChannels {
		v, err := r.local(name)
		if err != nil {
			return err
		}
		req.Adopt = append(req.Adopt, v.String())
	}
	if len(req.Adopt) == 0 {
		return nil
	}
	return r.cfg.Collections.Adopt(ctx, req)
}

// local is the VChannel of this cluster that the source's VChannel name
// replicates into: the same collection and shard, on the PChannel of
// the same index.
func (r *replicator) local(name string) (streamwal.VChannel, error) {
	v, err := streamwal.ParseVChannel(name)
	if err != nil {
		return streamwal.VChannel{}, err
	}
	p, err := streamwal.NewPChannel(r.p.Prefix(), v.PChannel().Index())
	if err != nil {
		return streamwal.VChannel{}, err
	}
	return p.VChannel(v.CollectionID(), v.Shard())
}
