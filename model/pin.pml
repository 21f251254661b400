/*
 * Pinning a prefix-cache entry against eviction on memory that is not
 * coherent between hosts (prefix/read.go pin, prefix/evict.go).
 *
 * A reader on host 1 records a pin naming the entry in its pin table, makes
 * it visible, then re-reads the entry: if the entry is still ready, the pin
 * holds and the reader may read the payload; otherwise it gives the pin up
 * and treats the key as a miss. An evictor on host 0 (holding the index
 * lock) first marks the entry evicting and makes that visible, then reads
 * every pin table: if a pin names the entry it puts the entry back to
 * ready; otherwise it drops it, and the block is written with another
 * payload. Either the evictor sees the pin or the reader sees the mark
 * (a Dekker handshake through memory).
 *
 * The reader claims its record with no lock, so evictors do not know which
 * records are in use: they scan the records below the holder's high-water
 * mark, which the reader raises (and makes visible) before it writes a
 * record beyond it. Here the reader's record is its first, so the mark
 * starts at 0 and the evictor reads no record while it sees 0.
 *
 * Memory is modelled as in lock.pml: per-host caches, flush (clwb),
 * invalidate (clflush), spontaneous write-back and drop. Each step runs in
 * program order: the code's full barriers (atomic stores are XCHG on x86)
 * and fences keep a flush before the load that follows it.
 *
 * Checked: a reader holding a pin never reads a payload other than the one
 * the entry named. Seeded bugs that must be caught: -DBUG_CHECK_FIRST (the
 * reader checks the entry before publishing its pin), -DBUG_SCAN_FIRST (the
 * evictor scans pins before marking the entry), -DBUG_PIN_NOT_FLUSHED (the
 * pin stays in the reader's cache), -DBUG_MARK_LATE (the reader raises the
 * high-water mark after its check), -DBUG_MARK_NOT_FLUSHED (the raised mark
 * stays in the reader's cache), -DBUG_READER_STAMPS (the reader writes the
 * entry's line, as a hit's access stamp would: its dirty copy, written back
 * after the evictor dropped the entry, makes it ready again over another
 * payload; which is why lookups on a non-coherent tier write nothing).
 *
 * Also checked, by Monitor: an entry never reads ready while its block
 * holds another payload.
 */

#define HOSTS 2
#define LINES 4         /* 0: entry word, 1: the reader's pin record, 2: payload, 3: its high-water mark */
#define READY 1
#define EVICTING 2
#define DROPPED 3

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

inline raise_mark() {
	store(1, 3, 1);
#ifndef BUG_MARK_NOT_FLUSHED
	flush(1, 3);
#endif
}

inline publish_pin() {
	store(1, 1, 1);
#ifndef BUG_PIN_NOT_FLUSHED
	flush(1, 1);
#endif
}

proctype Reader() {
	byte e, d;
#ifdef BUG_CHECK_FIRST
	invalidate(1, 0); load(1, 0, e);
	publish_pin();
#elif defined(BUG_MARK_LATE)
	publish_pin();
	invalidate(1, 0); load(1, 0, e);
	raise_mark();
#else
	raise_mark();
	publish_pin();
	invalidate(1, 0); load(1, 0, e);
#endif
	if
	:: e == READY ->
		/* pinned: the payload is the one the entry named (version 1) */
		invalidate(1, 2); load(1, 2, d);
		assert(d == 1);
#ifdef BUG_READER_STAMPS
		store(1, 0, READY)  /* the access stamp: line 0 dirty with the word read */
#endif
	:: else -> skip  /* evicting or gone: a miss */
	fi;
	store(1, 1, 0); flush(1, 1)  /* release */
}

inline scan_pins() {
	invalidate(0, 3); load(0, 3, hw);
	if
	:: hw > 0 -> invalidate(0, 1); load(0, 1, p)
	:: else -> p = 0  /* the record is beyond the mark: not scanned */
	fi
}

proctype Evictor() {
	byte p, hw;
#ifdef BUG_SCAN_FIRST
	scan_pins();
	store(0, 0, EVICTING); flush(0, 0);
#else
	store(0, 0, EVICTING); flush(0, 0);
	scan_pins();
#endif
	if
	:: p != 0 -> store(0, 0, READY); flush(0, 0)  /* pinned: put it back */
	:: else ->
		store(0, 0, DROPPED); flush(0, 0);
		store(0, 2, 2); flush(0, 2)               /* the block gets another payload */
	fi
}

active proctype Monitor() {
end:	atomic { mem[0] == READY && mem[2] == 2 -> assert(false) }
}

init {
	atomic { mem[0] = READY; mem[1] = 0; mem[2] = 1; mem[3] = 0; run Reader(); run Evictor() }
}
