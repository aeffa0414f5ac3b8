package jetstream

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// FuzzAckSequence: ackSequence reads the stream sequence nats.go's
// metadata parser reads, or declines.
func FuzzAckSequence(f *testing.F) {
	for _, s := range []string{
		"$JS.ACK.WAL_bench_pchan-0.M4aTLP0d5wWbxjGuOZqeIH_1.1.4.4.1795982876962222551.2",
		"$JS.ACK.dom.acc.S.C.1.42.42.1795982876962222551.0.rnd",
		"$JS.ACK.S.C.1.4x2.42.1.0", "$JS.ACK.S.C.1..42.1.0", "$JS.ACK.S.C.1.42.42.1", "$JS.ACK.S.C.1.18446744073709551616.1.1.0",
		"$JS.ACK.S.C.1.٤٢.1.1.0", "$JS.NAK.S.C.1.42.42.1.0", "", ".........",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, reply string) {
		seq, ok := ackSequence(reply)
		if !ok {
			return
		}
		meta, err := (&nats.Msg{Reply: reply, Sub: &nats.Subscription{}}).Metadata()
		if err != nil {
			t.Fatalf("ackSequence(%q) = %d, but nats.go refuses it: %v", reply, seq, err)
		}
		if meta.Sequence.Stream != seq {
			t.Fatalf("ackSequence(%q) = %d, nats.go reads %d", reply, seq, meta.Sequence.Stream)
		}
	})
}
