package messages_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/messages"
)

// BenchmarkEncodeInsert encodes a stamped 1 KiB insert, as the client does
// for every message it sends and the writer for every message it stores.
func BenchmarkEncodeInsert(b *testing.B) {
	c := newCodec(b)
	m, err := c.New(messages.TypeInsert, vch(b, 3, 1), make([]byte, 1024))
	require.NoError(b, err)
	m.SetTimeTick(mustTick(b, 1_764_000_000_000, 7))
	m.SetLastConfirmed(123_456)
	m.SetTerm(1)
	require.NoError(b, m.SetMsgID("c-M4aTLP0d5wWbxjGuOZqeFx"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Encode(m); err != nil {
			b.Fatal(err)
		}
	}
}
