package main

// #include <stdint.h>
import "C"

import (
	"fmt"
	"strings"

	"github.com/cxltier/cxltier/tier"
)

//export cxl_attach
func cxl_attach(devices, name *C.char, out *C.uint64_t, errbuf *C.char, errlen C.int) C.int {
	return report(attach(C.GoString(devices), C.GoString(name), out), errbuf, errlen)
}

func attach(devices, name string, out *C.uint64_t) error {
	if out == nil || devices == "" {
		return fmt.Errorf("attach: %w: devices and an output handle are required", errBadArg)
	}
	var devs []tier.Backing
	for _, d := range strings.Split(devices, ",") {
		b, err := tier.ParseBacking(strings.TrimSpace(d))
		if err != nil {
			return err
		}
		devs = append(devs, b)
	}
	r, err := tier.Open(tier.Options{Devices: devs})
	if err != nil {
		return err
	}
	c, err := r.Attach(tier.ClientOptions{Name: name})
	if err != nil {
		r.Close()
		return err
	}
	*out = C.uint64_t(handles.add(&attached{r: r, c: c, children: map[uint64]func() error{}}))
	return nil
}

//export cxl_detach
func cxl_detach(h C.uint64_t, errbuf *C.char, errlen C.int) C.int {
	return report(detach(uint64(h)), errbuf, errlen)
}

func detach(h uint64) error {
	if _, err := tierOf(h); err != nil {
		return err
	}
	o, _ := handles.remove(h)
	a := o.(*attached)
	var err error
	handles.mu.Lock()
	for ch, closeChild := range a.children {
		delete(handles.objs, ch)
		if cerr := closeChild(); err == nil {
			err = cerr
		}
	}
	handles.mu.Unlock()
	if cerr := a.c.Close(); err == nil {
		err = cerr
	}
	if cerr := a.r.Close(); err == nil {
		err = cerr
	}
	return err
}
