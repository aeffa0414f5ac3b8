package coord

import (
	"context"
	"sync"
	"testing"
	"time"

	njs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
)

// TestProvisionConcurrentlyOnACluster provisions a new cluster's buckets
// at 3 replicas from two coordinators at once, connected to different
// servers of a three-server cluster, as two `streamwal coord` started
// together do: both finish, and every bucket has 3 replicas. (nats-server
// 2.15.2 often answers neither of two equal creations of one replicated
// stream that arrive together, though it creates the stream; without a
// retry, both coordinators waited out their start timeout.) Provisioning
// the same buckets at 1 replica afterwards is refused.
func TestProvisionConcurrentlyOnACluster(t *testing.T) {
	cl := embedded.StartTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	urls := cl.ClientURLs()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	took := make([]time.Duration, 2)
	for i := range errs {
		nc := connect(t, cl.Servers()[i+1].Connect)
		require.Equal(t, cl.Servers()[i+1].ClientURL(), urls[i+1])
		js, err := njs.New(nc)
		require.NoError(t, err)
		wg.Go(func() {
			start := time.Now()
			_, errs[i] = Provision(ctx, js, "prov", 3, DefaultLeaseTTL)
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	t.Logf("provisioned in %v", took)
	for i, err := range errs {
		require.NoError(t, err, "coordinator %d", i)
	}
	nc := connect(t, cl.Connect)
	js, err := njs.New(nc)
	require.NoError(t, err)
	for _, b := range streamwal.Buckets {
		kv, err := js.KeyValue(ctx, streamwal.Cluster("prov").BucketName(b))
		require.NoError(t, err)
		st, err := kv.Status(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, st.(*njs.KeyValueBucketStatus).StreamInfo().Config.Replicas, "bucket %s", b)
	}
	// A coordinator started with the default of 1 replica on this cluster
	// is refused, and scales nothing down.
	_, err = Provision(ctx, js, "prov", 1, DefaultLeaseTTL)
	require.ErrorIs(t, err, streamwal.ErrInvalidArgument)
	require.Contains(t, err.Error(), "has 3 replicas and this coordinator runs with 1")
	for _, b := range streamwal.Buckets {
		kv, err := js.KeyValue(ctx, streamwal.Cluster("prov").BucketName(b))
		require.NoError(t, err)
		st, err := kv.Status(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, st.(*njs.KeyValueBucketStatus).StreamInfo().Config.Replicas, "bucket %s after a refused scale-down", b)
	}
}
