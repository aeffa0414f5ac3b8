package jetstream

import (
	"fmt"

	"github.com/streamwal/streamwal/messages"
)

// StartKind says where a scanner starts.
type StartKind uint8

// Start kinds.
const (
	// StartEarliest starts at the first message still in the stream.
	StartEarliest StartKind = iota
	// StartLatest delivers only messages appended after Read returned.
	StartLatest
	// StartFrom starts at a MessageID, inclusive.
	StartFrom
	// StartAfter starts right after a MessageID.
	StartAfter
)

// StartPosition is where a scanner starts.
type StartPosition struct {
	Kind StartKind
	ID   messages.MessageID
}

// Earliest starts at the first message in the stream.
func Earliest() StartPosition { return StartPosition{Kind: StartEarliest} }

// Latest delivers only messages appended after Read returns.
func Latest() StartPosition { return StartPosition{Kind: StartLatest} }

// From starts at id, inclusive.
func From(id messages.MessageID) StartPosition { return StartPosition{Kind: StartFrom, ID: id} }

// After starts right after id.
func After(id messages.MessageID) StartPosition { return StartPosition{Kind: StartAfter, ID: id} }

// String renders the position for logs.
func (s StartPosition) String() string {
	switch s.Kind {
	case StartEarliest:
		return "earliest"
	case StartLatest:
		return "latest"
	case StartFrom:
		return fmt.Sprintf("from %d", s.ID)
	case StartAfter:
		return fmt.Sprintf("after %d", s.ID)
	}
	return "invalid"
}

// validate checks the position.
func (s StartPosition) validate() error {
	switch s.Kind {
	case StartEarliest, StartLatest:
		return nil
	case StartFrom:
		if s.ID == 0 {
			return invalidArg("start from message id 0")
		}
		return nil
	case StartAfter:
		return nil
	}
	return invalidArg("unknown start kind %d", s.Kind)
}
