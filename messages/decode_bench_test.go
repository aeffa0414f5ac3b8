package messages_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/streamwal/streamwal/messages"
)

// stampedInsert is a 1 KiB insert as the WAL hands it to the writer.
func stampedInsert(tb testing.TB, c *messages.Codec) *messages.MutableMessage {
	m, err := c.New(messages.TypeInsert, vch(tb, 3, 1), make([]byte, 1024))
	require.NoError(tb, err)
	m.SetTimeTick(mustTick(tb, 1_764_000_000_000, 7))
	m.SetLastConfirmed(123_456)
	m.SetTerm(1)
	require.NoError(tb, m.SetMsgID("c-M4aTLP0d5wWbxjGuOZqeFx"))
	return m
}

// storedInsert is a 1 KiB insert as a reader gets it from the stream: the
// writer's properties plus the JetStream headers the sequencer set.
func storedInsert(tb testing.TB, c *messages.Codec) *nats.Msg {
	nm, err := c.Encode(stampedInsert(tb, c))
	require.NoError(tb, err)
	nm.Header.Set(nats.ExpectedLastSeqHdr, "123455")
	nm.Header.Set(nats.ExpectedLastSubjSeqHdr, "1")
	nm.Header.Set("Nats-Expected-Last-Subject-Sequence-Subject", "wal.c1.pchan-3.p.recoverybarrier")
	nm.Header.Set(nats.ExpectedLastMsgIdHdr, "c-M4aTLP0d5wWbxjGuOZqeGj")
	return nm
}

// BenchmarkDecodeStored decodes a stored insert, as every reader does for
// every message.
func BenchmarkDecodeStored(b *testing.B) {
	c := newCodec(b)
	nm := storedInsert(b, c)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Decode(nm, 123_457); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeStoredCold decodes stored inserts whose headers nats.go
// parsed each into its own map, too many to stay in the CPU caches, as a
// reader meets them.
func BenchmarkDecodeStoredCold(b *testing.B) {
	c := newCodec(b)
	block := wireHeader(storedInsert(b, c).Header)
	msgs := make([]*nats.Msg, 1<<16)
	for i := range msgs {
		hdr, err := parseWireHeader(block)
		require.NoError(b, err)
		msgs[i] = &nats.Msg{Subject: storedInsert(b, c).Subject, Header: hdr, Data: make([]byte, 1024)}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := c.Decode(msgs[i%len(msgs)], 123_457); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkDecodeStoredParallel decodes stored inserts on every CPU at
// once, as concurrent readers do with one codec.
func BenchmarkDecodeStoredParallel(b *testing.B) {
	c := newCodec(b)
	nm := storedInsert(b, c)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Decode(nm, 123_457); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
