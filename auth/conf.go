package auth

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/streamwal/streamwal"
)

// describe says in one line what each role is for, in auth.conf.
var describe = map[Role]string{
	RoleCoordinator: "the coordinator: its KV buckets, walapi.<c>.coord.>, requests to nodes",
	RoleNode:        "a node: publishes into wal.<c>.>, its streams, checkpoints, segments, node subjects",
	RoleClient:      "a client: append, broadcast and status requests, read-only consumers and gets",
	RoleAdmin:       "an operator: everything",
}

// Conf renders nats-server's authorization block for s: one nkey user per
// role, keys[role] its public key, with the role's permissions. Every
// role needs a valid user public key.
func (s Spec) Conf(keys map[Role]string) ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# NATS users of streamwal cluster %q (%s), written by `streamwal auth init`.\n",
		s.Cluster, s.describePChannels())
	b.WriteString("# Add `include auth.conf` to nats-server.conf (a path relative to that file)\n" +
		"# and connect each component with its seed: --nkey <dir>/<role>.nk.\n")
	b.WriteString("authorization {\n  users = [\n")
	for _, r := range Roles {
		if !nkeys.IsValidPublicUserKey(keys[r]) {
			return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "role %s: %q is not an nkey user public key", r, keys[r])
		}
		p, err := s.Permissions(r)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "    # %s: %s\n    {\n      nkey: %s\n      permissions: {\n", r, describe[r], strconv.Quote(keys[r]))
		writeList(&b, "publish", p.Publish.Allow)
		writeList(&b, "subscribe", p.Subscribe.Allow)
		if p.Response != nil {
			fmt.Fprintf(&b, "        allow_responses: { max: %d, expires: %s }\n", p.Response.MaxMsgs,
				strconv.Quote(p.Response.Expires.String()))
		}
		b.WriteString("      }\n    }\n")
	}
	b.WriteString("  ]\n}\n")
	return b.Bytes(), nil
}

// writeList writes one permission's allow list.
func writeList(b *bytes.Buffer, name string, allow []string) {
	fmt.Fprintf(b, "        %s: {\n          allow: [\n", name)
	for _, s := range allow {
		fmt.Fprintf(b, "            %s\n", strconv.Quote(s))
	}
	b.WriteString("          ]\n        }\n")
}

// describePChannels names s's PChannels briefly.
func (s Spec) describePChannels() string {
	switch n := len(s.PChannels); n {
	case 0:
		return "no PChannels"
	case 1:
		return "PChannel " + s.PChannels[0].String()
	default:
		return fmt.Sprintf("%d PChannels %s .. %s", n, s.PChannels[0], s.PChannels[n-1])
	}
}

// LoadUsers reads the nkey users (with their permissions) of a
// nats-server configuration file such as auth.conf, parsed by
// nats-server's own parser: what the file gives a standalone server is
// what it gives the embedded one.
func LoadUsers(path string) ([]*server.NkeyUser, error) {
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: read %s: %w", path, err)
	}
	if len(opts.Nkeys) == 0 {
		return nil, streamwal.Errorf(streamwal.CodeInvalidArgument, "auth: %s defines no nkey users", path)
	}
	return opts.Nkeys, nil
}
