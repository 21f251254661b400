/*
 * Publishing a prefix-cache entry on memory that is not coherent between
 * hosts (prefix/mutate.go Reserve/Publish, prefix/host.go Set/Get).
 *
 * A writer on host 0 fills a block's payload (two lines here) and then
 * makes the entry READY with the payload's version; a reader on host 1
 * looks the entry up and copies the payload. The block was used before
 * (version 1), so the reader's cache may still hold the old payload. Each
 * host caches lines: a store goes to its cache, flush writes back (clwb),
 * invalidate writes back a dirty line and drops it (clflush), a load reads
 * the cache or, when the line is not cached, memory; dirty lines may be
 * written back, clean ones dropped, at any moment.
 *
 * The code: the writer stores the payload, flushes it (and fences), then
 * stores and flushes the entry; the reader invalidates the entry line
 * before reading it and the payload lines before copying them.
 *
 * Checked: a reader that sees the entry READY with version v copies a
 * payload whose lines all hold v ("never a ready entry with an incomplete
 * payload"). -DBUG_ENTRY_FIRST (entry flushed before the payload) and
 * -DBUG_NO_REFRESH (the reader trusts its cached payload lines) must fail.
 */

#define HOSTS 2
#define LINES 3          /* 0: entry word (state*16 + version), 1..2: payload */
#define READY 1

byte mem[LINES];
byte cval[HOSTS * LINES];
bool cvalid[HOSTS * LINES];
bool cdirty[HOSTS * LINES];

inline store(h, l, v) {
	atomic { cval[h*LINES+l] = v; cvalid[h*LINES+l] = true; cdirty[h*LINES+l] = true }
}
inline flush(h, l) {
	atomic { if :: cdirty[h*LINES+l] -> mem[l] = cval[h*LINES+l]; cdirty[h*LINES+l] = false :: else -> skip fi }
}
inline invalidate(h, l) {
	atomic { flush(h, l); cvalid[h*LINES+l] = false }
}
inline load(h, l, v) {
	atomic {
		if
		:: cvalid[h*LINES+l] -> v = cval[h*LINES+l]
		:: else -> v = mem[l]; cval[h*LINES+l] = v; cvalid[h*LINES+l] = true
		fi
	}
}

active proctype Evict() {
	byte i;
end:	do
	:: atomic { select(i : 0 .. HOSTS*LINES-1);
		if
		:: cdirty[i] -> mem[i % LINES] = cval[i]; cdirty[i] = false
		:: cvalid[i] && !cdirty[i] -> cvalid[i] = false
		:: else -> skip
		fi }
	od
}

/* Version 2 goes into the block that held version 1 (the entry was
 * dropped: state 0, version 1). */
proctype Writer() {
#ifdef BUG_ENTRY_FIRST
	store(0, 0, READY*16 + 2); flush(0, 0);
	store(0, 1, 2); store(0, 2, 2); flush(0, 1); flush(0, 2);
#else
	store(0, 1, 2); store(0, 2, 2); flush(0, 1); flush(0, 2);
	store(0, 0, READY*16 + 2); flush(0, 0);
#endif
}

proctype Reader() {
	byte e, p1, p2;
	/* the reader read version 1 earlier: its cache holds those lines */
	atomic { cval[1*LINES+1] = 1; cvalid[1*LINES+1] = true; cval[1*LINES+2] = 1; cvalid[1*LINES+2] = true }
	do
	:: invalidate(1, 0); load(1, 0, e);
		if
		:: e / 16 == READY ->
#ifndef BUG_NO_REFRESH
			invalidate(1, 1); invalidate(1, 2);
#endif
			load(1, 1, p1); load(1, 2, p2);
			assert(p1 == e % 16 && p2 == e % 16);
			break
		:: else -> skip
		fi
	od
}

init {
	atomic { mem[0] = 0*16 + 1; mem[1] = 1; mem[2] = 1; run Writer(); run Reader() }
}
