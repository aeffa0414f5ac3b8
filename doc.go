// Package streamwal is the leaf vocabulary of the streamwal write-ahead log:
// the channel model (Cluster, PChannel, VChannel and the CChannel), the typed
// errors with stable codes that cross the request-reply hop, and every NATS
// name the system uses (streams, subjects, KV buckets, object stores).
//
// Every other package of the module imports this one and it imports none of
// them. Nothing else in the code base formats a subject, stream or bucket
// name: they all come from the methods of [Cluster] in subjects.go, so that an
// operator can rely on one documented namespace:
//
//	stream   WAL_<cluster>_<pchannel>             subjects wal.<cluster>.<pchannel>.>
//	vchannel wal.<cluster>.<pchannel>.v.<suffix>.<type>
//	pchannel wal.<cluster>.<pchannel>.p.<type>
//	live     wallive.<cluster>.<pchannel>.tick     (core NATS, never stored)
//	api      walapi.<cluster>.append.<pchannel>    (answered by the owner)
//	         walapi.<cluster>.coord.<op>           (answered by the active coordinator)
//	         walapi.<cluster>.node.<node>.<op>     (answered by one node)
//	kv       wal_<cluster>_<bucket>
//	objects  wal_<cluster>_segments
//
// Channel names follow DESIGN.md: a PChannel is "<prefix>-<index>" (for
// example "pchan-3"), a VChannel is "<pchannel>_<collectionID>v<shard>" (for
// example "pchan-3_42v0") and the control channel of a cluster is
// "<pchannel>_vcchan". Names are validated by the constructors and parsers;
// an invalid name is an [ErrInvalidName] error.
package streamwal
