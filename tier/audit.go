package tier

import (
	"fmt"
	"sort"
	"sync/atomic"
	"time"
)

// Audit cross-checks the region's structures against each other and
// returns every inconsistency it finds, changing nothing: directory entries
// (readable, not torn, names unique, spans chunk-aligned, inside the data
// area and disjoint; named objects' headers decode), the allocator (bitmap and owner words agree; owners
// name a lease slot or the shared owner; a directory object's chunks are
// allocated and shared; a private chunk's owner holds a lease), locks (held
// by a live lease) and leases (a live lease heartbeats; one daemon per
// node). Damage a reader survives silently shows here.
func (r *Region) Audit() []string {
	var out []string
	for _, f := range r.AuditFindings() {
		out = append(out, f.Msg)
	}
	return out
}

// FindingKind is what an audit finding is about, for tools that act on
// findings (cxltier repair) without reading their text.
type FindingKind string

const (
	FindOrphanLock FindingKind = "orphan-lock" // a lock held by no live client
	FindDeadLease  FindingKind = "dead-lease"  // a live lease whose client is gone
	FindLeak       FindingKind = "leaked-chunk"
	FindDirectory  FindingKind = "directory" // a directory entry damaged, torn or overlapping
	FindAllocator  FindingKind = "allocator" // bitmap and owner words disagree
	FindDaemons    FindingKind = "daemons"   // more than one daemon on a node
	FindClosed     FindingKind = "closed"    // the region could not be audited
)

// Repairable reports whether reaping fixes findings of kind k (what
// cxltier repair and a daemon's reaper do); the others need a person.
func (k FindingKind) Repairable() bool { return k == FindOrphanLock || k == FindDeadLease }

// Finding is one inconsistency an audit found.
type Finding struct {
	Kind FindingKind `json:"kind"`
	Msg  string      `json:"message"`
}

// AuditFindings is Audit with each finding's kind.
func (r *Region) AuditFindings() []Finding {
	if err := r.live("audit"); err != nil {
		return []Finding{{FindClosed, err.Error()}}
	}
	var out []Finding
	report := func(k FindingKind) func(string, ...any) {
		return func(f string, a ...any) {
			if len(out) < 1000 {
				out = append(out, Finding{k, fmt.Sprintf(f, a...)})
			}
		}
	}
	spans := r.auditDirectory(report(FindDirectory))
	r.auditChunks(spans, report)
	for _, l := range r.Locks() {
		if l.Orphan {
			report(FindOrphanLock)("lock %d: held by slot %d, which is no live client", l.ID, l.Holder)
		}
	}
	r.auditLeases(report)
	return out
}

// dirSpan is a directory object's chunks.
type dirSpan struct {
	name        string
	first, last int64 // chunk indexes, inclusive
}

func (r *Region) auditDirectory(report func(string, ...any)) []dirSpan {
	var spans []dirSpan
	names := map[string]int{}
	for i := 0; i < r.l.DirEntries; i++ {
		e, err := r.readDir(i)
		switch {
		case err != nil:
			report("directory entry %d: %v", i, err)
			continue
		case e.torn():
			report("directory entry %d is torn (a writer died mid-update); its object's chunks are unaccounted for", i)
			continue
		case e.empty():
			continue
		}
		if j, dup := names[e.Name]; dup {
			report("directory entries %d and %d both name %q", j, i, e.Name)
		}
		names[e.Name] = i
		for k, run := range e.runs() {
			first, err := r.chunkIndex(Offset(run[0]))
			if err != nil || run[1] <= 0 || run[1]%r.l.ChunkSize != 0 || first+run[1]/r.l.ChunkSize > r.l.ChunkCount {
				report("directory entry %d (%q): run %#x+%d is not a run of whole chunks in the data area", i, e.Name, run[0], run[1])
				continue
			}
			name := e.Name
			if k > 0 {
				name += " (second run)"
			}
			spans = append(spans, dirSpan{name: name, first: first, last: first + run[1]/r.l.ChunkSize - 1})
		}
		if e.Kind == ObjectKind {
			if _, err := r.readObject(e.Name, e.DirEntry); err != nil {
				report("directory entry %d: %v (`cxltier object rm -force %s` removes it)", i, err, e.Name)
			}
		}
	}
	sort.Slice(spans, func(a, b int) bool { return spans[a].first < spans[b].first })
	for k := 1; k < len(spans); k++ {
		if spans[k].first <= spans[k-1].last {
			report("directory objects %q and %q overlap at chunk %d", spans[k-1].name, spans[k].name, spans[k].first)
		}
	}
	return spans
}

