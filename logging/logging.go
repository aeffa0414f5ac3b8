// Package logging builds the zerolog loggers streamwal passes down its
// components. There is no global logger: every component receives a
// zerolog.Logger from its caller (a test passes zerolog.Nop() or a test
// writer) and derives its own with [Component].
package logging

import (
	"io"
	"os"

	"github.com/rs/zerolog"
	"golang.org/x/term"
)

// FieldComponent is the field that names the component that logged.
const FieldComponent = "component"

// New returns a logger writing to w at level. With console set, output is
// human-readable (in colour only on a terminal, so that a log redirected
// to a file or a pipe stays plain text); otherwise it is one JSON object
// per line.
func New(w io.Writer, level zerolog.Level, console bool) zerolog.Logger {
	if console {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05", NoColor: !isTerminal(w)}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Default returns the logger of the streamwal command: human-readable on
// standard error at info level.
func Default() zerolog.Logger { return New(os.Stderr, zerolog.InfoLevel, true) }

// Component derives the logger of a named component.
func Component(l zerolog.Logger, name string) zerolog.Logger {
	return l.With().Str(FieldComponent, name).Logger()
}

// ParseLevel parses a level name ("debug", "info", "warn", "error",
// "disabled"), with a clear error for anything else.
func ParseLevel(s string) (zerolog.Level, error) {
	return zerolog.ParseLevel(s)
}
