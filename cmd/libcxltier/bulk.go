package main

// #include <stdint.h>
import "C"

import (
	"encoding/json"
	"fmt"

	"github.com/cxltier/cxltier/kernels"
)

// A KV pool's stores are copies nobody waits on soon. On the CPU engine
// they take cores, and on a host whose cores are all busy a thread with a
// deadline (an Engram prefetch, a top-k step, a request's load) waits out
// a store's time slice: bench/link measured an Engram prefetcher's p99 at
// 9-19x idle beside stores and loads of the same priority. So once a tier
// joins its node's link, its CPU engines copy their stores on threads at
// nice 19 (kernels.CPU.SetBackground), and the kernel gives a waking
// deadline a core at once. cxl_tier_bulk_priority sets it either way
// (normal, low, idle) and says what took effect. A GPU's engines ignore
// it: their copies are the GPU's.

// bulkPriority is the priority of a tier's background copies.
type bulkPriority struct {
	want kernels.Priority
	set  bool  // by cxl_tier_bulk_priority: joining the link leaves it
	err  error // why the last engine could not be lowered; nil: none
}

// lowerBulk lowers the engines' background copies on joining the link,
// unless cxl_tier_bulk_priority chose already. Best effort: a system that
// refuses it leaves the copies as they were, and cxl_tier_bulk_priority
// reports why.
func (es *engines) lowerBulk() {
	es.mu.Lock()
	defer es.mu.Unlock()
	if !es.bulk.set {
		es.bulk.want = kernels.PriorityLow
		es.applyBulk()
	}
}

// setBulk sets the engines' background priority, open and to come.
func (es *engines) setBulk(p kernels.Priority) error {
	es.mu.Lock()
	defer es.mu.Unlock()
	es.bulk.want, es.bulk.set = p, true
	return es.applyBulk()
}

// applyBulk applies es.bulk to every open engine; es.mu is held.
func (es *engines) applyBulk() error {
	es.bulk.err = nil
	for key, se := range es.open {
		if !key.rows {
			es.bulk.apply(se.eng)
		}
	}
	return es.bulk.err
}

// backgrounded is an engine whose background calls can be lowered: the
// CPU engine.
type backgrounded interface {
	SetBackground(kernels.Priority) error
	Background() kernels.Priority
}

// apply sets eng's background priority, recording why it could not.
func (b *bulkPriority) apply(eng kernels.Engine) {
	be, ok := eng.(backgrounded)
	if !ok || be.Background() == b.want {
		return
	}
	if err := be.SetBackground(b.want); err != nil {
		b.err = err // the latest refusal: every engine's would say the same
	}
}

// bulkReport is what cxl_tier_bulk_priority writes: the priority asked
// for, the one each CPU engine has, and why an engine could not be
// lowered.
type bulkReport struct {
	Wanted  string   `json:"wanted"`
	Engines []string `json:"engines"`
	Error   string   `json:"error,omitempty"`
}

func (es *engines) bulkReport() bulkReport {
	es.mu.Lock()
	defer es.mu.Unlock()
	r := bulkReport{Wanted: es.bulk.want.String(), Engines: []string{}}
	for key, se := range es.open {
		if be, ok := se.eng.(backgrounded); ok && !key.rows {
			r.Engines = append(r.Engines, be.Background().String())
		}
	}
	if es.bulk.err != nil {
		r.Error = es.bulk.err.Error()
	}
	return r
}

// cxl_tier_bulk_priority sets the priority of the threads that copy tier
// h's KV pool stores on the CPU engine, for the engines open and those
// opened later: "normal" (the caller's), "low" (nice 19, what joining
// the link sets) or "idle" (SCHED_IDLE); NULL or "" leaves it. It writes
// {"wanted", "engines", "error"} as JSON into buf: the priority asked for,
// each CPU engine's, and why one could not be lowered (the call then also
// fails).
//
//export cxl_tier_bulk_priority
func cxl_tier_bulk_priority(h C.uint64_t, priority *C.char, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_tier_bulk_priority", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		var serr error
		if priority != nil && C.GoString(priority) != "" {
			p, err := kernels.ParsePriority(C.GoString(priority))
			if err != nil {
				return fmt.Errorf("bulk priority: %w: %w", errBadArg, err)
			}
			serr = a.engines.setBulk(p)
		}
		raw, err := json.Marshal(a.engines.bulkReport())
		if err != nil {
			return err
		}
		if err := copyString(raw, buf, bufCap); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("bulk priority: %w", serr)
		}
		return nil
	}()
	return report(err, errbuf, errlen)
}
