package jetstream

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/streamwal/streamwal/messages"
)

// sampleFrames are frames of every shape the stream stores.
func sampleFrames() []frame {
	return []frame{
		{ID: 1, Subject: "wal.c.p-0.p.recoverybarrier", Header: nats.Header{"Wal-Type": {"RecoveryBarrier"}, "Wal-Term": {"1"}}, Data: []byte(`{"term":1}`)},
		{ID: 2, Subject: "wal.c.p-0.v.1v0.insert", Header: nats.Header{"Wal-Broadcast-Key": {"a", "b"}, "Nats-Msg-Id": {"x"}}, Data: bytes.Repeat([]byte{0, 0x80, 0xff}, 100)},
		{ID: 300, Subject: "s", Header: nil, Data: nil},
		{ID: 1 << 40, Subject: "wal.c.p-0.p.timetick", Header: nats.Header{"K": {""}}, Data: []byte{}},
	}
}

// encodeFrames frames fs into one object.
func encodeFrames(fs []frame) []byte {
	data := appendFrameHeader(nil)
	for _, f := range fs {
		data = appendFrame(data, f.ID, f.Subject, f.Header, f.Data)
	}
	return data
}

// decodeFrames decodes every frame of an object.
func decodeFrames(data []byte) ([]frame, error) {
	r, err := newFrameReader(data)
	if err != nil {
		return nil, err
	}
	var out []frame
	for {
		f, ok, err := r.next(nil)
		if err != nil || !ok {
			return out, err
		}
		out = append(out, f)
	}
}

// sameFrame compares frames, an empty header or data equal to none.
func sameFrame(a, b frame) bool {
	return a.ID == b.ID && a.Subject == b.Subject && bytes.Equal(a.Data, b.Data) &&
		(len(a.Header) == 0 && len(b.Header) == 0 || reflect.DeepEqual(a.Header, b.Header))
}

func TestFrameRoundTrip(t *testing.T) {
	fs := sampleFrames()
	data := encodeFrames(fs)
	if !bytes.Equal(data, encodeFrames(fs)) {
		t.Fatal("the same frames encode to different bytes")
	}
	got, err := decodeFrames(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(fs) {
		t.Fatalf("decoded %d frames, want %d", len(got), len(fs))
	}
	for i := range fs {
		if !sameFrame(got[i], fs[i]) {
			t.Errorf("frame %d: got %+v, want %+v", i, got[i], fs[i])
		}
	}
	// A filter skips frames without decoding their headers.
	r, _ := newFrameReader(data)
	f, ok, err := r.next(func(id messages.MessageID, _ string) bool { return id >= 300 })
	if err != nil || !ok || f.ID != 300 {
		t.Fatalf("filtered next: %+v %v %v", f, ok, err)
	}
}

func TestFrameErrors(t *testing.T) {
	good := encodeFrames(sampleFrames())
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrFrameVersion},
		{"no magic", []byte("JUNK\x01"), ErrFrameVersion},
		{"other version", []byte("SWAL\x02"), ErrFrameVersion},
		{"cut in a frame", good[:len(good)-3], ErrFrameTruncated},
		{"cut in a length", append(appendFrameHeader(nil), 0x80), ErrFrameTruncated},
		{"varint overflow", append(appendFrameHeader(nil), bytes.Repeat([]byte{0xff}, 11)...), ErrFrameMalformed},
		{"ids not increasing", encodeFrames([]frame{{ID: 5, Subject: "a"}, {ID: 5, Subject: "b"}}), ErrFrameMalformed},
		{"id 0", encodeFrames([]frame{{ID: 0, Subject: "a"}}), ErrFrameMalformed},
		{"empty subject", encodeFrames([]frame{{ID: 1, Subject: ""}}), ErrFrameMalformed},
		{"repeated key", append(appendFrameHeader(nil), 9, 1, 1, 'a', 2, 1, 'k', 0, 1, 'k'), ErrFrameMalformed},
		{"huge count", append(appendFrameHeader(nil), 6, 1, 1, 'a', 0xff, 0xff, 0x7f), ErrFrameMalformed},
		{"left over", append(appendFrameHeader(nil), 6, 1, 1, 'a', 0, 0, 7), ErrFrameMalformed},
		{"field past the frame", append(appendFrameHeader(nil), 5, 1, 1, 'a', 0, 9), ErrFrameMalformed},
	}
	for _, c := range cases {
		_, err := decodeFrames(c.data)
		var fe *FrameError
		if !errors.Is(err, c.want) || !errors.As(err, &fe) {
			t.Errorf("%s: error %v, want a *FrameError matching %v", c.name, err, c.want)
		}
	}
}

