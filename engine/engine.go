package engine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Config configures the node's Pebble. The zero value is usable: every zero
// field takes its default.
type Config struct {
	// Dir is the Pebble directory. Required.
	Dir string
	// FS is the filesystem; default vfs.Default. Tests use vfs.NewMem().
	FS vfs.FS
	// CacheBytes is the block cache size in bytes; default 128 MiB, enough
	// to keep index keys and recent versions of a Kubernetes-sized dataset
	// hot on a small machine.
	CacheBytes int64
	// MemTableBytes is the memtable size; default 64 MiB, so bursts of
	// writes (1 KiB values at tens of thousands per second) do not stall on
	// flushes.
	MemTableBytes uint64
	// ValueSeparationMinBytes: values of user data (MVCCPrefix and above)
	// this large or larger are written to blob files at flush, and
	// compactions move a small reference instead of the value (see
	// separation.go). Default 256 bytes; negative: every value stays in
	// its sstable.
	ValueSeparationMinBytes int
	// Logger receives Pebble's log lines; default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills zero fields.
func (c *Config) EnsureDefaults() {
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.CacheBytes == 0 {
		c.CacheBytes = 128 << 20
	}
	if c.MemTableBytes == 0 {
		c.MemTableBytes = 64 << 20
	}
	if c.ValueSeparationMinBytes == 0 {
		c.ValueSeparationMinBytes = DefaultValueSeparationMinBytes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Open opens (creating if needed) the node's Pebble.
func Open(cfg Config) (*pebble.DB, error) {
	cfg.EnsureDefaults()
	if cfg.Dir == "" {
		return nil, fmt.Errorf("engine: Dir is required")
	}
	cache := pebble.NewCache(cfg.CacheBytes)
	defer cache.Unref()
	opts := &pebble.Options{
		FS:                          bufferedFS{cfg.FS},
		Cache:                       cache,
		MemTableSize:                cfg.MemTableBytes,
		MemTableStopWritesThreshold: 4,
		L0CompactionThreshold:       4,
		L0StopWritesThreshold:       1000,
		LBaseMaxBytes:               64 << 20,
		FormatMajorVersion:          pebble.FormatNewest,
		Logger:                      slogLogger{cfg.Logger.With("component", "pebble")},
	}
	if cfg.Logger.Enabled(context.Background(), slog.LevelDebug) {
		// Every flush, compaction (with its reason and levels), ingestion
		// and WAL event, one line each: what --log-level debug is for when
		// the compaction counters in /metrics move more than expected.
		l := pebble.MakeLoggingEventListener(opts.Logger)
		opts.EventListener = &l
	} else {
		opts.EventListener = infoEvents(cfg.Logger.With("component", "pebble"), cfg.FS)
	}
	separateValues(opts, cfg.ValueSeparationMinBytes)
	opts.EnsureDefaults()
	for i := range opts.Levels {
		// Whole-key bloom filters make point lookups of index keys (every
		// compare and put) skip sstables that cannot hold the key.
		opts.Levels[i].FilterPolicy = bloomPolicy
		opts.Levels[i].FilterType = pebble.TableFilter
	}
	db, err := pebble.Open(cfg.Dir, opts)
	if err != nil {
		return nil, fmt.Errorf("engine: open %s: %w", cfg.Dir, err)
	}
	return db, nil
}

// longCompaction is how long a compaction runs before it is logged at
// info.
const longCompaction = 2 * time.Second

// infoEvents logs, at info, each memtable flush and each compaction that
// ran longer than longCompaction: one line per flush (a memtable's worth
// of writes) and few per compaction, so a stall of the node's raft groups
// can be lined up with the storage work around it. A line's out_bytes
// counts both the sstables and the blob files (separated values) the job
// wrote; blob_bytes is the blob files' part. Pebble reports a job's
// sstables with its end but its blob files only as they are created, so
// infoEvents keeps their paths by job and reads their sizes from fs.
func infoEvents(log *slog.Logger, fs vfs.FS) *pebble.EventListener {
	var blobs jobBlobs
	return &pebble.EventListener{
		BlobFileCreated: func(i pebble.BlobFileCreateInfo) { blobs.add(i.JobID, i.Path) },
		FlushEnd: func(i pebble.FlushInfo) {
			blob := blobs.take(i.JobID, fs)
			if i.Err != nil {
				log.Warn("memtable flush failed", "job", i.JobID, "err", i.Err)
				return
			}
			out := blob
			for _, t := range i.Output {
				out += t.Size
			}
			log.Info("memtables flushed", "job", i.JobID, "reason", i.Reason, "memtables", i.Input,
				"in_bytes", i.InputBytes, "out_bytes", out, "blob_bytes", blob, "took", i.TotalDuration.Round(time.Millisecond))
		},
		CompactionEnd: func(i pebble.CompactionInfo) {
			blob := blobs.take(i.JobID, fs)
			if i.Err != nil {
				log.Warn("compaction failed", "job", i.JobID, "reason", i.Reason, "err", i.Err)
				return
			}
			if i.TotalDuration >= longCompaction {
				out := blob
				for _, t := range i.Output.Tables {
					out += t.Size
				}
				log.Info("long compaction", "job", i.JobID, "reason", i.Reason, "to_level", i.Output.Level,
					"out_bytes", out, "blob_bytes", blob, "took", i.TotalDuration.Round(time.Millisecond))
			}
		},
	}
}

// jobBlobs holds the paths of the blob files each flush or compaction
// job created, until the job ends.
type jobBlobs struct {
	mu sync.Mutex
	m  map[int][]string // job ID -> paths; protected by mu
}

func (b *jobBlobs) add(job int, path string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = make(map[int][]string)
	}
	b.m[job] = append(b.m[job], path)
}

// take forgets job's blob files and returns their total size (a file
// that cannot be read counts 0).
func (b *jobBlobs) take(job int, fs vfs.FS) uint64 {
	b.mu.Lock()
	paths := b.m[job]
	delete(b.m, job)
	b.mu.Unlock()
	var n uint64
	for _, p := range paths {
		if st, err := fs.Stat(p); err == nil {
			n += uint64(st.Size())
		}
	}
	return n
}

// bloomPolicy uses 10 bits per key (about 1% false positives).
var bloomPolicy = bloom.FilterPolicy(10)

type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Infof(format string, args ...interface{}) {
	s.l.Debug(fmt.Sprintf(format, args...))
}
func (s slogLogger) Errorf(format string, args ...interface{}) {
	s.l.Error(fmt.Sprintf(format, args...))
}
func (s slogLogger) Fatalf(format string, args ...interface{}) {
	s.l.Error(fmt.Sprintf(format, args...))
	panic(fmt.Sprintf(format, args...))
}
