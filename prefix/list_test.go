package prefix

import (
	"slices"
	"testing"
)

func TestKeysListsReadyEntriesAndHasAnswersEachKey(t *testing.T) {
	r, c := testTier(t, 1)
	s := testStore(t, c, 64, 256)
	keys := keysN(10)
	payloads := make([][]byte, len(keys))
	for i, k := range keys {
		payloads[i] = payloadFor(k, 100)
	}
	if _, err := s.Set(keys, payloads); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Delete(keys[3:5]); err != nil || n != 2 {
		t.Fatalf("delete: %d, %v", n, err)
	}
	want := append(slices.Clone(keys[:3]), keys[5:]...)
	// A reservation not yet published is not listed.
	res, err := s.Reserve([]Key{keyN(100)}, []int64{100})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Abort(res)

	got, err := s.Keys(nil)
	if err != nil {
		t.Fatal(err)
	}
	cmp := func(a, b Key) int { return slices.Compare(a[:], b[:]) }
	slices.SortFunc(got, cmp)
	slices.SortFunc(want, cmp)
	if !slices.Equal(got, want) {
		t.Fatalf("Keys listed %d keys, want the %d ready ones", len(got), len(want))
	}

	ask := []Key{keys[0], keys[3], keyN(100), keys[9], keyN(200)}
	present := make([]bool, len(ask))
	if err := s.Has(ask, present); err != nil {
		t.Fatal(err)
	}
	if wantHas := []bool{true, false, false, true, false}; !slices.Equal(present, wantHas) {
		t.Fatalf("Has = %v, want %v", present, wantHas)
	}
	if err := s.Has(ask, present[:2]); err == nil {
		t.Fatal("Has with too little room for answers: no error")
	}

	names, err := Names(r)
	if err != nil || !slices.Contains(names, s.Name()) {
		t.Fatalf("Names = %v, %v; want it to hold %q", names, err, s.Name())
	}
}

func TestKeysAfterCloseFails(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 16, 256)
	c.Close()
	if _, err := s.Keys(nil); err == nil {
		t.Fatal("Keys on a closed client: no error")
	}
	if err := s.Has([]Key{keyN(1)}, make([]bool, 1)); err == nil {
		t.Fatal("Has on a closed client: no error")
	}
}
