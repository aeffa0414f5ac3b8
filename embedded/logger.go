package embedded

import (
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
)

// natsLogger adapts nats-server's server.Logger interface to zerolog.
// Fatalf never exits the process: it logs at fatal level and records the
// message in a fatalSink so that the starter can fail cleanly.
type natsLogger struct {
	log   zerolog.Logger
	fatal *fatalSink
}

var _ server.Logger = (*natsLogger)(nil)

func newNATSLogger(base zerolog.Logger, serverName string, fatal *fatalSink) *natsLogger {
	l := base.With().Str("component", "nats-server").Str("server", serverName).Logger()
	return &natsLogger{log: l, fatal: fatal}
}

// levels reports whether nats-server should emit debug and trace output.
func (l *natsLogger) levels() (debug, trace bool) {
	lvl := l.log.GetLevel()
	if g := zerolog.GlobalLevel(); g > lvl {
		lvl = g
	}
	return lvl <= zerolog.DebugLevel, lvl <= zerolog.TraceLevel
}

// Noticef logs at info level.
func (l *natsLogger) Noticef(format string, v ...any) { l.log.Info().Msgf(format, v...) }

// Warnf logs at warn level.
func (l *natsLogger) Warnf(format string, v ...any) { l.log.Warn().Msgf(format, v...) }

// Errorf logs at error level.
func (l *natsLogger) Errorf(format string, v ...any) { l.log.Error().Msgf(format, v...) }

// Debugf logs at debug level.
func (l *natsLogger) Debugf(format string, v ...any) { l.log.Debug().Msgf(format, v...) }

// Tracef logs at trace level.
func (l *natsLogger) Tracef(format string, v ...any) { l.log.Trace().Msgf(format, v...) }

// Fatalf logs at fatal level without exiting and records the failure.
func (l *natsLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.WithLevel(zerolog.FatalLevel).Msg(msg)
	l.fatal.record(msg)
}

// fatalSink remembers the first fatal message nats-server logged.
type fatalSink struct {
	once sync.Once
	done chan struct{}
	msg  string
}

func newFatalSink() *fatalSink { return &fatalSink{done: make(chan struct{})} }

func (f *fatalSink) record(msg string) {
	f.once.Do(func() {
		f.msg = msg
		close(f.done)
	})
}

// err returns the recorded fatal failure, or nil. Bind failures wrap
// errBind so that callers that chose the ports can retry with new ones.
func (f *fatalSink) err() error {
	select {
	case <-f.done:
	default:
		return nil
	}
	// nats-server reports listener failures as "Error listening on port: ..."
	// and "Error listening on router port: ...".
	if strings.HasPrefix(f.msg, "Error listening on") {
		return fmt.Errorf("nats-server: %s: %w", f.msg, errBind)
	}
	return fmt.Errorf("nats-server fatal error: %s", f.msg)
}
