package main

// #include <stdint.h>
import "C"

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/cxltier/cxltier/prefix"
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
func attach(devices, name string) (uint64, error) {
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
	c, err := r.Attach(tier.ClientOptions{Name: name})
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
	return handles.add(&attached{r: r, c: c, children: map[uint64]func() error{}, link: link}), nil
}

//export cxl_detach
func cxl_detach(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_detach", errbuf, errlen, &code)
	return report(detach(uint64(h)), errbuf, errlen)
}

// detach waits for the calls in flight on the tier (new ones are turned
// away), then closes what was opened on it and unmaps it.
func detach(h uint64) error {
	a, err := tierOf(h)
	if err != nil {
		return err
	}
	if err := a.guard.drain(detachWait); err != nil {
		return err
	}
	if _, ok := handles.remove(h); !ok {
		return fmt.Errorf("handle %d: %w", h, errBadHandle) // a concurrent detach took it
	}
	// The children leave the table under its lock and are closed outside
	// it: a child's close may take the lock itself (a KV pool closes its
	// loads through the table) and may wait on the tier (a lock another
	// client holds), which must not hold up every other call of the
	// process. Newest first: a load before its pool, a pool before its
	// index.
	handles.mu.Lock()
	children := a.children
	a.children = map[uint64]func() error{}
	for ch := range children {
		delete(handles.objs, ch)
	}
	handles.mu.Unlock()
	order := slices.Sorted(maps.Keys(children))
	for _, ch := range slices.Backward(order) {
		// A load closed before its last layer says so to the caller of its
		// layers; to a detach it is one more thing to close.
		if cerr := children[ch](); err == nil && !errors.Is(cerr, prefix.ErrIncomplete) {
			err = cerr
		}
	}
	if a.link != nil {
		a.link.Close()
	}
	if cerr := a.c.Close(); err == nil {
		err = cerr
	}
	if cerr := a.r.Close(); err == nil {
		err = cerr
	}
	return err
}
