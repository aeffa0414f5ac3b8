package faulty_test

import (
	"testing"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/embedded"
	"github.com/streamwal/streamwal/jetstream"
	"github.com/streamwal/streamwal/jetstream/conformance"
	"github.com/streamwal/streamwal/jetstream/faulty"
	"github.com/streamwal/streamwal/messages"
)

// TestConformancePassThrough runs the conformance suite over faulty
// backends that let everything through, around the JetStream backend:
// the wrapper, its writers, their futures and its scanners are faithful.
// To keep it short, it leaves out what the wrapper only passes on and the
// backend's own runs cover at length (jetstream's TestConformance): the
// archive checks, the server restarts and dropped connections of the
// fault check, most rounds of the fencing check, and two thirds of the
// parallel appends.
func TestConformancePassThrough(t *testing.T) {
	if testing.Short() {
		t.Skip("the whole conformance suite")
	}
	srv := embedded.StartTest(t)
	codec, err := messages.NewCodec("conformance", nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := jetstream.Options{}
	connect := func(t *testing.T, opts jetstream.Options) jetstream.Backend {
		t.Helper()
		nc, err := srv.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		b, err := jetstream.New(nc, codec, opts)
		if err != nil {
			t.Fatal(err)
		}
		return faulty.New(b, faulty.Pass)
	}
	conformance.Run(t, conformance.Harness{
		New:              func(t *testing.T) jetstream.Backend { return connect(t, opts) },
		Codec:            codec,
		FenceIterations:  5,
		ParallelMessages: conformance.DefaultParallelMessages / 3,
		NewRestricted: func(t *testing.T, allowed []streamwal.PChannel) jetstream.Backend {
			o := opts
			o.PChannels = allowed
			return connect(t, o)
		},
	})
}
