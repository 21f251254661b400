// Package procmaps reads /proc/PID/maps: which files a process maps, and
// where. The CUDA engine asks it what a range of memory is before it
// explains a refused pin; the tier's reaper asks it whether a process maps
// the tier before it would signal it.
package procmaps

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End uint64 // [Start, End)
	Perms      string // e.g. "rw-s"
	Offset     uint64
	Major      uint32 // device of the mapped file's file system
	Minor      uint32
	Inode      uint64
	// Path of the mapped file as the mapping process saw it, without a
	// " (deleted)" suffix; "" for anonymous memory, or a [name] such as
	// [heap] for the kernel's own.
	Path    string
	Deleted bool
}

// Contains reports whether addr lies in the mapping.
func (m Mapping) Contains(addr uint64) bool { return addr >= m.Start && addr < m.End }

// Shared reports whether the mapping is shared (writes reach the file).
func (m Mapping) Shared() bool { return len(m.Perms) == 4 && m.Perms[3] == 's' }

// File reports whether the mapping maps a file.
func (m Mapping) File() bool { return m.Inode != 0 && strings.HasPrefix(m.Path, "/") }

// Range is the mapping's name in /proc/PID/map_files.
func (m Mapping) Range() string { return fmt.Sprintf("%x-%x", m.Start, m.End) }

// Parse parses one line: "start-end perms offset major:minor inode [path]".
// The path may contain spaces.
func Parse(line []byte) (Mapping, error) {
	var m Mapping
	rest := line
	field := func() (string, bool) {
		rest = bytes.TrimLeft(rest, " \t")
		i := bytes.IndexAny(rest, " \t")
		if i < 0 {
			i = len(rest)
		}
		f := string(rest[:i])
		rest = rest[i:]
		return f, f != ""
	}
	bad := func(what string) (Mapping, error) {
		return Mapping{}, fmt.Errorf("procmaps: %s in %q", what, line)
	}
	rng, ok1 := field()
	perms, ok2 := field()
	off, ok3 := field()
	dev, ok4 := field()
	ino, ok5 := field()
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return bad("fewer than five fields")
	}
	lo, hi, ok := strings.Cut(rng, "-")
	var err1, err2, err3, err4 error
	m.Start, err1 = strconv.ParseUint(lo, 16, 64)
	m.End, err2 = strconv.ParseUint(hi, 16, 64)
	if !ok || err1 != nil || err2 != nil || m.End < m.Start {
		return bad("a bad range")
	}
	m.Perms = perms
	m.Offset, err3 = strconv.ParseUint(off, 16, 64)
	m.Inode, err4 = strconv.ParseUint(ino, 10, 64)
	if err3 != nil || err4 != nil {
		return bad("a bad offset or inode")
	}
	maj, min, ok := strings.Cut(dev, ":")
	ma, err5 := strconv.ParseUint(maj, 16, 32)
	mi, err6 := strconv.ParseUint(min, 16, 32)
	if !ok || err5 != nil || err6 != nil {
		return bad("a bad device")
	}
	m.Major, m.Minor = uint32(ma), uint32(mi)
	m.Path = string(bytes.TrimLeft(rest, " \t"))
	if p, ok := strings.CutSuffix(m.Path, " (deleted)"); ok {
		m.Path, m.Deleted = p, true
	}
	return m, nil
}

// Each calls fn for every mapping read from r until fn returns false. A
// line it cannot parse is an error: the caller acts on what it finds, and
// a half-read list must not pass for a whole one.
func Each(r io.Reader, fn func(Mapping) bool) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		m, err := Parse(sc.Bytes())
		if err != nil {
			return err
		}
		if !fn(m) {
			return nil
		}
	}
	return sc.Err()
}

// Of reads the mappings of process pid ("self" for this process's own)
// and calls fn for each, as Each.
func Of(pid string, fn func(Mapping) bool) error {
	f, err := os.Open("/proc/" + pid + "/maps")
	if err != nil {
		return err
	}
	defer f.Close()
	if err := Each(f, fn); err != nil {
		return fmt.Errorf("procmaps: /proc/%s/maps: %w", pid, err)
	}
	return nil
}

// At returns this process's mapping holding addr; false if none does.
func At(addr uint64) (Mapping, bool, error) {
	var found Mapping
	ok := false
	err := Of("self", func(m Mapping) bool {
		if m.Contains(addr) {
			found, ok = m, true
			return false
		}
		return true
	})
	return found, ok, err
}
