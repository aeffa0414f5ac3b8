package main

import (
	"fmt"
	"io"
	"runtime/debug"
	"strings"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal/logging"
)

// newRootCmd builds the command tree writing to out and errOut, so tests can
// run every subcommand in-process.
func newRootCmd(out, errOut io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "streamwal",
		Short:         "A distributed write-ahead log on NATS JetStream",
		Version:       version(debug.ReadBuildInfo()),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("streamwal {{.Version}}\n")
	format := logging.FormatAuto
	root.PersistentFlags().Var(&format, flagLogFormat,
		"log format of the commands that log: text, json, or auto (text on a terminal, JSON lines otherwise)")
	root.SetOut(out)
	root.SetErr(errOut)
	root.AddCommand(newServeCmd(), newStatusCmd(), newCollectionCmd(), newAppendCmd(), newTailCmd(), newBenchCmd(),
		newSegmentsCmd(), newPChannelCmd(), newCoordCmd(), newNodeCmd(), newAuthCmd(), newSubscriptionsCmd(), newReplicateCmd())
	return root
}

// flagLogFormat is the root's persistent flag that chooses the log format.
const flagLogFormat = "log-format"

// newLogger is the logger of a command that logs: on the command's
// standard error at level, in the format --log-format chose.
func newLogger(cmd *cobra.Command, level zerolog.Level) zerolog.Logger {
	format := logging.FormatAuto
	if f := cmd.Flag(flagLogFormat); f != nil {
		if v, ok := f.Value.(*logging.Format); ok {
			format = *v
		}
	}
	return logging.NewFormat(cmd.ErrOrStderr(), level, format)
}

// version describes the build: the module's version ("(devel)" when
// built from a working tree), and the VCS revision, its time and whether
// the tree had changes, when the build recorded them.
func version(info *debug.BuildInfo, ok bool) string {
	if !ok || info == nil {
		return "(unknown)"
	}
	v := info.Main.Version
	if v == "" {
		v = "(devel)"
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	var vcs []string
	if r := settings["vcs.revision"]; r != "" {
		vcs = append(vcs, "revision "+r)
	}
	if t := settings["vcs.time"]; t != "" {
		vcs = append(vcs, t)
	}
	if settings["vcs.modified"] == "true" {
		vcs = append(vcs, "modified")
	}
	if len(vcs) > 0 {
		v += " (" + strings.Join(vcs, ", ") + ")"
	}
	if info.GoVersion != "" {
		v += fmt.Sprintf(", %s", info.GoVersion)
	}
	return v
}
