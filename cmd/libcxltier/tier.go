package main

// #include <stdint.h>
import "C"

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/cxltier/cxltier/tier"
)

//export cxl_attach
func cxl_attach(devices, name *C.char, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_attach", errbuf, errlen, &code)
	if out == nil {
		return report(fmt.Errorf("attach: %w: no output handle", errBadArg), errbuf, errlen)
	}
	h, err := attach(C.GoString(devices), C.GoString(name))
	if err == nil {
		*out = C.uint64_t(h)
	}
	return report(err, errbuf, errlen)
}

// attach opens the tier on devices (comma-separated backings) and attaches
// a client called name; it returns the tier's handle.
func attach(devices, name string) (uint64, error) { return attachWaiting(devices, name, 0) }

// attachWaiting is attach with the bound a detach waits for calls in
// flight (0: tier.CloseWait).
func attachWaiting(devices, name string, closeWait time.Duration) (uint64, error) {
	if devices == "" {
		return 0, fmt.Errorf("attach: %w: no devices", errBadArg)
	}
	var devs []tier.Backing
	for _, d := range strings.Split(devices, ",") {
		b, err := tier.ParseBacking(strings.TrimSpace(d))
		if err != nil {
			return 0, err
		}
		devs = append(devs, b)
	}
	r, err := tier.Open(tier.Options{Devices: devs})
	if err != nil {
		return 0, err
	}
	c, err := r.Attach(tier.ClientOptions{Name: name, CloseWait: closeWait})
	if err != nil {
		r.Close()
		return 0, err
	}
	link, err := newLink(r, c)
	if err != nil {
		c.Close()
		r.Close()
		return 0, err
	}
	return handles.add(&attached{r: r, c: c, children: map[uint64]func() bool{}, link: link}), nil
}

//export cxl_detach
func cxl_detach(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_detach", errbuf, errlen, &code)
	return report(detach(uint64(h)), errbuf, errlen)
}

// detach closes the tier's client, which turns new calls away, waits for
// those in flight, and closes what was opened on the tier (tier.Client's
// Close); then it unmaps the tier. Calls that do not finish in time leave
// the tier attached and usable, and the detach reports ErrHoldsInFlight.
func detach(h uint64) error {
	a, err := tierOf(h)
	if err != nil {
		return err
	}
	if !a.detaching.CompareAndSwap(false, true) {
		return fmt.Errorf("handle %d: %w: another detach runs", h, tier.ErrClosed)
	}
	err = a.c.Close()
	if errors.Is(err, tier.ErrHoldsInFlight) {
		a.detaching.Store(false)
		return fmt.Errorf("detach: %w; the tier stays attached", err)
	}
	handles.remove(h)
	if link := a.uplink(); link != nil {
		link.Close()
	}
	if cerr := a.r.Close(); err == nil {
		err = cerr
	}
	return err
}

// viewHold is a hold on a tier's mapping that a caller keeps across the
// life of its views of that memory (the Python package's buffers and
// tensors): until it is given back, the tier's client does not close and
// the mapping stays.
type viewHold struct{ tier.Hold }

// cxl_tier_hold takes a hold on tier h (tier.Client.Hold) and returns its
// handle in out, for cxl_tier_release. A detach waits for the holds given
// out (tier.CloseWait) and fails with CXL_EBUSY while any is kept.
//
//export cxl_tier_hold
func cxl_tier_hold(h C.uint64_t, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_tier_hold", errbuf, errlen, &code)
	if out == nil {
		return report(fmt.Errorf("tier hold: %w: no output handle", errBadArg), errbuf, errlen)
	}
	id, err := tierHold(uint64(h))
	*out = C.uint64_t(id)
	return report(err, errbuf, errlen)
}

func tierHold(h uint64) (uint64, error) {
	a, err := tierOf(h)
	if err != nil {
		return 0, err
	}
	held, err := a.c.Hold()
	if err != nil {
		return 0, err
	}
	return handles.add(&viewHold{held}), nil
}

// cxl_tier_release gives back a hold cxl_tier_hold took.
//
//export cxl_tier_release
func cxl_tier_release(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_tier_release", errbuf, errlen, &code)
	return report(tierRelease(uint64(h)), errbuf, errlen)
}

