package kernels

import (
	"bytes"
	"errors"
	"testing"
)

// TestReadLaterRefusesWhatItCannotHonour: a ReadLater outside the Run's
// stage, of no bytes, without a then, or a second one is refused, and the
// bytes a then gets are the stage's as the Run's work left them.
func TestReadLaterRefusesWhatItCannotHonour(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		ln, ok := e.(Launcher)
		if !ok {
			t.Skip(e.Name(), " launches no kernels")
		}
		words := []uint64{0x0102030405060708, 0x1112131415161718, 0x2122232425262728}
		noop := func([]byte) {}
		cases := []struct {
			name string
			read func(l Launch, dev uint64) error
			want error
		}{
			{"before any stage", func(l Launch, _ uint64) error { return l.ReadLater(8, 8, noop) }, ErrBadRequest},
			{"past the stage", func(l Launch, dev uint64) error { return l.ReadLater(dev+1<<40, 8, noop) }, ErrBadRequest},
			{"below the stage", func(l Launch, dev uint64) error { return l.ReadLater(dev-8, 8, noop) }, ErrBadRequest},
			{"no bytes", func(l Launch, dev uint64) error { return l.ReadLater(dev, 0, noop) }, ErrBadRequest},
			{"no then", func(l Launch, dev uint64) error { return l.ReadLater(dev, 8, nil) }, ErrBadRequest},
			{"twice", func(l Launch, dev uint64) error {
				if err := l.ReadLater(dev, 8, noop); err != nil {
					return err
				}
				return l.ReadLater(dev+8, 8, noop)
			}, ErrNotInRun},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				_, err := ln.Run(func(l Launch) error {
					dev := uint64(0)
					if c.name != "before any stage" {
						var err error
						if dev, err = l.Stage(words); err != nil {
							return err
						}
					}
					return c.read(l, dev)
				})
				if !errors.Is(err, c.want) {
					t.Fatalf("%v, want %v", err, c.want)
				}
			})
		}
		var got []byte
		h, err := ln.Run(func(l Launch) error {
			dev, err := l.Stage(words)
			if err != nil {
				return err
			}
			return l.ReadLater(dev+8, 16, func(b []byte) { got = bytes.Clone(b) })
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Wait(); err != nil {
			t.Fatal(err)
		}
		if want := AsBytes(words[1:]); !bytes.Equal(got, want) {
			t.Fatalf("then got % x, want % x", got, want)
		}
	})
}
