package link

import (
	"fmt"
	"strings"
	"time"

	"github.com/cxltier/cxltier/tier"
)

// Stats sums a table's slots whose owners run: each process's counters
// leave the sums when it exits, as a restart's would. They are what each
// process says of itself, for an operator to read, never for acting on.
type Stats struct {
	Name      string `json:"name"`
	Processes int    `json:"processes"`
	// Deadline transfers: claims ended, those ready past their deadline,
	// and the time the link was claimed.
	Claims  uint64        `json:"claims"`
	Misses  uint64        `json:"misses"`
	Claimed time.Duration `json:"claimed_ns"`
	// Bulk transfers: bytes moved in pieces, the pieces that waited for a
	// claim, and the time they waited.
	BulkBytes  uint64        `json:"bulk_bytes"`
	BulkWaits  uint64        `json:"bulk_waits"`
	BulkWaited time.Duration `json:"bulk_waited_ns"`
	// First-token transfers: those ended, those ended past their
	// deadline, the bytes they moved in pieces, and the time their pieces
	// waited for claims.
	FirstTransfers uint64        `json:"first_token_transfers"`
	FirstMisses    uint64        `json:"first_token_misses"`
	FirstBytes     uint64        `json:"first_token_bytes"`
	FirstWaited    time.Duration `json:"first_token_waited_ns"`
}

// ReadStats reads the table called name. A table missing is
// tier.ErrNotFound; a damaged one, ErrCorrupt.
func ReadStats(r *tier.Region, name string) (Stats, error) {
	st := Stats{Name: name}
	o, err := r.OpenObject(DirName(name))
	if err != nil {
		return st, fmt.Errorf("link: table %q: %w", name, err)
	}
	h := make([]byte, line)
	if err := r.Refresh(o.Offset, line); err != nil {
		return st, err
	}
	if err := r.ReadAt(h, o.Offset); err != nil {
		return st, err
	}
	slots, err := decodeHeader(h, o.Size)
	if err != nil {
		return st, fmt.Errorf("%w: table %q: %v", ErrCorrupt, name, err)
	}
	b := make([]byte, slotBytes)
	for i := 0; i < slots; i++ {
		off := slotAt(o.Offset, i)
		if err := r.Refresh(off, slotBytes); err != nil {
			return st, err
		}
		if err := r.ReadAt(b, off); err != nil {
			return st, err
		}
		owner := load(b, offOwner)
		if owner == 0 || !r.TokenRuns(owner) {
			continue
		}
		st.Processes++
		st.Claims += load(b, offClaims)
		st.Misses += load(b, offMisses)
		st.Claimed += time.Duration(load(b, offClaimed))
		st.BulkBytes += load(b, offBytes)
		st.BulkWaits += load(b, offWaits)
		st.BulkWaited += time.Duration(load(b, offWaited))
		st.FirstTransfers += load(b, offFirsts)
		st.FirstMisses += load(b, offFirstMis)
		st.FirstBytes += load(b, offFirstB)
		st.FirstWaited += time.Duration(load(b, offFirstW))
	}
	return st, nil
}

// Tables names the link tables in the tier's directory.
func Tables(r *tier.Region) ([]string, error) {
	var names []string
	entries, err := r.DirList() // names only: ReadStats checks each table
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if n, ok := strings.CutPrefix(e.Name, "link/"); ok && n != "" && e.Kind == tier.ObjectKind {
			names = append(names, n)
		}
	}
	return names, nil
}
