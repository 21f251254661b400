// Package tokentrace reads token traces of real text and replays them as
// a serving load: B requests decode documents token by token, and a
// request that finishes a document takes the next one.
//
// A trace file is little-endian uint32 records, one per document: the
// document's length n, then its n token ids (../shared/data/engram/README.md).
// Files are input from outside: every length is checked against what is
// left, so a damaged file is an error naming the record, never a panic or
// an allocation it cannot back.
package tokentrace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
)

// ErrFormat is wrapped by every error about a trace's bytes.
var ErrFormat = errors.New("tokentrace: malformed trace")

// Trace is a trace's documents, in file order.
type Trace struct {
	Docs   [][]int64
	Tokens int // over all documents
	MaxID  int64
}

// Read reads the trace file at path.
func Read(path string) (*Trace, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokentrace: %w", err)
	}
	t, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Parse decodes a trace from its bytes.
func Parse(b []byte) (*Trace, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%w: %d bytes, not whole uint32 words", ErrFormat, len(b))
	}
	words := len(b) / 4
	word := func(i int) uint32 { return binary.LittleEndian.Uint32(b[4*i:]) }
	t := &Trace{MaxID: -1}
	for i := 0; i < words; {
		n := int(word(i))
		i++
		if n == 0 || n > words-i {
			return nil, fmt.Errorf("%w: document %d at word %d has length %d, %d words are left", ErrFormat, len(t.Docs), i-1, n, words-i)
		}
		doc := make([]int64, n)
		for k := range doc {
			doc[k] = int64(word(i + k))
			t.MaxID = max(t.MaxID, doc[k])
		}
		t.Docs = append(t.Docs, doc)
		t.Tokens += n
		i += n
	}
	if len(t.Docs) == 0 {
		return nil, fmt.Errorf("%w: no documents", ErrFormat)
	}
	return t, nil
}

// Replay is a trace being decoded by a fixed batch of requests.
type Replay struct {
	t       *Trace
	next    int       // the next document to hand out
	doc     [][]int64 // per request: its document
	pos     []int     // per request: the next token's index in doc
	hist    [][]int64
	ids     [][]int64
	history int
}

// NewReplay starts batch requests on the trace's first documents. Each
// step's history holds up to history ids before each request's token, from
// the same document only (a request's history starts empty, as a new
// sequence's does).
func NewReplay(t *Trace, batch, history int) (*Replay, error) {
	if batch < 1 || batch > len(t.Docs) || history < 0 {
		return nil, fmt.Errorf("tokentrace: batch %d of a %d-document trace, history %d", batch, len(t.Docs), history)
	}
	r := &Replay{t: t, doc: make([][]int64, batch), pos: make([]int, batch), hist: make([][]int64, batch),
		ids: make([][]int64, batch), history: history}
	for b := range batch {
		r.doc[b] = t.Docs[b]
		r.ids[b] = make([]int64, 1)
	}
	r.next = batch
	return r, nil
}

// Step returns one decode step: per request the ids before its token
// (oldest first) and its token. The slices are reused by the next Step.
// ok is false once a request has no document left: the batch would
// shrink, and the replay ends there.
func (r *Replay) Step() (hist, ids [][]int64, ok bool) {
	for b := range r.doc {
		if r.pos[b] == len(r.doc[b]) {
			if r.next == len(r.t.Docs) {
				return nil, nil, false
			}
			r.doc[b], r.pos[b] = r.t.Docs[r.next], 0
			r.next++
		}
		p := r.pos[b]
		r.hist[b] = r.doc[b][max(0, p-r.history):p]
		r.ids[b][0] = r.doc[b][p]
		r.pos[b]++
	}
	return r.hist, r.ids, true
}

// Steps is how many steps a replay of batch requests gives before a
// request runs out of documents (a dry run of Step's rule).
func (t *Trace) Steps(batch int) int {
	r, err := NewReplay(t, batch, 0)
	if err != nil {
		return 0
	}
	n := 0
	for {
		if _, _, ok := r.Step(); !ok {
			return n
		}
		n++
	}
}
