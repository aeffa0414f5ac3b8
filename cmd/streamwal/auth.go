package main

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/streamwal/streamwal"
	"github.com/streamwal/streamwal/auth"
	"github.com/streamwal/streamwal/embedded/system"
	"github.com/streamwal/streamwal/services/coord"
)

// authInitHelp is the long help of `streamwal auth init`.
const authInitHelp = "Write NATS credentials for a streamwal cluster into --dir: one nkey user per\n" +
	"role, with the publish/subscribe permissions of that role, as an include for\n" +
	"nats-server's configuration (auth.conf), and each role's seed (coord.nk, node.nk,\n" +
	"client.nk, admin.nk; mode 0600, in a directory created with mode 0700). Existing\n" +
	"seeds or auth.conf are never replaced unless --force, which replaces them all.\n\n" +
	"Roles (for cluster c):\n" +
	"  coord   the coordinator: creates and reads the KV buckets wal_<c>_*, writes its\n" +
	"          own state in them, answers walapi.<c>.coord.>, asks nodes to open and\n" +
	"          close PChannels and to append broadcasts.\n" +
	"  node    a node: the only role that publishes into wal.<c>.>; creates, reads and\n" +
	"          truncates the WAL streams, writes the object store wal_<c>_segments and\n" +
	"          the checkpoints, registers itself, answers appends and node requests.\n" +
	"  client  append, broadcast and status requests; reads: consumers and gets on the\n" +
	"          WAL streams (durable positions included), the object store and the\n" +
	"          checkpoints. It cannot publish into wal.>, write a bucket, create,\n" +
	"          delete or purge a stream.\n" +
	"  admin   everything: the nats CLI, `streamwal pchannel accept-loss`, bench.\n\n" +
	"The permissions name each WAL stream, so they are written for --pchannels\n" +
	"PChannels (the count a cluster is created with; a cluster of more needs the\n" +
	"credentials written again for its count).\n\n" +
	"Use them:\n" +
	"  On your NATS servers: add `include auth.conf` to each server's configuration\n" +
	"  (the path is relative to that file; servers need auth.conf, never a seed), then\n" +
	"  run `streamwal coord --nkey D/coord.nk`, `streamwal node --nkey D/node.nk`,\n" +
	"  and the client commands with `--nkey D/client.nk`.\n" +
	"  All in one process: `streamwal serve --auth-dir D` gives its embedded server\n" +
	"  these users and connects its coordinator and node with their seeds; clients\n" +
	"  use `--nkey D/client.nk`.\n" +
	"Give each process only its own seed. nkeys authenticate but do not encrypt: add\n" +
	"TLS to the servers (nats-server's tls block) and --tls-ca to the commands."

// authInitFlags are the flags of `streamwal auth init`.
type authInitFlags struct {
	dir       string
	cluster   string
	pchannels int
	force     bool
}

// newAuthCmd is `streamwal auth`.
func newAuthCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Secure a cluster with NATS users and permissions",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newAuthInitCmd())
	return cmd
}

