package stores

import (
	"strings"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// SyncCounter counts the syncs Pebble issues on its write-ahead log: the durable writes
// an operation pays for. Benchmarks divide it by the operations to report syncs/op.
type SyncCounter struct {
	wal, other atomic.Uint64
}

// WAL is the number of WAL syncs so far.
func (c *SyncCounter) WAL() uint64 { return c.wal.Load() }

// Other is the number of other syncs (sstables, manifest, directories) so far.
func (c *SyncCounter) Other() uint64 { return c.other.Load() }

// CountSyncs makes o use the on-disk filesystem wrapped to count syncs, and returns the
// counter.
func CountSyncs(o *pebble.Options) *SyncCounter {
	base := o.FS
	if base == nil {
		base = vfs.Default
	}
	c := &SyncCounter{}
	o.FS = &countingFS{FS: base, c: c}
	return c
}

type countingFS struct {
	vfs.FS
	c *SyncCounter
}

func (fs *countingFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return f, err
	}
	n := &fs.c.other
	if strings.HasSuffix(name, ".log") {
		n = &fs.c.wal
	}
	return &countingFile{File: f, n: n}, nil
}

func (fs *countingFS) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, cat)
	return fs.wrap(name, f, err)
}

func (fs *countingFS) OpenReadWrite(name string, cat vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, cat, opts...)
	return fs.wrap(name, f, err)
}

func (fs *countingFS) ReuseForWrite(oldname, newname string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, cat)
	return fs.wrap(newname, f, err)
}

func (fs *countingFS) Unwrap() vfs.FS { return fs.FS }

type countingFile struct {
	vfs.File
	n *atomic.Uint64
}

func (f *countingFile) Sync() error {
	f.n.Add(1)
	return f.File.Sync()
}

func (f *countingFile) SyncData() error {
	f.n.Add(1)
	return f.File.SyncData()
}

func (f *countingFile) SyncTo(length int64) (bool, error) {
	f.n.Add(1)
	return f.File.SyncTo(length)
}
