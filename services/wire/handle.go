package wire

import "context"

// None is the reply of a request answered by its error alone: a handler
// made by [Handle] that returns None sends no body, as a nil one does.
type None struct{}

// Handle makes a [Handler] of a typed one, so that every request handler
// has the same prologue and epilogue: it decodes the request into a Req
// (see [Decode]; a malformed request, or one carrying a bad name, is
// streamwal.ErrInvalidArgument and f is not called), calls f with it, and
// returns f's reply, or f's error alone. Names typed as streamwal.PChannel,
// VChannel or NodeID in Req validate themselves as they are decoded, so f
// gets them parsed.
//
// Handle costs what a hand-written prologue does: no reflection of its
// own and no allocation beyond the decoded request and the reply as an
// interface value (TestHandleAllocatesNoMore), which keeps it fit for the
// append subject.
func Handle[Req, Rep any](f func(ctx context.Context, req Req) (Rep, error)) Handler {
	return func(ctx context.Context, data []byte) (any, error) {
		var req Req
		if err := Decode(data, &req); err != nil {
			return nil, err
		}
		rep, err := f(ctx, req)
		if err != nil {
			return nil, err
		}
		body := any(rep) // once: the only allocation of the reply
		if _, none := body.(None); none {
			return nil, nil
		}
		return body, nil
	}
}
