// Package timetick is the TimeTick machinery of a PChannel's WAL (DESIGN.md
// §1 "TimeTick"), as plain data structures with I/O at the edges:
//
//   - [Oracle] hands out hybrid timestamps in batches; the coordinator's TSO
//     implements it over request-reply, [LocalOracle] in process.
//   - [Allocator] serves one TimeTick at a time from batches drawn from an
//     Oracle, so that every appended message gets a unique, strictly
//     increasing TimeTick without a round trip each.
//   - [AckManager] tracks allocated TimeTicks until their appends are
//     confirmed; its watermark is the largest TimeTick below which every
//     allocated one is confirmed, which is what a TimeTick message may
//     promise readers.
//   - [Syncer] decides each round of the WAL's sync loop: a persisted
//     TimeTick message when data landed since the last one, otherwise a
//     live tick on core NATS, and only while that is sound.
package timetick
