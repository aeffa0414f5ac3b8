package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// defaultServer is the NATS URL of a command given none: `streamwal
// serve`'s default address.
const defaultServer = "nats://127.0.0.1:4222"

// envNATSURL is the NATS tools' own variable for the server URLs, read
// after STREAMWAL_SERVER.
const envNATSURL = "NATS_URL"

// natsFlags are the connection flags of every command that talks to NATS
// servers: where they are and how to authenticate to them.
type natsFlags struct {
	server   string
	nkey     string
	creds    string
	user     string
	password string
	tlsCA    string
	tlsCert  string
	tlsKey   string
}

// The connection flags' names.
const (
	flagServer   = "server"
	flagNkey     = "nkey"
	flagCreds    = "creds"
	flagUser     = "user"
	flagPassword = "password"
	flagTLSCA    = "tls-ca"
	flagTLSCert  = "tls-cert"
	flagTLSKey   = "tls-key"
	flagCluster  = "cluster"
)

// envBinding says which environment variables a flag not given on the
// command line takes its value from, in order of preference.
type envBinding struct {
	flag string
	envs []string
}

// bind is the binding of flag to STREAMWAL_<FLAG> (dashes become
// underscores), then to the other variables named.
func bind(flag string, more ...string) envBinding {
	return envBinding{flag: flag, envs: append([]string{envName(flag)}, more...)}
}

// envName is STREAMWAL_ and flag in capitals, dashes as underscores.
func envName(flag string) string {
	return "STREAMWAL_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// connEnv are the environment bindings of the connection flags and
// --cluster.
var connEnv = []envBinding{
	bind(flagServer, envNATSURL), bind(flagCluster), bind(flagNkey), bind(flagCreds), bind(flagUser),
	bind(flagPassword), bind(flagTLSCA), bind(flagTLSCert), bind(flagTLSKey),
}

// connHelp is the paragraph every command that connects to NATS adds to
// its help.
const connHelp = "Connection: --server takes one or more NATS URLs, comma-separated (nats://, tls://,\n" +
	"ws:// or wss://). Authenticate with one of --creds (a credentials file), --nkey (an\n" +
	"nkey seed file) or --user with --password. --tls-ca verifies the servers'\n" +
	"certificates with a CA of your own; --tls-cert with --tls-key presents a client\n" +
	"certificate.\n\n" +
	"Environment: each of these flags, and --cluster, can be set by a STREAMWAL_*\n" +
	"variable (STREAMWAL_SERVER, STREAMWAL_CLUSTER, STREAMWAL_CREDS, STREAMWAL_NKEY,\n" +
	"STREAMWAL_USER, STREAMWAL_PASSWORD, STREAMWAL_TLS_CA, STREAMWAL_TLS_CERT,\n" +
	"STREAMWAL_TLS_KEY); --server also by NATS_URL, after STREAMWAL_SERVER. A flag given on\n" +
	"the command line wins over its variable, and a variable over the flag's default.\n" +
	"Prefer STREAMWAL_PASSWORD to --password: the command line is visible to other users."

// addConnHelp appends connHelp to cmd's long help (after its short one
// when it has none).
func addConnHelp(cmd *cobra.Command) {
	long := cmd.Long
	if long == "" {
		long = cmd.Short + "."
	}
	cmd.Long = long + "\n\n" + connHelp
}

// add registers the connection flags on fs.
func (f *natsFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&f.server, flagServer, defaultServer, "NATS server URLs, comma-separated (env STREAMWAL_SERVER, then NATS_URL)")
	fs.StringVar(&f.creds, flagCreds, "", "NATS credentials file (user JWT and nkey seed) to authenticate with (env STREAMWAL_CREDS)")
	fs.StringVar(&f.nkey, flagNkey, "", "nkey seed file of the NATS user to authenticate as (env STREAMWAL_NKEY)")
	fs.StringVar(&f.user, flagUser, "", "NATS user name, with --password (env STREAMWAL_USER)")
	fs.StringVar(&f.password, flagPassword, "", "NATS user's password, with --user (env STREAMWAL_PASSWORD)")
	fs.StringVar(&f.tlsCA, flagTLSCA, "", "CA certificate file (PEM) to verify the servers' certificates with (env STREAMWAL_TLS_CA)")
	fs.StringVar(&f.tlsCert, flagTLSCert, "", "client certificate file (PEM), with --tls-key (env STREAMWAL_TLS_CERT)")
	fs.StringVar(&f.tlsKey, flagTLSKey, "", "client certificate's private key file (PEM), with --tls-cert (env STREAMWAL_TLS_KEY)")
}