// FuzzFrameDecode: the decoder never panics, refuses with a *FrameError,
// and what it accepts encodes back to the same bytes.
func FuzzFrameDecode(f *testing.F) {
	f.Add(encodeFrames(sampleFrames()))
	f.Add(encodeFrames(nil))
	f.Add([]byte("SWAL\x01\x05\x01\x01a\x00\x00"))
	f.Add([]byte("SWAL\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fs, err := decodeFrames(data)
		if err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) || !(errors.Is(err, ErrFrameTruncated) || errors.Is(err, ErrFrameMalformed) || errors.Is(err, ErrFrameVersion)) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		again, err := decodeFrames(encodeFrames(fs))
		if err != nil {
			t.Fatalf("re-encoded frames do not decode: %v", err)
		}
		for i := range fs {
			if !sameFrame(fs[i], again[i]) {
				t.Fatalf("frame %d changed through re-encoding: %+v, %+v", i, fs[i], again[i])
			}
		}
	})
}

func TestSubjectMatcher(t *testing.T) {
	cases := []struct {
		filter, subject string
		want            bool
	}{
		{"a.b.c", "a.b.c", true},
		{"a.*.c", "a.b.c", true},
		{"a.*", "a.b.c", false},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{">", "a", true},
		{"*", "a.b", false},
		{"a.b", "a.b.c", false},
		{"a.b.c", "a.b", false},
		{"wal.c.p-0.v.1v0.*", "wal.c.p-0.v.1v0.insert", true},
		{"wal.c.p-0.v.1v0.*", "wal.c.p-0.v.1v01.insert", false},
		{"wal.c.p-0.p.*", "wal.c.p-0.p.timetick", true},
	}
	for _, c := range cases {
		if got := newSubjectMatcher([]string{c.filter}).match(c.subject); got != c.want {
			t.Errorf("match(%q, %q) = %v, want %v", c.filter, c.subject, got, c.want)
		}
		if server.SubjectMatchesFilter(c.subject, c.filter) != c.want {
			t.Errorf("the server disagrees on %q, %q", c.filter, c.subject)
		}
	}
	if !newSubjectMatcher(nil).match("x.y") {
		t.Error("no filter must match everything")
	}
	if m := newSubjectMatcher([]string{"a.b", "c.>"}); !m.match("c.d") || !m.match("a.b") || m.match("a.c") {
		t.Error("several filters: any must match")
	}
}

// FuzzSubjectMatcher: the matcher agrees with nats-server on valid
// subjects and filters.
func FuzzSubjectMatcher(f *testing.F) {
	f.Add("a.*.c", "a.b.c")
	f.Add("a.>", "a.b")
	f.Add(">", "x")
	f.Add("a.b", "a.b.c")
	f.Fuzz(func(t *testing.T, filter, subject string) {
		if !server.IsValidSubject(filter) || !server.IsValidLiteralSubject(subject) || strings.ContainsAny(subject+filter, " \t\r\n") {
			return
		}
		for _, tok := range strings.Split(filter, ".") {
			if len(tok) > 1 && (tok[0] == '*' || tok[0] == '>') {
				return // the server takes "*x" for a wildcard where a consumer filter does not
			}
		}
		want := server.SubjectMatchesFilter(subject, filter)
		if got := newSubjectMatcher([]string{filter}).match(subject); got != want {
			t.Fatalf("match(%q, %q) = %v, the server says %v", filter, subject, got, want)
		}
	})
}

func TestFrameErrorText(t *testing.T) {
	_, err := decodeFrames([]byte("SWAL\x01\x09\x01"))
	want := "framed object truncated at byte 5: frame of 9 bytes with 1 left"
	if err == nil || err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}
