package main

import (
	"io"
	"strings"
	"testing"
)

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"-arbiter sometimes", "-arbiter"},
		{"-piece 0", "-piece"},
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
	if err != nil || o.arbiter != "both" || o.piece <= 0 {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
}