func tierRelease(h uint64) error {
	if v, _ := handles.objs.Load(h); v == nil {
		return fmt.Errorf("tier release: handle %d: %w", h, errBadHandle)
	} else if _, ok := v.(*viewHold); !ok {
		return fmt.Errorf("tier release: handle %d is no hold: %w", h, errBadHandle)
	}
	if v, ok := handles.remove(h); ok {
		v.(*viewHold).Done()
	}
	return nil
}

// cxl_tier_replaced writes why the tier h maps is no longer the one its
// backing paths name (destroyed, or formatted again), or "" while it is
// (tier.Region.Replaced): a process that runs for long (the uplink)
// checks it and stops rather than serve a tier no one uses.
//
//export cxl_tier_replaced
func cxl_tier_replaced(h C.uint64_t, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_tier_replaced", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		return copyString([]byte(a.r.Replaced()), buf, bufCap)
	}()
	return report(err, errbuf, errlen)
}

// cxl_tier_populate enters every page of tier h into this process's page
// tables, without changing a byte (tier.Region.Populate), and writes the
// bytes it covered to *out: a process that moves many pages through the
// tier pays its page faults once, at start, instead of on each first
// transfer. The tier is held while it runs.
//
//export cxl_tier_populate
func cxl_tier_populate(h C.uint64_t, out *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_tier_populate", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done() // the hold that keeps the mapping while it runs
		n, err := a.r.Populate()
		if out != nil {
			*out = C.int64_t(n)
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

// cxl_tier_registered says whether this process's client of tier h proved
// who it is to its node's daemon (tier.Client.Registered): *out is 1 if
// so, else 0, with why in buf (no daemon listens at its socket, or the
// daemon's refusal).
//
//export cxl_tier_registered
func cxl_tier_registered(h C.uint64_t, out *C.int, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_tier_registered", errbuf, errlen, &code)
	err := func() error {
		if out == nil {
			return fmt.Errorf("tier registered: %w: no output", errBadArg)
		}
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		*out = 0
		if a.c.Registered() {
			*out = 1
			return copyString(nil, buf, bufCap)
		}
		why := a.c.RegisterError()
		if why == "" {
			path, err := a.r.SocketPath(a.c.Node())
			if err != nil {
				why = err.Error()
			} else {
				why = "no daemon answers at " + path
			}
		}
		return copyString([]byte(why), buf, bufCap)
	}()
	return report(err, errbuf, errlen)
}

// cxl_tier_lease writes the lease of this process's client of tier h: its
// slot and generation, which name this client and no later holder of the
// slot (what a peer puts in its records, so the other side can tell when
// it is gone: cxl_tier_lease_gone).
//
//export cxl_tier_lease
func cxl_tier_lease(h C.uint64_t, slot *C.int64_t, gen *C.uint32_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_tier_lease", errbuf, errlen, &code)
	err := func() error {
		if slot == nil || gen == nil {
			return fmt.Errorf("tier lease: %w: no output", errBadArg)
		}
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		*slot, *gen = C.int64_t(a.c.Slot()), C.uint32_t(a.c.Gen())
		return nil
	}()
	return report(err, errbuf, errlen)
}

// cxl_tier_lease_gone writes 1 to *out if the client that held lease slot
// slot at generation gen is gone (tier.Region.LeaseGone: its slot freed,
// reaped or another's, or on a one-host tier its process proven gone),
// else 0. slot and gen come from another process's records: a slot outside
// the lease table is CXL_EINVAL; the answer is for deciding to stop
// waiting on that client, never for acting on its process.
//
//export cxl_tier_lease_gone
func cxl_tier_lease_gone(h C.uint64_t, slot C.int64_t, gen C.uint32_t, out *C.int8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_tier_lease_gone", errbuf, errlen, &code)
	err := func() error {
		if out == nil {
			return fmt.Errorf("tier lease gone: %w: no output", errBadArg)
		}
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if int64(slot) < 0 || int64(slot) > math.MaxInt32 {
			return fmt.Errorf("tier lease gone: %w: slot %d", errBadArg, int64(slot))
		}
		gone, err := a.r.LeaseGone(int(slot), uint32(gen))
		*out = 0
		if gone {
			*out = 1
		}
		return err
	}()
	return report(err, errbuf, errlen)
}
