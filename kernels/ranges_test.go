package kernels

import (
	"errors"
	"testing"
)

func TestAsBytes(t *testing.T) {
	got := AsBytes([]int32{1, -2})
	if want := []byte{1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff}; string(got) != string(want) {
		t.Fatalf("int32s: % x", got)
	}
	if got := AsBytes([]Addr{At(2, 3)}); len(got) != 8 || got[0] != 3 || got[7] != 2 {
		t.Fatalf("addrs: % x", got)
	}
	if AsBytes([]uint64(nil)) != nil {
		t.Fatal("empty slice")
	}
}

// TestRegisterAllRollsBack: a failing range unregisters the ones before it.
func TestRegisterAllRollsBack(t *testing.T) {
	e := NewCPU(1)
	defer e.Close()
	mems := [][]byte{make([]byte, 64), make([]byte, 64), nil}
	if _, err := RegisterAll(e, len(mems), func(i int) []byte { return mems[i] }); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("empty third range: %v", err)
	}
	ids, err := RegisterAll(e, 2, func(i int) []byte { return mems[i] })
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] != 0 || ids[1] != 1 {
		t.Fatalf("ids %v: the failed call left ranges registered", ids)
	}
	if err := UnregisterAll(e, ids); err != nil {
		t.Fatal(err)
	}
	if err := UnregisterAll(e, ids); !errors.Is(err, ErrNoRange) {
		t.Fatalf("second unregister: %v", err)
	}
}
