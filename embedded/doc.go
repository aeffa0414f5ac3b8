// Package embedded runs an in-process NATS server with JetStream enabled.
//
// It serves two purposes: the standalone mode of streamwal, where the
// write-ahead log runs against a JetStream server living in the same process,
// and the test suites of the whole repository, which need a real JetStream
// server (or a three-node JetStream cluster) that starts in milliseconds,
// stores its data in a temporary directory and can be restarted to inject
// faults.
//
// The package deliberately imports nothing from the rest of the streamwal
// module so that every other package, including its tests, can depend on it.
//
// # Starting a server
//
// [Start] validates [Options], starts the server and blocks until it accepts
// client connections and JetStream is enabled. [StartTest] is the test
// variant: it stores data in t.TempDir(), listens on a free loopback port and
// shuts the server down when the test ends. [StartCluster] and
// [StartTestCluster] do the same for a JetStream cluster of (by default) three
// servers connected by routes on loopback.
//
// [Server.Restart], [Cluster.StopServer] and [Cluster.RestartServer] stop and
// start servers on the same ports and store directories, so that JetStream
// data survives and clients reconnect to the same URL.
//
// # Durability modes
//
// JetStream file storage acknowledges a published message once it has been
// written. What "written" means depends on [Options.SyncAlways]:
//
//   - SyncAlways false (the nats-server default): the message is written to
//     the operating system (page cache) before the acknowledgement, and the
//     server calls fsync in the background every two minutes (nats-server's
//     default sync_interval). Acknowledged data survives a crash of the
//     process, but not a crash of the machine or a power loss: up to the last
//     sync interval of acknowledged data can then be lost.
//   - SyncAlways true (nats-server option SyncAlways, configuration
//     "sync_interval: always"): every write is fsynced before it is
//     acknowledged. Acknowledged data survives a machine crash, at the cost of
//     one fsync per write. For replicated streams nats-server fsyncs the Raft
//     log on every write and syncs the stream store itself when it takes a
//     snapshot, which is equally safe. A stream created with the
//     asynchronous persist mode (StreamConfig.PersistMode) opts out of
//     SyncAlways.
//
// # Logging
//
// nats-server's log output is forwarded to a [zerolog.Logger] with the field
// component=nats-server. A fatal nats-server log line (for example a failure
// to bind its port) is logged at fatal level without exiting the process and
// makes [Start] fail.
package embedded
