// Package lowprio runs work on OS threads of a lowered CPU priority. The
// bulk copies that nobody waits on soon (a KV pool's stores) then take a
// core only when the threads with deadlines (an Engram prefetch, a top-k
// step, a request's KV load) leave it idle. On a host whose cores are
// all busy, the cores, not the memory link, are what these transfers
// share, and the kernel's scheduler is the only arbiter that can hand a
// core to a deadline at once: on two cores bench/link measured an Engram
// prefetcher's p99 at 9-19x its idle one beside bulk copies of the same
// priority and 1.0-3.7x beside copies on threads at nice 19.
//
// A thread's priority weighs only against the threads of its own CPU
// cgroup (a container) or, where the kernel groups a session's threads,
// its autogroup: between containers their cgroups' weights decide.
//
// Lowering a thread's priority cannot be undone by an unprivileged
// process, so each thread of a Pool is locked to its goroutine and ends
// with it: no other goroutine ever runs at the lowered priority.
package lowprio

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
)

// Policy is how far a Pool's threads are lowered.
type Policy uint8

const (
	// Normal leaves the threads as they are.
	Normal Policy = iota
	// Low is nice 19: a thread's weight is about 1.5 % of a thread at
	// nice 0, and it is preempted as soon as one wakes.
	Low
	// Idle is SCHED_IDLE: the least weight the scheduler has (about
	// 0.3 %), for copies that must not take a core from anything.
	Idle
)

// ErrBadPolicy is returned for a policy's name that is none of
// "normal", "low" and "idle".
var ErrBadPolicy = errors.New("lowprio: unknown policy")

// ErrUnsupported is returned where this system cannot lower a thread.
var ErrUnsupported = errors.New("lowprio: threads cannot be lowered on this system")

// ParsePolicy reads a policy's name; "" is Low.
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "normal":
		return Normal, nil
	case "", "low":
		return Low, nil
	case "idle":
		return Idle, nil
	}
	return Normal, fmt.Errorf("%w: %q (want normal, low or idle)", ErrBadPolicy, s)
}

func (p Policy) String() string {
	switch p {
	case Normal:
		return "normal"
	case Low:
		return "low"
	case Idle:
		return "idle"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// Pool is a fixed set of threads at one policy's priority.
type Pool struct {
	policy Policy
	work   chan func()
	ended  sync.WaitGroup

	mu     sync.RWMutex // held for reading while work is handed over
	closed bool
}

// Start starts n threads lowered to p. If any thread cannot be lowered,
// none is kept and the error says why (ErrUnsupported, or the system's
// refusal, as a container's seccomp profile may give).
func Start(n int, p Policy) (*Pool, error) {
	if n <= 0 {
		return nil, fmt.Errorf("lowprio: a pool of %d threads", n)
	}
	if p > Idle {
		return nil, fmt.Errorf("%w: %v", ErrBadPolicy, p)
	}
	pl := &Pool{policy: p, work: make(chan func())}
	lowered := make(chan error, n)
	for range n {
		pl.ended.Add(1)
		go pl.thread(lowered)
	}
	var errs []error
	for range n {
		errs = append(errs, <-lowered)
	}
	if err := errors.Join(errs...); err != nil {
		pl.Close()
		return nil, fmt.Errorf("lowprio: lower a thread to %v: %w", p, err)
	}
	return pl, nil
}

// thread is one of the pool's threads: locked to this goroutine, lowered,
// and never unlocked, so that the runtime ends the thread when the
// goroutine returns rather than hand it to another goroutine. (Where the
// thread is the process's main thread, which the runtime cannot end, it
// parks it for good instead: lowered, but never running Go code again.)
func (pl *Pool) thread(lowered chan<- error) {
	defer pl.ended.Done()
	runtime.LockOSThread()
	err := lowerThisThread(pl.policy)
	lowered <- err
	if err != nil {
		return
	}
	for fn := range pl.work {
		fn()
	}
}

// Policy is the pool's policy.
func (pl *Pool) Policy() Policy { return pl.policy }

// Run runs fns on the pool's threads, as many at once as there are
// threads, and returns when all have returned. On a closed pool they run
// on the caller's goroutine, one after another.
func (pl *Pool) Run(fns ...func()) {
	var wg sync.WaitGroup
	pl.mu.RLock()
	if pl.closed {
		pl.mu.RUnlock()
		for _, fn := range fns {
			fn()
		}
		return
	}
	for _, fn := range fns {
		wg.Add(1)
		pl.work <- func() {
			defer wg.Done()
			fn()
		}
	}
	pl.mu.RUnlock()
	wg.Wait()
}

// Close ends the pool's threads once the work handed to them is done.
func (pl *Pool) Close() {
	pl.mu.Lock()
	if !pl.closed {
		pl.closed = true
		close(pl.work)
	}
	pl.mu.Unlock()
	pl.ended.Wait()
}
