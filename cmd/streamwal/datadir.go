package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// lockFileName is the file in a data directory that `serve` holds an
// exclusive lock on while it runs.
const lockFileName = "streamwal.lock"

// errDataDirInUse says that another process holds a data directory's lock.
var errDataDirInUse = errors.New("in use by another streamwal serve")

// dataDir is a data directory opened by serve: created if it was missing,
// and locked so that no other serve uses it at the same time.
type dataDir struct {
	path string
	// created are the directories serve created, outermost first.
	created []string
	// before are the directory's entries before serve touched it (nil
	// when serve created the directory).
	before map[string]bool
	lock   *os.File
	// locked says that the lock is held: the process is the only serve
	// on the directory, so any previous one is gone.
	locked bool
}

// openDataDir creates path if it is missing and takes its lock without
// waiting: a directory in use by another process is refused with an error
// wrapping errDataDirInUse, and nothing is written to it.
func openDataDir(path string) (*dataDir, error) {
	created, err := mkdirTracked(path)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: %w", path, err)
	}
	d := &dataDir{path: path, created: created}
	if len(created) == 0 {
		if d.before, err = entryNames(path); err != nil {
			return nil, fmt.Errorf("data dir %s: %w", path, err)
		}
	}
	if err := d.takeLock(); err != nil {
		if !errors.Is(err, errDataDirInUse) {
			d.removeNewLockFile()
			removeEmptyDirs(created)
		}
		return nil, err
	}
	return d, nil
}

// takeLock opens the lock file and locks it, then records the process ID
// in it for the error a second serve prints.
func (d *dataDir) takeLock() error {
	name := filepath.Join(d.path, lockFileName)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("data dir %s: open lock file: %w", d.path, err)
	}
	held, err := tryLock(f)
	if errors.Is(err, errDataDirInUse) {
		owner := lockOwner(f)
		_ = f.Close()
		return fmt.Errorf("data dir %s is %w%s: stop it first or give another --data-dir (the lock is on %s)",
			d.path, err, owner, name)
	}
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("data dir %s: lock %s: %w", d.path, name, err)
	}
	d.lock, d.locked = f, held
	if held {
		if err := writePID(f); err != nil {
			_ = f.Close()
			return fmt.Errorf("data dir %s: write %s: %w", d.path, name, err)
		}
	}
	return nil
}

// removeNewLockFile removes the lock file if serve created it, after the
// lock could not be taken for a reason other than another holder.
func (d *dataDir) removeNewLockFile() {
	if !d.before[lockFileName] {
		_ = os.Remove(filepath.Join(d.path, lockFileName))
	}
}

// writePID replaces the lock file's content with this process's ID.
func writePID(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return err
}

// lockOwner describes the process a lock file names (" (pid N)"), or is
// empty when it names none.
func lockOwner(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return ""
	}
	return fmt.Sprintf(" (pid %d)", pid)
}

// release lets the directory go after serve ran: its data stays. Closing
// the lock file releases the lock (the kernel does the same when the
// process dies).
func (d *dataDir) release() error {
	if err := d.lock.Close(); err != nil {
		return fmt.Errorf("data dir %s: close lock file: %w", d.path, err)
	}
	return nil
}

// abandon undoes what serve did to the directory when it failed to start,
// while it still holds the lock: the directories it created go, or, in a
// directory that existed, the entries it added (the lock file, the store
// nats-server created); what was there before is never touched.
func (d *dataDir) abandon() error {
	err := d.removeAdded()
	if cerr := d.release(); err == nil {
		err = cerr
	}
	return err
}

// removeAdded removes what serve added to the directory.
func (d *dataDir) removeAdded() error {
	if len(d.created) > 0 {
		if err := os.RemoveAll(d.created[0]); err != nil {
			return fmt.Errorf("remove data dir %s that serve created: %w", d.created[0], err)
		}
		return nil
	}
	names, err := entryNames(d.path)
	if err != nil {
		return fmt.Errorf("data dir %s: %w", d.path, err)
	}
	for name := range names {
		if d.before[name] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(d.path, name)); err != nil {
			return fmt.Errorf("data dir %s: remove %s that serve created: %w", d.path, name, err)
		}
	}
	return nil
}

// mkdirTracked creates path and any missing parents and returns the
// directories it created itself, outermost first (none when path existed;
// one another process created meanwhile is not counted).
func mkdirTracked(path string) ([]string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	missing, err := missingDirs(abs)
	if err != nil {
		return nil, err
	}
	var created []string
	for _, dir := range missing {
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			created = append(created, dir)
			continue
		}
		if !errors.Is(err, fs.ErrExist) {
			removeEmptyDirs(created)
			return nil, err
		}
	}
	if info, err := os.Stat(abs); err != nil || !info.IsDir() {
		removeEmptyDirs(created)
		return nil, fmt.Errorf("not a directory")
	}
	return created, nil
}

// missingDirs lists abs and its ancestors that do not exist, outermost
// first.
func missingDirs(abs string) ([]string, error) {
	var missing []string
	for dir := abs; ; dir = filepath.Dir(dir) {
		_, err := os.Stat(dir)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		missing = append([]string{dir}, missing...)
		if filepath.Dir(dir) == dir {
			break
		}
	}
	return missing, nil
}

// removeEmptyDirs removes the directories created (outermost first),
// innermost first, each only if it is empty.
func removeEmptyDirs(created []string) {
	for i := len(created) - 1; i >= 0; i-- {
		_ = os.Remove(created[i])
	}
}

// entryNames are the names of the entries of dir.
func entryNames(dir string) (map[string]bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make(map[string]bool, len(entries))
	for _, e := range entries {
		names[e.Name()] = true
	}
	return names, nil
}
