package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cxltier/cxltier/internal/tierflags"
	"github.com/cxltier/cxltier/prefix"
)

// prefixPut stores one page's payload from a file under its key: to seed an
// index by hand, or to try one, without an engine.
func prefixPut(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("prefix put", stderr, "[--name NAME] --key HEX --in FILE DEVICE...")
	f := addIndexFlags(fs, false)
	keyHex := fs.String("key", "", "the page's key, as 'prefix keys' prints it (required)")
	in := fs.String("in", "", "file holding the payload, at most the index's block size (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	k, err := pageKeyFlag(*keyHex)
	if err != nil {
		return err
	}
	if *in == "" {
		return errors.New("--in is required")
	}
	return withIndex(fs, f, true, func(s *prefix.Store) error {
		payload, err := readPayload(*in, s.BlockBytes())
		if err != nil {
			return err
		}
		st, err := s.Set([]prefix.Key{k}, [][]byte{payload})
		if err != nil {
			return err
		}
		switch st[0] {
		case prefix.Reserved:
			fmt.Fprintf(stdout, "stored %s under %s in index %q\n", tierflags.HumanSize(int64(len(payload))), k, s.Name())
		case prefix.Exists:
			fmt.Fprintf(stdout, "%s is in index %q already: left as it is\n", k, s.Name())
		default:
			return fmt.Errorf("index %q: %s: %w", s.Name(), k, prefix.ErrNoSpace)
		}
		return nil
	})
}

// prefixGet writes one page's payload to a file, checked against its
// checksum first, as every read of the index is.
func prefixGet(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("prefix get", stderr, "[--name NAME] --key HEX --out FILE DEVICE...")
	f := addIndexFlags(fs, false)
	keyHex := fs.String("key", "", "the page's key, as 'prefix keys' prints it (required)")
	out := fs.String("out", "", "file to write the payload to (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	k, err := pageKeyFlag(*keyHex)
	if err != nil {
		return err
	}
	if *out == "" {
		return errors.New("--out is required")
	}
	return withIndex(fs, f, true, func(s *prefix.Store) error {
		buf := [][]byte{make([]byte, s.BlockBytes())}
		n, err := s.Get([]prefix.Key{k}, buf)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("index %q: %s: %w", s.Name(), k, prefix.ErrNotFound)
		}
		if err := writeFileAtomic(*out, func(w io.Writer) error { _, err := w.Write(buf[0]); return err }); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s of %s from index %q to %s (checksum verified)\n", tierflags.HumanSize(int64(len(buf[0]))), k, s.Name(), *out)
		return nil
	})
}

func pageKeyFlag(text string) (prefix.Key, error) {
	if text == "" {
		return prefix.Key{}, errors.New("--key is required (a page key, as 'cxltier prefix keys' prints it)")
	}
	k, err := prefix.ParseKey(text)
	if err != nil {
		return prefix.Key{}, fmt.Errorf("--key: %w", err)
	}
	return k, nil
}

// readPayload reads a payload file, refusing one larger than the index's
// blocks before reading it.
func readPayload(path string, limit int64) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("--in %s: not a regular file", path)
	}
	if info.Size() > limit {
		return nil, fmt.Errorf("--in %s: %s, larger than the index's blocks of %s: %w", path,
			tierflags.HumanSize(info.Size()), tierflags.HumanSize(limit), prefix.ErrTooLarge)
	}
	payload, err := io.ReadAll(io.LimitReader(file, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(payload)) > limit { // it grew since the Stat
		return nil, fmt.Errorf("--in %s: larger than the index's blocks of %s: %w", path, tierflags.HumanSize(limit), prefix.ErrTooLarge)
	}
	return payload, nil
}

// writeFileAtomic writes a file at path with write, through a fresh
// temporary beside it (O_EXCL, a random name: a fixed name could be another
// run's file, or a planted link), synced, then renamed over path: a crash
// leaves the old file or the whole new one.
func writeFileAtomic(path string, write func(io.Writer) error) error {
	file, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := file.Name()
	err = write(file)
	if err == nil {
		err = file.Sync()
	}
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil { // the rename itself survives a crash
		dir.Sync()
		dir.Close()
	}
	return nil
}
