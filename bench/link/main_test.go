package main

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/cxltier/cxltier/kernels"
)

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"-arbiter sometimes", "-arbiter"},
		{"-piece -1", "-piece"},
		{"-engine tpu", "-engine"},
		{"-share 0", "-share"},
		{"-chunk 100", "-chunk"},
		{"-seconds 0", "-seconds"},
		{"-tier-size lots", "-tier-size"},
		{"-geometry nope", "-geometry"},
		{"-with both", "-with"},
		{"-with topk -topk 4096 -context 1024", "-context"},
		{"-with topk -topk-hit 1.5", "-topk-hit"},
		{"-with topk -topk-deadline 0s", "-topk-deadline"},
		{"-fill -1", "-fill"},
		{"-fill-part lots", "-fill-part"},
		{"-with ttft -ttft-pages 0", "-ttft-pages"},
		{"-with ttft -ttft-deadline 0s", "-ttft-deadline"},
		{"-with ttft -ttft-gap -1s", "-ttft-gap"},
		{"-kv-first-token maybe", "-kv-first-token"},
		{"-bulk-priority high", "-bulk-priority"},
		{"-bulk-priority=", "-bulk-priority"},
		{"-mixed-bulk-priority nice", "-mixed-bulk-priority"},
	} {
		_, err := parseOpts(strings.Fields(tc.args), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
	o, err := parseOpts(nil, io.Discard)
	if err != nil || o.arbiter != "both" || o.engine != "cpu" || o.piece != kernels.DefaultPiece || o.kvFirst || o.bulkPriority != kernels.PriorityLow || o.mixedPriority != kernels.PriorityNormal {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
	if o, err := parseOpts([]string{"-engine", "cuda"}, io.Discard); err != nil || o.piece != kernels.DevicePiece || !o.kvFirst {
		t.Fatalf("a GPU's piece: %+v, %v", o, err)
	}
}

// A fill's parts are the uplink's: at least a part of whole pages each,
// a short tail joined to the part before it, one part for a fill smaller
// than two.
func TestFillParts(t *testing.T) {
	for _, tc := range []struct {
		n          int
		page, part int64
		want       [][2]int
	}{
		{32, 1 << 20, 8 << 20, [][2]int{{0, 8}, {8, 16}, {16, 24}, {24, 32}}},
		{9, 1 << 20, 4 << 20, [][2]int{{0, 4}, {4, 9}}},           // a tail of 1 of 4 joins
		{11, 1 << 20, 4 << 20, [][2]int{{0, 4}, {4, 8}, {8, 11}}}, // of 3: its own
		{7, 1 << 20, 4 << 20, [][2]int{{0, 7}}},                   // under two parts
		{8, 1 << 20, 0, [][2]int{{0, 8}}},
		{4, 3 << 20, 1 << 20, [][2]int{{0, 1}, {1, 2}, {2, 3}, {3, 4}}}, // a page over a part
	} {
		got := fillParts(tc.n, tc.page, tc.part)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%d pages of %d, parts of %d: %v, want %v", tc.n, tc.page, tc.part, got, tc.want)
		}
	}
}
