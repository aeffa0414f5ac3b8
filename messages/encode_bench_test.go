package messages_test

import "testing"

// BenchmarkEncodeInsert encodes a stamped 1 KiB insert, as the client does
// for every message it sends and the writer for every message it stores.
func BenchmarkEncodeInsert(b *testing.B) {
	c := newCodec(b)
	m := stampedInsert(b, c)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Encode(m); err != nil {
			b.Fatal(err)
		}
	}
}
