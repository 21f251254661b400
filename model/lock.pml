/*
 * The tier's two-tier lock (tier/lock.go, tier/manager.go) on memory that is
 * not coherent between nodes (hosts).
 *
 * Each node has a CAS word for the node-local lock (node-local memory,
 * coherent among that node's processes) and a state word in the lock's
 * global slot: IDLE, WAITING or LOCKED. The local holder posts WAITING, the
 * manager (a process on node 0) grants one node at a time by writing
 * LOCKED, the holder releases with IDLE.
 *
 * Memory: every node has its own cache of the global words. A store goes to
 * the node's cache; flush writes the line back (clwb: the line stays,
 * clean); invalidate writes back a dirty line and drops it (clflush); a load
 * reads the cache, or memory when the line is not cached. A dirty line may
 * also be written back, and a clean one dropped, at any moment (eviction).
 * The code stores then flushes every global word it writes, and
 * invalidates before every load: that is what makes it correct here.
 *
 * Checked: mutual exclusion (assertion), no invalid end state (deadlock),
 * and, with -DLIVE, that some client enters the critical section infinitely
 * often under weak fairness (no starvation of the whole system).
 * -DBUG_GRANT_WHILE_HELD makes the manager grant without checking that no
 * node holds the lock; the safety check must then fail (the model can
 * fail). -DBUG_NO_INVALIDATE makes waiters poll their cached word without
 * invalidating it: still safe, but a waiter then depends on an eviction to
 * see its grant, which the liveness check (-DLIVE) must report.
 */

#define NODES 2
#define CLIENTS 3            /* clients 0,1 on node 0; client 2 on node 1 */
#ifndef ROUNDS
#define ROUNDS 1
#endif

#define IDLE 0
#define WAITING 1
#define LOCKED 2

byte mem[NODES];                 /* global state word of each node, in memory */
byte cval[NODES * NODES];        /* cache of node c for word w: index c*NODES+w */
bool cvalid[NODES * NODES];
bool cdirty[NODES * NODES];
byte lcl[NODES];               /* node-local CAS word: holder client + 1, 0 free */
byte in_cs = 0;
byte done = 0;

inline store(c, w, v) {
	atomic { cval[c*NODES+w] = v; cvalid[c*NODES+w] = true; cdirty[c*NODES+w] = true }
}
inline flush(c, w) {
	atomic { if :: cdirty[c*NODES+w] -> mem[w] = cval[c*NODES+w]; cdirty[c*NODES+w] = false :: else -> skip fi }
}
inline invalidate(c, w) {
	atomic { flush(c, w); cvalid[c*NODES+w] = false }
}
inline load(c, w, v) {
	atomic {
		if
		:: cvalid[c*NODES+w] -> v = cval[c*NODES+w]
		:: else -> v = mem[w]; cval[c*NODES+w] = v; cvalid[c*NODES+w] = true
		fi
	}
}

/* Evictions: any dirty line may be written back, any clean line dropped. */
active proctype Evict() {
	byte i;
end:	do
	:: atomic { select(i : 0 .. NODES*NODES-1);
		if
		:: cdirty[i] -> mem[i % NODES] = cval[i]; cdirty[i] = false
		:: cvalid[i] && !cdirty[i] -> cvalid[i] = false
		:: else -> skip
		fi }
	od
}

proctype Client(byte id; byte node) {
	byte r = 0, v;
	do
	:: r < ROUNDS ->
		/* node-local lock: compare-and-swap on a coherent word */
		atomic { lcl[node] == 0 -> lcl[node] = id + 1 };
		/* post the request, then wait for the grant */
		store(node, node, WAITING); flush(node, node);
		do
		:: 
#ifndef BUG_NO_INVALIDATE
			invalidate(node, node);
#endif
			load(node, node, v);
			if :: v == LOCKED -> break :: else -> skip fi
		od;
		in_cs++;
progress:	assert(in_cs == 1);
		in_cs--;
		/* release: global word first, then the local lock */
		store(node, node, IDLE); flush(node, node);
		lcl[node] = 0;
		r++
	:: else -> break
	od;
	done++
}

/* The lock manager, a process on node 0: round-robin grants. */
active proctype Manager() {
	byte k, n, v, last = 0, waiting;
	bool held;
end:	do
	:: done == CLIENTS -> break
	:: else ->
		held = false; waiting = 255; k = 1;
		do
		:: k <= NODES ->
			n = (last + k) % NODES;
			invalidate(0, n); load(0, n, v);
			if
			:: v == LOCKED -> held = true
			:: v == WAITING && waiting == 255 -> waiting = n
			:: else -> skip
			fi;
			k++
		:: else -> break
		od;
		if
#ifdef BUG_GRANT_WHILE_HELD
		:: waiting != 255 -> store(0, waiting, LOCKED); flush(0, waiting); last = waiting
#else
		:: !held && waiting != 255 -> store(0, waiting, LOCKED); flush(0, waiting); last = waiting
#endif
		:: else -> skip
		fi
	od
}

init {
	atomic {
		run Client(0, 0);
		run Client(1, 0);
		run Client(2, 1)
	}
}

#ifdef LIVE
ltl starvation_free { [] <> (in_cs == 1 || done == CLIENTS) }
#endif
