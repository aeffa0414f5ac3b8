package messages

import (
	"errors"

	"github.com/streamwal/streamwal"
)

// Causes of the invalid-argument errors of this package. Every error the
// package returns for bad input matches streamwal.ErrInvalidArgument and,
// where one applies, one of these with errors.Is.
var (
	// ErrUnknownType: the type is not in the registry.
	ErrUnknownType = errors.New("unknown message type")
	// ErrMalformed: a header or body could not be decoded.
	ErrMalformed = errors.New("malformed message")
	// ErrPayloadTooLarge: the payload exceeds the configured limit.
	ErrPayloadTooLarge = errors.New("payload too large")
	// ErrBadTarget: the channels given do not fit the type's dispatch.
	ErrBadTarget = errors.New("target does not fit the message type")
	// ErrBadType: a type declaration is inconsistent or conflicts with a
	// registered one.
	ErrBadType = errors.New("bad message type declaration")
	// ErrBadBody: the body does not fit the message type.
	ErrBadBody = errors.New("body does not fit the message type")
	// ErrNoPayload: the message was read without its payload (see
	// Codec.DecodeHeadersOnly), so its body cannot be decoded.
	ErrNoPayload = errors.New("message read without its payload")
)

var (
	errLeadingZero = errors.New("leading zero")
	errNotDecimal  = errors.New("not a decimal number")
)

// wrapInvalid builds an invalid-argument error whose cause is one of the
// sentinels above.
func wrapInvalid(cause error, format string, args ...any) error {
	return streamwal.Errorf(streamwal.CodeInvalidArgument, "%w: "+format, append([]any{cause}, args...)...)
}
