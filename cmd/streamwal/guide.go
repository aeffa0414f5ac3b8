package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/pflag"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/client"
	"github.com/streamwal/streamwal/messages"
)

// What the commands check before they act, so that a mistake is told at
// once rather than waited on: a coordinator that does not answer, a
// collection that does not exist, a type that cannot be appended, a
// payload too large for the server.

// coordinatorWait bounds how long a command waits for a coordinator of a
// cluster the server has (one starting, or a takeover: the lease is 3 s).
const coordinatorWait = 10 * time.Second

// pingCoordinator checks that a coordinator answers for the client's
// cluster: at once when the server has no cluster of that name, within
// coordinatorWait (or ctx's end) when it has.
func pingCoordinator(ctx context.Context, c *client.Client) error {
	ctx, cancel := context.WithTimeout(ctx, coordinatorWait)
	defer cancel()
	return c.Ping(ctx)
}

// appendable reports whether `streamwal append` may append messages of
// type t: a type of one VChannel that the WAL does not write itself, and
// that is not a transaction's control message or the readers' Txn.
func appendable(t *messages.Type) bool {
	return t.Dispatch == messages.DispatchVChannel &&
		!t.Is(messages.FlagSelfControlled) && !t.Is(messages.FlagSynthetic) && !t.Is(messages.FlagTxnControl)
}

// appendTypes names the types of reg that append takes.
func appendTypes(reg *messages.Registry) []string {
	var names []string
	for _, t := range reg.Types() {
		if appendable(t) {
			names = append(names, t.Name)
		}
	}
	return names
}

// appendType is the appendable type of reg named name, in any case.
func appendType(reg *messages.Registry, name string) (*messages.Type, error) {
	valid := strings.Join(appendTypes(reg), ", ")
	i := slices.IndexFunc(reg.Types(), func(t *messages.Type) bool { return strings.EqualFold(t.Name, name) })
	if i < 0 {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "--type %q: %w; append takes %s (in any case)",
			name, messages.ErrUnknownType, valid)
	}
	t := reg.Types()[i]
	if !appendable(t) {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "--type %q: %s messages are not appended by hand "+
			"(collection DDL: `streamwal collection`; the WAL's own and transactions' messages: never); append takes %s (in any case)",
			name, t.Name, valid)
	}
	return t, nil
}

// payloadSource reads the payloads of an append: the arguments, or the
// file --file names ("-": all of standard input, as one message), or else
// one per line of standard input.
type payloadSource struct {
	args  []string
	file  string
	stdin io.Reader
}

// check refuses two sources at once.
func (s payloadSource) check() error {
	if s.file != "" && len(s.args) > 0 {
		return fmt.Errorf("give payloads as arguments or with --file, not both")
	}
	return nil
}

// read returns the payloads, none larger than limit bytes.
func (s payloadSource) read(limit int) ([][]byte, error) {
	switch {
	case s.file != "":
		p, err := readWhole(s.file, s.stdin, limit)
		if err != nil {
			return nil, err
		}
		return [][]byte{p}, nil
	case len(s.args) > 0:
		out := make([][]byte, len(s.args))
		for i, a := range s.args {
			if len(a) > limit {
				return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "payload argument %d has %d bytes, more than the %d bytes one message may carry", i+1, len(a), limit)
			}
			out[i] = []byte(a)
		}
		return out, nil
	}
	out, err := readLines(s.stdin, limit)
	if err != nil {
		return nil, fmt.Errorf("read standard input: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no payload: give arguments, lines on standard input, or --file")
	}
	return out, nil
}

// readWhole reads a file (standard input for "-") as one payload of at
// most limit bytes, byte for byte.
func readWhole(path string, stdin io.Reader, limit int) ([]byte, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--file: %w", err)
		}
		defer f.Close()
		r = f
	}
	p, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("--file %s: %w", path, err)
	}
	if len(p) > limit {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "--file %s has more than %d bytes, the most one message may carry", path, limit)
	}
	return p, nil
}

// readLines splits in into lines (without their "\n" or "\r\n"; a last
// line needs no newline), refusing a line longer than limit bytes.
func readLines(in io.Reader, limit int) ([][]byte, error) {
	r := bufio.NewReaderSize(in, 64<<10)
	var out [][]byte
	for n := 1; ; n++ {
		line, err := readLine(r, limit)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if line != nil {
			out = append(out, line)
		}
		if err != nil {
			return out, nil
		}
	}
}

// readLine reads one line; at the end of the input it returns io.EOF,
// with the last line if it had no newline (nil if there was none).
func readLine(r *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))) > limit {
			return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "longer than %d bytes, the most one message may carry (append a larger payload from a file with --file)", limit)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == nil:
			return bytes.TrimSuffix(line[:len(line)-1], []byte("\r")), nil
		case errors.Is(err, io.EOF) && len(line) == 0:
			return nil, io.EOF
		case errors.Is(err, io.EOF):
			return bytes.TrimSuffix(line, []byte("\r")), io.EOF
		default:
			return nil, err
		}
	}
}

// checkTailVChannel refuses to follow a VChannel that nothing will ever
// land on: one of a collection that does not exist (unless wait says to
// wait for its creation), one that is not among its collection's
// VChannels, or one of a dropped collection (unless fromStart reads its
// history). The CChannel always exists.
func checkTailVChannel(ctx context.Context, c *client.Client, v streamwal.VChannel, fromStart, wait bool) error {
	if v.IsControl() {
		return nil
	}
	vs, err := c.CollectionVChannels(ctx, v.CollectionID())
	switch {
	case err == nil && slices.Contains(vs, v):
		return nil
	case err == nil:
		names := make([]string, len(vs))
		for i, x := range vs {
			names[i] = x.String()
		}
		return streamwal.Errorf(streamwal.CodeInvalidArgument, "--vchannel %s: collection %d has the VChannels %s, not this one",
			v, v.CollectionID(), strings.Join(names, ", "))
	case streamwal.CodeOf(err) != streamwal.CodeLifecycle:
		return err
	case errors.Is(err, streamwal.ErrCollectionDropped):
		if fromStart {
			return nil
		}
		return fmt.Errorf("--vchannel %s: %w: nothing new lands on it (--from-start reads its history)", v, err)
	case wait:
		return nil
	}
	return fmt.Errorf("--vchannel %s: %w (--wait follows it until the collection is created)", v, err)
}

// payloadEncodingBase64 is the payload_encoding of a `tail --json` line
// whose payload is not UTF-8 and is given in standard base64.
const payloadEncodingBase64 = "base64"

// jsonPayload is a payload as `tail --json` gives it: as text when it is
// UTF-8, and otherwise in base64 with its encoding named.
func jsonPayload(p []byte) (payload, encoding string) {
	if utf8.Valid(p) {
		return string(p), ""
	}
	return base64.StdEncoding.EncodeToString(p), payloadEncodingBase64
}

// setFlagDefault gives a flag a default of its command's own (beyond the
// one its registration gave): its value, and the default help shows, as
// if never set.
func setFlagDefault(fl *pflag.FlagSet, name, value string) {
	f := fl.Lookup(name)
	if f == nil {
		panic("no flag --" + name)
	}
	if err := f.Value.Set(value); err != nil {
		panic(fmt.Sprintf("default of --%s: %v", name, err))
	}
	f.DefValue = f.Value.String()
	f.Changed = false
}