// applyEnv sets every flag of fs that the command line did not give from
// the first of its environment variables that is set (and not empty), so
// that the command line wins over the environment, and the environment
// over the defaults. A value the flag refuses is an error naming the
// variable.
func applyEnv(fs *pflag.FlagSet, bindings []envBinding) error {
	for _, b := range bindings {
		fl := fs.Lookup(b.flag)
		if fl == nil || fl.Changed {
			continue
		}
		for _, env := range b.envs {
			v, ok := os.LookupEnv(env)
			if !ok || v == "" {
				continue
			}
			if err := fs.Set(b.flag, v); err != nil {
				return fmt.Errorf("%s=%q (for --%s): %w", env, v, b.flag, err)
			}
			if fl.Annotations == nil {
				fl.Annotations = map[string][]string{}
			}
			fl.Annotations[annotationEnv] = []string{env}
			break
		}
	}
	return nil
}

// annotationEnv annotates a flag set from the environment with the
// variable's name.
const annotationEnv = "streamwal-env"

// origin names where a flag's value came from: "--name", or "--name (from
// VAR)" when an environment variable set it.
func origin(fs *pflag.FlagSet, name string) string {
	if fl := fs.Lookup(name); fl != nil {
		if env := fl.Annotations[annotationEnv]; len(env) > 0 {
			return fmt.Sprintf("--%s (from %s)", name, env[0])
		}
	}
	return "--" + name
}

// errConnFlags marks connection flags that do not go together or cannot
// be used.
var errConnFlags = errors.New("connection flags")

// connFlagsError is an error wrapping errConnFlags.
func connFlagsError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errConnFlags}, args...)...)
}

// natsOptions checks the connection flags (after applyEnv on fs) and
// turns them into the options of a connection: conflicting flags, URLs
// that do not parse and files that cannot be read are errors naming the
// flags (and the variables that set them), before anything is dialled.
func (f *natsFlags) natsOptions(fs *pflag.FlagSet) ([]nats.Option, error) {
	if err := checkServers(f.server); err != nil {
		return nil, connFlagsError("%s %q: %v", origin(fs, flagServer), f.server, err)
	}
	if err := f.checkCombination(fs); err != nil {
		return nil, err
	}
	var opts []nats.Option
	switch {
	case f.creds != "":
		opts = append(opts, nats.UserCredentials(f.creds))
	case f.nkey != "":
		opt, err := nats.NkeyOptionFromSeed(f.nkey)
		if err != nil {
			return nil, connFlagsError("%s %s: %v", origin(fs, flagNkey), f.nkey, err)
		}
		opts = append(opts, opt)
	case f.user != "":
		opts = append(opts, nats.UserInfo(f.user, f.password))
	}
	if f.tlsCA != "" {
		opts = append(opts, nats.RootCAs(f.tlsCA))
	}
	if f.tlsCert != "" {
		opts = append(opts, nats.ClientCert(f.tlsCert, f.tlsKey))
	}
	// Apply the options once to a scratch configuration: the TLS ones
	// read and parse their files then, so that a bad file is reported
	// with its flag rather than as a failed connection.
	var scratch nats.Options
	for _, o := range opts {
		if err := o(&scratch); err != nil {
			return nil, connFlagsError("%s: %v", f.fileFlags(fs), err)
		}
	}
	return opts, nil
}

