// Package snapshot is brain's backup format: a consistent, logical dump of
// a store at one revision, as streamed by etcd's Maintenance.Snapshot and
// restored by "brainnode snapshot restore".
//
// # Format
//
//	magic      "brain-snapshot v1\n"
//	records    [kind byte][uvarint length][payload]...
//	  kindHeader   JSON Header
//	  kindVersion  one MVCC version (see encodeVersion)
//	  kindLease    uvarint-free: BE64 id, BE64 ttl
//	  kindEnd      empty
//	padding    zero bytes up to a multiple of 512
//	checksum   SHA-256 of everything before it (32 bytes)
//
// The padding and trailing checksum match what etcdctl's "snapshot save"
// expects of a snapshot stream, so etcdctl can save brain backups.
//
// A backup holds every version at or below its revision R that compaction
// has kept, so a restored store answers reads and watches from its
// compaction revision on, exactly as the original did at R.
package snapshot
