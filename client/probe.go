package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/services/wire"
)

// messageHeadroom is what a message's subject and headers may take of an
// append request beside its payload (the built-in headers take a few
// hundred bytes; application properties the rest).
const messageHeadroom = 8 << 10

// MaxPayload is the largest payload one appended message may carry: the
// codec's limit, or less where the connection's maximum payload (the
// server's max_payload) leaves less room in an append request.
func (c *Client) MaxPayload() int {
	return min(c.codec.MaxPayload(), c.requestBudget()-messageHeadroom)
}

// Server is the URL of the server the client is connected to, without
// credentials ("" while it is not connected).
func (c *Client) Server() string { return c.nc.ConnectedUrlRedacted() }

// Ping checks that a coordinator answers for the client's cluster. If
// nobody answers and the server has no cluster of that name (its
// coordinator's lease bucket does not exist: a mistyped cluster name, or
// the wrong server), it fails at once with streamwal.ErrUnavailable,
// naming the cluster, the server and the clusters the server has;
// otherwise (a coordinator starting, or a takeover in progress) it asks
// again until one answers or ctx ends, and then fails with
// streamwal.ErrUnavailable naming the cluster and the server.
func (c *Client) Ping(ctx context.Context) error {
	subject := c.opts.cluster.CoordSubject(streamwal.CoordStatus)
	callCtx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	err := wire.Call(callCtx, c.nc, subject, struct{}{}, nil)
	cancel()
	if err == nil || !streamwal.IsRetriable(err) {
		return err
	}
	if denied := wire.Denied(c.nc, func(s string) bool { return s == subject }); denied != nil {
		return streamwal.Errorf(streamwal.CodePermissionDenied, "cluster %q on %s: these credentials may not make its requests (are they for another cluster?): %w",
			c.opts.cluster, c.Server(), denied)
	}
	if errors.Is(err, nats.ErrNoResponders) {
		if missing, others := c.clusterMissing(ctx); missing {
			return streamwal.Errorf(streamwal.CodeUnavailable, "no coordinator answers for cluster %q on %s: the server has no streamwal cluster of that name (%s)",
				c.opts.cluster, c.Server(), describeClusters(others))
		}
	}
	if err := c.callCoord(ctx, streamwal.CoordStatus, struct{}{}, nil); err != nil {
		if streamwal.CodeOf(err) == streamwal.CodeUnavailable || ctx.Err() != nil {
			return streamwal.Errorf(streamwal.CodeUnavailable, "no coordinator answers for cluster %q on %s (is one running?): %v",
				c.opts.cluster, c.Server(), err)
		}
		return err
	}
	return nil
}

// clusterMissing reports whether the server has no bucket of the
// cluster's coordinator lease, with the clusters it has. Any other
// answer, or none within the client's timeout (say, the user may not look
// at buckets), counts as not missing: only a certain absence fails fast.
func (c *Client) clusterMissing(ctx context.Context) (bool, []streamwal.Cluster) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	js, err := njs.New(c.nc)
	if err != nil {
		return false, nil
	}
	_, err = js.KeyValue(ctx, c.opts.cluster.BucketName(streamwal.BucketLeader))
	switch {
	case errors.Is(err, njs.ErrBucketNotFound):
	case errors.Is(err, njs.ErrJetStreamNotEnabled), errors.Is(err, njs.ErrJetStreamNotEnabledForAccount):
		return true, nil
	default:
		return false, nil
	}
	var others []streamwal.Cluster
	names := js.KeyValueStoreNames(ctx)
	for name := range names.Name() {
		if cl, ok := streamwal.ClusterOfBucket(name, streamwal.BucketLeader); ok {
			others = append(others, cl)
		}
	}
	slices.Sort(others)
	return true, others
}

// describeClusters says which clusters a server has.
func describeClusters(cs []streamwal.Cluster) string {
	if len(cs) == 0 {
		return "it has none"
	}
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = fmt.Sprintf("%q", c)
	}
	return "it has " + strings.Join(names, ", ")
}
