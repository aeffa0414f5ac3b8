package jetstream

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"
	"pgregory.net/rapid"
)

// TestParseAckFastAgreesWithJSON: the fast path decodes exactly what
// encoding/json decodes, or declines.
func TestParseAckFastAgreesWithJSON(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := batchReply{
			Stream:    rapid.StringMatching(`[A-Z_a-z0-9-]{1,20}`).Draw(t, "stream"),
			Seq:       rapid.Uint64().Draw(t, "seq"),
			Count:     rapid.Uint64Range(0, 1000).Draw(t, "count"),
			Duplicate: rapid.Bool().Draw(t, "dup"),
		}
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		slow := parseAck(7, &nats.Msg{Data: data})
		fast, ok := parseAckFast(7, data)
		if !ok {
			if !r.Duplicate {
				t.Fatalf("fast path declined a plain ack %s", data)
			}
			return
		}
		if fast != slow {
			t.Fatalf("fast %+v != json %+v for %s", fast, slow, data)
		}
	})
	// The server's own bytes for a duplicate (note the space).
	dup := []byte(`{"stream":"WAL_c_p-0","seq":5, "duplicate": true}`)
	if _, ok := parseAckFast(1, dup); ok {
		t.Fatal("fast path must leave duplicates to encoding/json")
	}
	if a := parseAck(1, &nats.Msg{Data: dup}); !a.Duplicate || a.Seq != 5 {
		t.Fatalf("duplicate ack parsed as %+v", a)
	}
	for _, data := range []string{
		`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"},"stream":"S","seq":0}`,
		`{"stream":"S"}`, `not json`, ``,
	} {
		if _, ok := parseAckFast(1, []byte(data)); ok {
			t.Errorf("fast path accepted %q", data)
		}
	}
}
