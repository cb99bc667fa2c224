package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
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
	op := newOpening()
	opts.FS = gateFS{opts.FS, op}
	watchBackgroundErrors(opts.EventListener, cfg.Logger.With("component", "pebble"), op)
	separateValues(opts, cfg.ValueSeparationMinBytes)
	opts.EnsureDefaults()
	for i := range opts.Levels {
		// Whole-key bloom filters make point lookups of index keys (every
		// compare and put) skip sstables that cannot hold the key.
		opts.Levels[i].FilterPolicy = bloomPolicy
		opts.Levels[i].FilterType = pebble.TableFilter
	}
	return openOrFail(cfg, opts, op)
}

// openOrFail opens Pebble, failing as soon as a flush fails while it
// opens. Pebble's Open flushes what it replays from the write-ahead log
// and waits for that flush, which it retries for ever: on a full disk a
// node restarted after a crash hung in Open, logging every failed attempt
// (about 50 lines a second), and never served. etcd exits in that case,
// and so does brainnode (the error names the disk, its free space and
// what the log held): the operator frees space and starts it again.
//
// The failed flush's files are removed, and Pebble's retry, which would
// create more, is held at its first file creation (gateFS) until the
// process exits: a failed start leaves the data directory as it found it.
func openOrFail(cfg Config, opts *pebble.Options, op *opening) (*pebble.DB, error) {
	type result struct {
		db  *pebble.DB
		err error
	}
	done := make(chan result, 1)
	go func() {
		db, err := pebble.Open(cfg.Dir, opts)
		done <- result{db, err}
	}()
	select {
	case r := <-done:
		op.finish()
		if r.err != nil {
			return nil, fmt.Errorf("engine: open %s: %w", cfg.Dir, describeFailure(cfg, r.err))
		}
		return r.db, nil
	case f := <-op.failed:
		for _, path := range f.files {
			if err := cfg.FS.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				cfg.Logger.Warn("could not remove a file of the failed flush", "path", path, "err", err)
			}
		}
		return nil, fmt.Errorf("engine: open %s: flushing the replayed write-ahead log failed: %w", cfg.Dir, describeFailure(cfg, f.err))
	}
}

// opening follows Pebble's Open for openOrFail: the files each flush job
// creates, and the first flush that fails.
type opening struct {
	failed chan openFailure // buffered; the first failure only
	mu     sync.Mutex
	done   bool             // Open returned: nothing more to follow; protected by mu
	jobs   map[int][]string // flush job -> the files it created; protected by mu
	hold   chan struct{}    // closed never: file creations wait on it once held
	held   bool             // a flush failed: hold file creations; protected by mu
}

type openFailure struct {
	err   error
	files []string
}

func newOpening() *opening {
	return &opening{failed: make(chan openFailure, 1), jobs: make(map[int][]string), hold: make(chan struct{})}
}

func (o *opening) created(job int, reason, path string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.done && reason == "flushing" {
		o.jobs[job] = append(o.jobs[job], path)
	}
}

// flushEnded records a flush's end; a failed flush while Pebble opens
// holds further file creations and reports the failure.
func (o *opening) flushEnded(job int, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return
	}
	files := o.jobs[job]
	delete(o.jobs, job)
	if !flushFailed(err) || o.held {
		return
	}
	o.held = true
	o.failed <- openFailure{err: err, files: files}
}

func (o *opening) finish() {
	o.mu.Lock()
	o.done, o.jobs = true, nil
	o.mu.Unlock()
}

// waitIfHeld blocks a file creation for good once a flush failed during
// Open (the process is about to exit with openOrFail's error).
func (o *opening) waitIfHeld() {
	o.mu.Lock()
	held := o.held
	o.mu.Unlock()
	if held {
		<-o.hold
	}
}

// gateFS holds file creations once a flush failed during Open (opening).
type gateFS struct {
	vfs.FS
	o *opening
}

func (fs gateFS) Unwrap() vfs.FS { return fs.FS }

func (fs gateFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	fs.o.waitIfHeld()
	return fs.FS.Create(name, category)
}

// flushFailed reports whether a flush's error is a failure: Pebble reports
// a flush that wrote no table (its memtables held only deletions of
// nothing, or nothing) as "pebble: empty table".
func flushFailed(err error) bool {
	return err != nil && err.Error() != "pebble: empty table"
}

