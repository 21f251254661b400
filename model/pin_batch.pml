/*
 * Pins taken a batch at a time on coherent x86-TSO memory, the design
 * checked before it was built (prefix/pins.go takes one locked
 * instruction per key). Built, it ran no faster on the machine measured
 * (docs/architecture.md, "How the protocols are checked"), so it is not in
 * the code; this stays as the proof for a machine where locked
 * instructions cost more.
 *
 * A reader that looked up two entries (each READY with payload 1) writes
 * one pin record per entry with plain stores, which wait in its store
 * buffer, then runs one fence (MFENCE, or any locked instruction), then
 * re-reads both entries: an entry still READY is pinned and its payload
 * may be read; one that changed is given up (a miss). Before a record
 * beyond its high-water mark it raises the mark, also with a plain store.
 * Afterwards it releases each pin with a plain store: TSO keeps the
 * payload's loads before it.
 *
 * An evictor (holding the index lock, so one at a time) marks one of the
 * entries EVICTING with a locked store (XCHG: straight to memory, a full
 * fence), reads the reader's high-water mark and the records below it; a
 * record naming the entry puts it back to READY, otherwise it drops the
 * entry and the block gets payload 2. This is pin.pml's Dekker handshake
 * with a store buffer in place of pin.pml's caches: pin.pml runs every
 * step in program order, so it cannot tell one fence a batch from one
 * locked instruction a key; this model can.
 *
 * Memory is coherent (a tier one host maps: what the batched pins are
 * for; a tier shared by non-coherent hosts keeps pin.pml's per-key
 * flushes). The reader's stores enter a FIFO store buffer that drains to
 * memory at any time, oldest first; its loads take the newest buffered
 * store to the same word, else memory (store forwarding); the fence waits
 * until the buffer is empty. Loads are not reordered with loads, nor
 * stores with stores, which is x86-TSO.
 *
 * Checked: a reader holding a pin never reads a payload other than the one
 * the entry named, and (Monitor) an entry never reads READY while its block
 * holds another payload. Seeded bugs that must be caught: -DBUG_NO_FENCE
 * (the batch's pins are not fenced before the entries are re-read: the
 * store-buffer outcome of Dekker), -DBUG_CHECK_FIRST (the reader re-reads
 * the entries before it writes its pins), -DBUG_RELEASE_EARLY (the reader
 * releases a pin before it reads the payload), -DBUG_SCAN_FIRST (the
 * evictor scans the pins before it marks the entry).
 */

#define READY 1
#define EVICTING 2
#define DROPPED 3

#define ENT 0      /* words 0, 1: the two entries */
#define PIN 2      /* words 2, 3: the reader's records 0 and 1 */
#define HW 4       /* the reader's high-water mark: records below it are scanned */
#define PAY 5      /* words 5, 6: the entries' blocks (payload 1, then 2 once dropped) */
#define WORDS 7
#define SB 8       /* the reader's store buffer: deep enough never to block */

byte mem[WORDS];
byte sbAddr[SB];
byte sbVal[SB];
byte sbN;

/* A record names its entry (a pin value is never 0). */
#define PINV(i) (10 + (i))

inline rstore(a, v) {
	atomic { sbN < SB -> sbAddr[sbN] = a; sbVal[sbN] = v; sbN++ }
}

inline rload(a, v) {
	atomic {
		k = sbN;
		v = mem[a];
		do
		:: k > 0 ->
			k--;
			if
			:: sbAddr[k] == a -> v = sbVal[k]; break
			:: else -> skip
			fi
		:: else -> break
		od
	}
}

inline fence() {
	(sbN == 0)
}

/* The store buffer drains, oldest store first, whenever it likes. */
active proctype Drain() {
	byte j;
end:	do
	:: atomic {
		sbN > 0 ->
		mem[sbAddr[0]] = sbVal[0];
		j = 1;
		do
		:: j < sbN -> sbAddr[j - 1] = sbAddr[j]; sbVal[j - 1] = sbVal[j]; j++
		:: else -> break
		od;
		sbN--
	}
	od
}

inline recheck(i, held) {
	rload(ENT + i, e);
	held = (e == READY);
	if
	:: !held -> rstore(PIN + i, 0)  /* changed: given up, a miss */
	:: else -> skip
	fi
}

inline read_and_release(i, held) {
	if
	:: held ->
#ifdef BUG_RELEASE_EARLY
		rstore(PIN + i, 0);
		rload(PAY + i, d);
#else
		rload(PAY + i, d);
		rstore(PIN + i, 0);
#endif
		assert(d == 1)
	:: else -> skip
	fi
}

proctype Reader() {
	byte e, d, k;
	bool held0, held1;
#ifdef BUG_CHECK_FIRST
	recheck(0, held0);
	recheck(1, held1);
	rstore(HW, 2);
	rstore(PIN + 0, PINV(0));
	rstore(PIN + 1, PINV(1));
	fence();
#else
	rstore(HW, 2);
	rstore(PIN + 0, PINV(0));
	rstore(PIN + 1, PINV(1));
#ifndef BUG_NO_FENCE
	fence();
#endif
	recheck(0, held0);
	recheck(1, held1);
#endif
	read_and_release(0, held0);
	read_and_release(1, held1)
}

/* The evictor's loads, one step each: the mark, then each record below it. */
inline scan(i, found) {
	hw = mem[HW];
	p0 = 0;
	p1 = 0;
	if
	:: hw >= 1 -> p0 = mem[PIN + 0]
	:: else -> skip
	fi;
	if
	:: hw >= 2 -> p1 = mem[PIN + 1]
	:: else -> skip
	fi;
	found = (p0 == PINV(i) || p1 == PINV(i))
}

proctype Evictor() {
	byte i, hw, p0, p1;
	bool found;
	select(i : 0 .. 1);
#ifdef BUG_SCAN_FIRST
	scan(i, found);
	mem[ENT + i] = EVICTING;
#else
	mem[ENT + i] = EVICTING;  /* XCHG: to memory at once, a full fence */
	scan(i, found);
#endif
	if
	:: found -> mem[ENT + i] = READY  /* pinned: put it back */
	:: else ->
		mem[ENT + i] = DROPPED;
		mem[PAY + i] = 2  /* the block gets another payload */
	fi
}

active proctype Monitor() {
end:	atomic { (mem[ENT] == READY && mem[PAY] == 2) || (mem[ENT + 1] == READY && mem[PAY + 1] == 2) -> assert(false) }
}

init {
	atomic { mem[ENT] = READY; mem[ENT + 1] = READY; mem[PAY] = 1; mem[PAY + 1] = 1; run Reader(); run Evictor() }
}
