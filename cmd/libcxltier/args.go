package main

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/cxltier/cxltier/prefix"
)

// Argument checking for the C calls, on Go types so that tests and fuzz
// targets reach it without cgo. A C caller's pointers are trusted to span
// the counts it gives; everything else — signs, limits, missing pointers,
// sizes — is checked here before any memory is touched.

// Limits on what one call may name.
const (
	maxKeys   = 1 << 24
	maxBuffer = 1 << 40
	maxSeqs   = 1 << 20
	maxSeqIDs = 1 << 24
)

// keysAt views n 32-byte keys at p.
func keysAt(p unsafe.Pointer, n int64) ([]prefix.Key, error) {
	if n < 0 || n > maxKeys || (n > 0 && p == nil) {
		return nil, fmt.Errorf("%w: %d keys at %p", errBadArg, n, p)
	}
	if n == 0 {
		return nil, nil
	}
	return unsafe.Slice((*prefix.Key)(p), int(n)), nil
}

// buffersAt views n caller buffers: ptrs[i] (an array of n pointers at
// ptrs) with sizes[i] bytes (an array of n int64 at sizes).
func buffersAt(ptrs, sizes unsafe.Pointer, n int64) ([][]byte, error) {
	if n < 0 || n > maxKeys {
		return nil, fmt.Errorf("%w: %d buffers", errBadArg, n)
	}
	if n == 0 {
		return nil, nil
	}
	if ptrs == nil || sizes == nil {
		return nil, fmt.Errorf("%w: no buffers for %d keys", errBadArg, n)
	}
	ps := unsafe.Slice((*unsafe.Pointer)(ptrs), int(n))
	ns := unsafe.Slice((*int64)(sizes), int(n))
	out := make([][]byte, n)
	for i := range out {
		if ns[i] < 0 || ns[i] > maxBuffer || (ns[i] > 0 && ps[i] == nil) {
			return nil, fmt.Errorf("%w: buffer %d: %d bytes at %p", errBadArg, i, ns[i], ps[i])
		}
		if ns[i] > 0 {
			out[i] = unsafe.Slice((*byte)(ps[i]), int(ns[i]))
		} else {
			out[i] = []byte{}
		}
	}
	return out, nil
}

// int64sAt views n int64 values at p (nil when n is 0).
func int64sAt(p unsafe.Pointer, n int64) []int64 {
	if n == 0 || p == nil {
		return nil
	}
	return unsafe.Slice((*int64)(p), int(n))
}

// sequencesAt splits the ids at ids into nseq sequences of lens[i] ids
// (lens: an array of nseq int64).
func sequencesAt(ids, lens unsafe.Pointer, nseq int64) ([][]int64, error) {
	if nseq < 0 || nseq > maxSeqs || (nseq > 0 && lens == nil) {
		return nil, fmt.Errorf("%w: %d sequences", errBadArg, nseq)
	}
	ls := int64sAt(lens, nseq)
	var total int64
	for i, n := range ls {
		if n < 0 || n > maxSeqIDs || total+n > maxSeqIDs {
			return nil, fmt.Errorf("%w: sequence %d has %d ids (%d before it)", errBadArg, i, n, total)
		}
		total += n
	}
	if total > 0 && ids == nil {
		return nil, fmt.Errorf("%w: no ids for %d", errBadArg, total)
	}
	all := int64sAt(ids, total)
	out := make([][]int64, nseq)
	for i, n := range ls {
		out[i], all = all[:n], all[n:]
	}
	return out, nil
}

// int32sAt views n int32 values at p (nil when n is 0).
func int32sAt(p unsafe.Pointer, n int) []int32 {
	if n == 0 || p == nil {
		return nil
	}
	return unsafe.Slice((*int32)(p), n)
}

// stepAt reads a top-k step's batch: batch request indices at reqs and
// their sequence lengths at lens (int64 each), requests below maxReq.
func stepAt(reqs, lens unsafe.Pointer, batch int64, maxReq int) ([]int, []int64, error) {
	if batch < 0 || batch > int64(maxReq) || (batch > 0 && (reqs == nil || lens == nil)) {
		return nil, nil, fmt.Errorf("%w: batch of %d requests (pool has %d)", errBadArg, batch, maxReq)
	}
	rs := make([]int, batch)
	for i, r := range int64sAt(reqs, batch) {
		if r < 0 || r >= int64(maxReq) {
			return nil, nil, fmt.Errorf("%w: batch entry %d: request %d outside [0, %d)", errBadArg, i, r, maxReq)
		}
		rs[i] = int(r)
	}
	return rs, int64sAt(lens, batch), nil
}