// ErrNoSpace reports a full disk: the node cannot start (or write) until
// space is freed on the data directory's file system.
var ErrNoSpace = errors.New("engine: no space left on the data directory's disk")

// ErrLocked is returned by Open when another process has the store open.
var ErrLocked = errors.New("engine: store locked")

// describeFailure adds, to an error caused by a full disk, the disk's free
// space and the size of the write-ahead log that opening must flush.
func describeFailure(cfg Config, err error) error {
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK) || strings.Contains(err.Error(), "lock held by current process") {
		// Pebble's LOCK file is held: flock answers EWOULDBLOCK.
		return fmt.Errorf("%w: the data directory is locked by another process (is another node running on the same --data-dir?)", ErrLocked)
	}
	if !errors.Is(err, syscall.ENOSPC) {
		return err
	}
	var wal int64
	if names, lerr := cfg.FS.List(cfg.Dir); lerr == nil {
		for _, n := range names {
			if strings.HasSuffix(n, ".log") {
				if st, serr := cfg.FS.Stat(cfg.FS.PathJoin(cfg.Dir, n)); serr == nil {
					wal += st.Size()
				}
			}
		}
	}
	free := "unknown"
	if u, uerr := cfg.FS.GetDiskUsage(cfg.Dir); uerr == nil {
		free = fmt.Sprintf("%d MiB", u.AvailBytes>>20)
	}
	return fmt.Errorf("%w (%w); free: %s, write-ahead log files: %d MiB (opening flushes up to that much)", ErrNoSpace, err, free, wal>>20)
}

// watchBackgroundErrors makes l log failed flushes and compactions and
// Pebble's background errors at most once every backgroundErrorEvery (a
// failing disk fails every retry, hundreds a second), with the count of
// the ones not logged, and tells op about flush jobs.
func watchBackgroundErrors(l *pebble.EventListener, log *slog.Logger, op *opening) {
	th := &throttle{every: backgroundErrorEvery}
	flushEnd, compactionEnd := l.FlushEnd, l.CompactionEnd
	tableCreated, blobCreated := l.TableCreated, l.BlobFileCreated
	l.TableCreated = func(i pebble.TableCreateInfo) {
		op.created(i.JobID, i.Reason, i.Path)
		if tableCreated != nil {
			tableCreated(i)
		}
	}
	l.BlobFileCreated = func(i pebble.BlobFileCreateInfo) {
		op.created(i.JobID, i.Reason, i.Path)
		if blobCreated != nil {
			blobCreated(i)
		}
	}
	l.FlushEnd = func(i pebble.FlushInfo) {
		if !flushFailed(i.Err) || th.allow() {
			if flushEnd != nil {
				flushEnd(i)
			}
		}
		op.flushEnded(i.JobID, i.Err)
	}
	l.CompactionEnd = func(i pebble.CompactionInfo) {
		if i.Err == nil || th.allow() {
			if compactionEnd != nil {
				compactionEnd(i)
			}
		}
	}
	l.BackgroundError = func(err error) {
		if n, ok := th.allowBackground(); ok {
			log.Error("storage background error", "err", err, "not_logged_since_last", n)
		}
	}
}

// backgroundErrorEvery is the least interval between two log lines of
// failed storage jobs.
const backgroundErrorEvery = 10 * time.Second

// throttle lets one event through per interval for each of two kinds
// (job ends, background errors), counting those it held back.
type throttle struct {
	every time.Duration
	mu    sync.Mutex
	last  [2]time.Time // protected by mu
	held  [2]int       // protected by mu
}

func (t *throttle) allow() bool { _, ok := t.let(0); return ok }

func (t *throttle) allowBackground() (int, bool) { return t.let(1) }

func (t *throttle) let(kind int) (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if !t.last[kind].IsZero() && now.Sub(t.last[kind]) < t.every {
		t.held[kind]++
		return 0, false
	}
	n := t.held[kind]
	t.last[kind], t.held[kind] = now, 0
	return n, true
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
			if flushFailed(i.Err) {
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
	msg := fmt.Sprintf(format, args...)
	hint := "the node stops (fail-stop) and recovers what reached the disk when it starts again"
	if strings.Contains(msg, syscall.ENOSPC.Error()) {
		hint = "the data directory's disk is full: free space on it and start the node again"
	}
	s.l.Error("fatal storage error; stopping", "err", msg, "hint", hint)
	panic(msg)
}