func (r *Region) auditChunks(spans []dirSpan, reportAs func(FindingKind) func(string, ...any)) {
	report := reportAs(FindDirectory)
	r.sync.refresh(r.ownerBytes(0, r.l.ChunkCount))
	for _, sp := range spans {
		for i := sp.first; i <= sp.last; i++ {
			if o := atomic.LoadUint32(r.ownerWord(i)); o != ownerShared {
				report("chunk %d of %q: owner word %#x, not the shared owner (a client's exit or a reaper would free it under the object)", i, sp.name, o)
			}
		}
	}
	slots := int64(r.MaxClients())
	leaseOf := map[int64]LeaseInfo{}
	for i := int64(0); i < r.l.ChunkCount; i++ {
		o := atomic.LoadUint32(r.ownerWord(i))
		used := r.chunkUsed(i)
		switch {
		case used != (o != 0):
			reportAs(FindAllocator)("chunk %d: bitmap says used=%v, owner word %#x", i, used, o)
		case o == 0 || o == ownerShared:
			// A shared chunk outside every directory object may belong to
			// an object's second run (a prefix index's payloads, named in
			// its header): not a finding at this level.
		case int64(o) > slots:
			reportAs(FindAllocator)("chunk %d: owner word %d names no lease slot (the table has %d)", i, o, slots)
		default:
			inf, ok := leaseOf[int64(o)]
			if !ok {
				inf = r.readLease(int(o) - 1)
				leaseOf[int64(o)] = inf
			}
			if inf.State == "free" {
				reportAs(FindLeak)("chunk %d: owned by slot %d, whose lease is free (leaked)", i, o-1)
			}
		}
	}
}

func (r *Region) auditLeases(reportAs func(FindingKind) func(string, ...any)) {
	dead := reportAs(FindDeadLease)
	daemons := map[int][]int{}
	for _, inf := range r.Leases() {
		if inf.State == "dead" {
			// Given up by its client (a region closed with it attached, a
			// close that got no lock grant) or marked by a reaper that
			// could not finish: its locks and chunks wait for a reap.
			dead("slot %d (%q, pid %d) is marked dead and still holds its locks and chunks: no daemon has reaped it",
				inf.Slot, inf.Name, inf.PID)
			continue
		}
		if inf.State != "live" {
			continue
		}
		if quiet := time.Since(inf.LastBeat); quiet > 2*r.l.LeaseTimeout {
			dead("slot %d (%q, pid %d) is marked live but has not heartbeated for %v: dead, and no daemon has reaped it",
				inf.Slot, inf.Name, inf.PID, quiet.Round(time.Millisecond))
			continue
		}
		// On a tier of one host every lease's process is on this one: a
		// process that is gone (killed mid-load, say) is dead now, not a
		// lease timeout from now.
		if inf.Gone {
			dead("slot %d (%q, pid %d) is marked live but its process has exited: dead, and no daemon has reaped it",
				inf.Slot, inf.Name, inf.PID)
			continue
		}
		if inf.Daemon {
			daemons[inf.Node] = append(daemons[inf.Node], inf.Slot)
		}
	}
	for node, ds := range daemons {
		if len(ds) > 1 {
			reportAs(FindDaemons)("node %d has %d live daemons (slots %v): one reaps and grants, the others race it", node, len(ds), ds)
		}
	}
}