// piecesAt views n keys' buffers of per pieces each: ptrs and sizes hold
// n*per entries, key-major.
func piecesAt(ptrs, sizes unsafe.Pointer, n, per int64) ([][][]byte, error) {
	if n < 0 || per < 1 || per > maxKeys || n > maxKeys/per {
		return nil, fmt.Errorf("%w: %d keys of %d pieces", errBadArg, n, per)
	}
	flat, err := buffersAt(ptrs, sizes, n*per)
	if err != nil {
		return nil, err
	}
	out := make([][][]byte, n)
	for i := range out {
		out[i] = flat[int64(i)*per : int64(i+1)*per : int64(i+1)*per]
	}
	return out, nil
}

// joinedAt views n strings joined by NUL bytes in textLen bytes at text,
// appending them to dst (reused by the caller: HiCache sends 30k pages a
// call, and a fresh slice of their headers cost more than splitting them).
func joinedAt(dst []string, text unsafe.Pointer, textLen, n int64) ([]string, error) {
	if n < 0 || n > maxKeys || textLen < 0 || textLen > maxBuffer || (textLen > 0 && text == nil) {
		return dst, fmt.Errorf("%w: %d strings in %d bytes", errBadArg, n, textLen)
	}
	if n == 0 {
		if textLen != 0 {
			return dst, fmt.Errorf("%w: no strings but %d bytes", errBadArg, textLen)
		}
		return dst, nil
	}
	all := ""
	if textLen > 0 {
		all = unsafe.String((*byte)(text), int(textLen))
	}
	switch nuls := int64(strings.Count(all, "\x00")); {
	case nuls < n-1:
		return dst, fmt.Errorf("%w: %d NUL-joined strings, want %d", errBadArg, nuls+1, n)
	case nuls > n-1:
		return dst, fmt.Errorf("%w: more than %d NUL-joined strings (a string holds a NUL)", errBadArg, n)
	}
	if out, ok := joinedEvenly(dst, all, int(n)); ok {
		return out, nil
	}
	for range n - 1 {
		i := strings.IndexByte(all, 0)
		dst, all = append(dst, all[:i]), all[i+1:]
	}
	return append(dst, all), nil
}

// joinedEvenly splits all, which holds exactly n-1 NULs, into n strings
// of one length, as SGLang's page digests are, without a search per
// string; false if they are not of one length.
func joinedEvenly(dst []string, all string, n int) ([]string, bool) {
	stride := len(all) + 1
	if stride%n != 0 {
		return dst, false
	}
	stride /= n
	for i := 1; i < n; i++ {
		if all[i*stride-1] != 0 {
			return dst, false
		}
	}
	for i := range n {
		dst = append(dst, all[i*stride:(i+1)*stride-1])
	}
	return dst, true
}

// stringsAt views n strings laid back to back at text, string i ending at
// byte ends[i] (so starting at ends[i-1], or 0).
func stringsAt(text, ends unsafe.Pointer, n int64) ([]string, error) {
	if n < 0 || n > maxKeys || (n > 0 && ends == nil) {
		return nil, fmt.Errorf("%w: %d strings", errBadArg, n)
	}
	if n == 0 {
		return nil, nil
	}
	es := unsafe.Slice((*int64)(ends), int(n))
	total := es[n-1]
	if total < 0 || total > maxBuffer || (total > 0 && text == nil) {
		return nil, fmt.Errorf("%w: %d bytes of strings", errBadArg, total)
	}
	var all string
	if total > 0 {
		all = unsafe.String((*byte)(text), int(total))
	}
	out := make([]string, n)
	var start int64
	for i, e := range es {
		if e < start || e > total {
			return nil, fmt.Errorf("%w: string %d ends at %d, after %d of %d bytes", errBadArg, i, e, start, total)
		}
		out[i] = all[start:e]
		start = e
	}
	return out, nil
}