// checkCombination refuses flags that do not go together: two ways to
// authenticate, a user without a password (or the reverse), half a client
// certificate, and files that do not exist.
func (f *natsFlags) checkCombination(fs *pflag.FlagSet) error {
	var auth []string
	if f.creds != "" {
		auth = append(auth, origin(fs, flagCreds))
	}
	if f.nkey != "" {
		auth = append(auth, origin(fs, flagNkey))
	}
	if f.user != "" || f.password != "" {
		auth = append(auth, "--user/--password")
	}
	switch {
	case len(auth) > 1:
		return connFlagsError("%s are different ways to authenticate: give one", strings.Join(auth, " and "))
	case (f.user == "") != (f.password == ""):
		return connFlagsError("%s and %s go together: give both or neither", origin(fs, flagUser), origin(fs, flagPassword))
	case (f.tlsCert == "") != (f.tlsKey == ""):
		return connFlagsError("%s and %s go together (a client certificate and its key): give both or neither",
			origin(fs, flagTLSCert), origin(fs, flagTLSKey))
	}
	for _, name := range []string{flagCreds, flagNkey, flagTLSCA, flagTLSCert, flagTLSKey} {
		path := fs.Lookup(name).Value.String()
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			return connFlagsError("%s: %v", origin(fs, name), err)
		}
	}
	return nil
}

// fileFlags names the TLS flags given, for an error in one of their
// files.
func (f *natsFlags) fileFlags(fs *pflag.FlagSet) string {
	var given []string
	for _, name := range []string{flagCreds, flagTLSCA, flagTLSCert, flagTLSKey} {
		if fs.Lookup(name).Value.String() != "" {
			given = append(given, origin(fs, name))
		}
	}
	return strings.Join(given, ", ")
}

// natsSchemes are the URL schemes a NATS client dials.
var natsSchemes = []string{"nats", "tls", "ws", "wss"}

// checkServers checks a comma-separated list of NATS URLs ("host:port"
// without a scheme is nats://).
func checkServers(list string) error {
	for s := range strings.SplitSeq(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			return errors.New("an empty URL in the list")
		}
		if !strings.Contains(s, "://") {
			s = "nats://" + s
		}
		u, err := url.Parse(s)
		if err != nil {
			return err
		}
		if !slices.Contains(natsSchemes, u.Scheme) {
			return fmt.Errorf("scheme %q: want nats, tls, ws or wss", u.Scheme)
		}
		if u.Host == "" {
			return fmt.Errorf("%q has no host", s)
		}
	}
	return nil
}

// authHint explains a connection refused for its credentials.
func authHint(err error) string {
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		return " (the servers refused the credentials: check --creds, --nkey or --user/--password)"
	}
	return ""
}

// dial connects to the servers of f (after natsOptions) under name, with
// extra options after f's, reconnecting for ever.
func (f *natsFlags) dial(fs *pflag.FlagSet, name string, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := f.natsOptions(fs)
	if err != nil {
		return nil, err
	}
	opts = append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1)}, append(opts, extra...)...)
	nc, err := nats.Connect(f.server, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s %s: %w%s", f.server, f.authDesc(), err, authHint(err))
	}
	return nc, nil
}

// authDesc says how the connection authenticates, for its errors.
func (f *natsFlags) authDesc() string {
	switch {
	case f.creds != "":
		return "with credentials file " + f.creds
	case f.nkey != "":
		return "with nkey seed file " + f.nkey
	case f.user != "":
		return "as user " + f.user
	}
	return "without credentials"
}

// dialRaw opens a connection of its own to the servers of a command whose
// withClient resolved its flags (bench's raw JetStream side), with the
// same options as the client's.
func (f *connFlags) dialRaw(name string) (*nats.Conn, error) {
	if f.flags == nil {
		return nil, errors.New("dialRaw before withClient")
	}
	return f.dial(f.flags, name)
}
