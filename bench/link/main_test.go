package main

import (
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
	} {
		_, err := parseOpts(strings.Fields(tc.args), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
	o, err := parseOpts(nil, io.Discard)
	if err != nil || o.arbiter != "both" || o.engine != "cpu" || o.piece != kernels.DefaultPiece {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
	if o, err := parseOpts([]string{"-engine", "cuda"}, io.Discard); err != nil || o.piece != kernels.DevicePiece {
		t.Fatalf("a GPU's piece: %+v, %v", o, err)
	}
}
