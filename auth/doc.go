// Package auth secures a streamwal cluster with NATS's own permissions
// (DESIGN.md §7 and §12): it derives, from the names in subjects.go, the
// publish and subscribe permissions of four roles of NATS user, writes
// them as a nats-server configuration include with one nkey user per
// role, and writes each role's seed.
//
// # Roles
//
// For a streamwal cluster c with PChannels p (streams WAL_<c>_<p>):
//
//   - coord, the coordinator: creates and reads every KV bucket
//     wal_<c>_*, writes its own state (leader, tso, assignments,
//     vchannels, broadcast, replication; not the nodes' registry nor the
//     checkpoints), answers walapi.<c>.coord.>, and asks nodes to open
//     and close PChannels (walapi.<c>.node.*.open|close) and to append
//     broadcasts (walapi.<c>.append.*).
//   - node: the only role that publishes into wal.<c>.>; creates, reads
//     and truncates (purges) its WAL streams, writes the object store
//     wal_<c>_segments and the checkpoints, registers in
//     wal_<c>_nodes, asks the coordinator for timestamps, publishes live
//     ticks (wallive.<c>.>), answers appends and node requests, and may
//     ask the servers for their JetStream settings (answered to system
//     account users only; `streamwal node --group-commit auto`).
//   - client: append requests, the coordinator requests status,
//     broadcast, broadcast-ack, allocate and release, and reads: ordered
//     (or durable) consumers and gets on the WAL streams, the object
//     store (reads below a stream's truncation point, flushed segments),
//     the checkpoints (status), live ticks. It can create no stream, write
//     no bucket, publish nothing into wal.>, and delete or purge nothing.
//   - admin: everything (the nats CLI, `streamwal pchannel accept-loss`,
//     `streamwal bench`, the coordinator's balance request).
//
// Everyone may subscribe to _INBOX.> for replies. The coordinator and the
// nodes answer requests through allow_responses (one answer per request,
// within an hour), never by publishing into inboxes at large, so no role
// but admin can forge a reply.
//
// JetStream API subjects name a stream in one token, so the permissions
// name every WAL stream: they are derived for a count of PChannels
// (default 16, `--pchannels`), and a cluster created with more needs
// auth.conf written again. [Dir.Users] checks that a directory covers a
// cluster before a server uses it.
//
// # Deploying
//
// Run `streamwal auth init --dir D [--cluster c] [--pchannels n]` once. It
// writes D/auth.conf and the seeds D/coord.nk, D/node.nk, D/client.nk and
// D/admin.nk (mode 0600 in a 0700 directory; an existing seed is never
// replaced without --force). Then either:
//
//   - on your own nats-server (or cluster): add `include auth.conf` to
//     each server's configuration (the path is relative to that file; the
//     servers need auth.conf only, never a seed) and start coordinators
//     with `--nkey D/coord.nk`, nodes with `--nkey D/node.nk`, clients
//     with `--nkey D/client.nk`, the nats CLI with `--nkey D/admin.nk`;
//   - or all in one process: `streamwal serve --auth-dir D` gives the
//     embedded server auth.conf's users and connects its own coordinator
//     and node with coord.nk and node.nk; clients use `--nkey D/client.nk`.
//
// Hand each process only its own seed. Add TLS on the servers for
// transport security (nats-server's tls block; embedded.Options.TLS for
// the embedded server): nkeys authenticate but do not encrypt.
//
// # Limits
//
// Users share one account, so a role that may subscribe to _INBOX.> can
// see replies meant for others (never forge them). A role that may create
// consumers on a stream (client, node) could give a push consumer a
// deliver subject it may not publish to, since nats-server does not check
// it against the creator's permissions: a client seed is not a credential
// to hand to an untrusted party; isolate such parties in an account of
// their own.
package auth