// newAuthInitCmd is `streamwal auth init`.
func newAuthInitCmd() *cobra.Command {
	f := &authInitFlags{}
	cmd := &cobra.Command{
		Use:   "init --dir D",
		Short: "Write nats-server users with the permissions of each role, and their seeds",
		Long:  authInitHelp,
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runAuthInit(cmd.OutOrStdout(), f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "dir", "", "directory to write auth.conf and the seeds to (required)")
	fl.StringVar(&f.cluster, flagCluster, "local", "streamwal cluster name")
	fl.IntVar(&f.pchannels, "pchannels", coord.DefaultPChannels, "PChannels of the cluster (as created by its first coordinator)")
	fl.BoolVar(&f.force, "force", false, "replace existing credentials in --dir")
	return cmd
}

// runAuthInit writes the credentials and says how to use them.
func runAuthInit(w io.Writer, f *authInitFlags) error {
	if f.dir == "" {
		return fmt.Errorf("--dir is required: the directory to write auth.conf and the seeds to")
	}
	cluster, err := streamwal.ParseCluster(f.cluster)
	if err != nil {
		return fmt.Errorf("--cluster: %w", err)
	}
	spec, err := auth.NewSpec(cluster, coord.DefaultPrefix, f.pchannels)
	if err != nil {
		return fmt.Errorf("--pchannels: %w", err)
	}
	dir, err := filepath.Abs(f.dir)
	if err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	written, err := auth.Init(auth.Dir(dir), spec, f.force)
	if err != nil {
		return err
	}
	printAuthInit(w, spec, auth.Dir(dir), written)
	return nil
}

// authUses says which processes use each role's seed.
var authUses = map[auth.Role]string{
	auth.RoleCoordinator: "streamwal coord --nkey",
	auth.RoleNode:        "streamwal node --nkey",
	auth.RoleClient:      "streamwal status|append|tail|... --nkey",
	auth.RoleAdmin:       "nats --nkey",
}

// printAuthInit lists what was written and how to use it.
func printAuthInit(w io.Writer, spec auth.Spec, d auth.Dir, written auth.Written) {
	fmt.Fprintf(w, "wrote NATS users of streamwal cluster %q (%d PChannels) to %s:\n", spec.Cluster, len(spec.PChannels), d)
	fmt.Fprintf(w, "  %-10s nats-server include: one user per role with its permissions (public keys only)\n", auth.ConfName)
	for _, r := range auth.Roles {
		fmt.Fprintf(w, "  %-10s seed of %s (mode 0600): %s %s\n", filepath.Base(written.Seeds[r]), r, authUses[r], written.Seeds[r])
	}
	fmt.Fprintln(w, "Use them:")
	fmt.Fprintf(w, "  on your nats-server: copy %s next to its configuration file and add the line\n", written.Conf)
	fmt.Fprintf(w, "    include %s\n", auth.ConfName)
	fmt.Fprintln(w, "    (nats-server reads include paths relative to the including file), then start")
	fmt.Fprintln(w, "    the coordinators, nodes and clients with their seeds as above;")
	fmt.Fprintf(w, "  all in one process: streamwal serve --auth-dir %s\n", d)
	fmt.Fprintln(w, "Keep the seeds secret and give each process only its own.")
}

// serveAuth is what `serve --auth-dir` gives the embedded server (the
// users of auth.conf) and its own coordinator, node and connection (their
// seeds). A nil *serveAuth (no --auth-dir) gives nothing.
type serveAuth struct {
	dir   auth.Dir
	users []*server.NkeyUser
	opts  map[system.Member][]nats.Option
}

// memberRoles are the roles of serve's own connections; the system's
// own connection (status) is a client's.
var memberRoles = map[system.Member]auth.Role{
	system.MemberCoordinator: auth.RoleCoordinator,
	system.MemberNode:        auth.RoleNode,
	system.MemberClient:      auth.RoleClient,
}

// loadServeAuth reads dir for serve (nil without a directory): its users,
// checked to cover cluster with pchannels PChannels, and the seeds of
// serve's members, checked to be users of it.
func loadServeAuth(dir string, cluster streamwal.Cluster, pchannels int) (*serveAuth, error) {
	if dir == "" {
		return nil, nil
	}
	spec, err := auth.NewSpec(cluster, coord.DefaultPrefix, pchannels)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("--auth-dir: %w", err)
	}
	a := &serveAuth{dir: auth.Dir(abs), opts: map[system.Member][]nats.Option{}}
	if a.users, err = a.dir.Users(spec, auth.RoleCoordinator, auth.RoleNode, auth.RoleClient); err != nil {
		return nil, fmt.Errorf("--auth-dir: %w (write it with `streamwal auth init --dir %s --cluster %s --pchannels %d`)",
			err, dir, cluster, pchannels)
	}
	for m, r := range memberRoles {
		o, err := a.dir.Option(r)
		if err != nil {
			return nil, fmt.Errorf("--auth-dir: %w", err)
		}
		a.opts[m] = []nats.Option{o}
	}
	return a, nil
}

// Users are the users the embedded server accepts (nil: anyone).
func (a *serveAuth) Users() []*server.NkeyUser {
	if a == nil {
		return nil
	}
	return a.users
}

// connect gives member m's connection its seed.
func (a *serveAuth) connect(m system.Member) []nats.Option {
	if a == nil {
		return nil
	}
	return a.opts[m]
}

// printBanner says how to connect to a server that requires credentials.
func (a *serveAuth) printBanner(w io.Writer) {
	if a == nil {
		return
	}
	fmt.Fprintf(w, "  credentials: only the users of %s: clients --nkey %s,\n", a.dir.Conf(), a.dir.Seed(auth.RoleClient))
	fmt.Fprintf(w, "               nats --nkey %s, streamwal node --nkey %s\n", a.dir.Seed(auth.RoleAdmin), a.dir.Seed(auth.RoleNode))
}
