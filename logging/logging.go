// Package logging builds the zerolog loggers streamwal passes down its
// components. There is no global logger: every component receives a
// zerolog.Logger from its caller (a test passes zerolog.Nop() or a test
// writer) and derives its own with [Component].
//
// A log is written in one of two formats ([Format]): human-readable text,
// or one JSON object per line for log collectors. [FormatAuto] picks text
// for a terminal and JSON for anything else (a file, a pipe), so that a
// redirected log is machine-readable and never carries escape codes.
package logging

import (
	"fmt"
	"io"
	"os"

	"github.com/rs/zerolog"
	"golang.org/x/term"
)

// FieldComponent is the field that names the component that logged.
const FieldComponent = "component"

// Format is how a logger writes its records. It implements the flag
// value interface (String, Set, Type), so a command can take it as a flag
// directly.
type Format string

// The formats.
const (
	// FormatAuto is FormatText on a terminal and FormatJSON otherwise.
	FormatAuto Format = "auto"
	// FormatText is human-readable: a time, a level, the message and
	// key=value fields; coloured only on a terminal.
	FormatText Format = "text"
	// FormatJSON is one JSON object per line.
	FormatJSON Format = "json"
)

// Formats lists the formats ParseFormat accepts.
var Formats = []Format{FormatText, FormatJSON, FormatAuto}

// ParseFormat parses a format name ("text", "json" or "auto"), with a
// clear error for anything else.
func ParseFormat(s string) (Format, error) {
	for _, f := range Formats {
		if string(f) == s {
			return f, nil
		}
	}
	return "", fmt.Errorf("log format %q: want text, json or auto", s)
}

// String is the format's name.
func (f Format) String() string { return string(f) }

// Set parses s into f (the flag value interface).
func (f *Format) Set(s string) error {
	v, err := ParseFormat(s)
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// Type names the flag value's type in help.
func (f *Format) Type() string { return "format" }

// Resolve is the concrete format of a log written to w: FormatAuto is
// FormatText when w is a terminal and FormatJSON otherwise.
func (f Format) Resolve(w io.Writer) Format {
	if f != FormatAuto {
		return f
	}
	if isTerminal(w) {
		return FormatText
	}
	return FormatJSON
}

// NewFormat returns a logger writing to w at level in format f.
func NewFormat(w io.Writer, level zerolog.Level, f Format) zerolog.Logger {
	if f.Resolve(w) == FormatText {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05", NoColor: !isTerminal(w)}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// New returns a logger writing to w at level. With console set, output is
// human-readable (in colour only on a terminal); otherwise it is one JSON
// object per line. Commands use [NewFormat], which lets the user choose.
func New(w io.Writer, level zerolog.Level, console bool) zerolog.Logger {
	if console {
		return NewFormat(w, level, FormatText)
	}
	return NewFormat(w, level, FormatJSON)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Default returns the logger of the streamwal command: on standard error
// at info level, human-readable on a terminal and JSON lines otherwise.
func Default() zerolog.Logger { return NewFormat(os.Stderr, zerolog.InfoLevel, FormatAuto) }

// Component derives the logger of a named component.
func Component(l zerolog.Logger, name string) zerolog.Logger {
	return l.With().Str(FieldComponent, name).Logger()
}

// ParseLevel parses a level name ("debug", "info", "warn", "error",
// "disabled"), with a clear error for anything else.
func ParseLevel(s string) (zerolog.Level, error) {
	return zerolog.ParseLevel(s)
}
