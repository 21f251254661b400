package engram

import "testing"

func TestMultipliersCheckValues(t *testing.T) {
	// engram.md: seed 0, V = 99,092.
	for _, tc := range []struct {
		layer int
		want  []int64
	}{
		{1, []int64{76632096046245, 4839876093313, 35959672319349, 73987337458391}},
		{14, []int64{67716810739261, 51510806800915, 30921347202721, 82619226485591}},
	} {
		got, err := multipliers(0, tc.layer, 99092, 4)
		if err != nil {
			t.Fatal(err)
		}
		for i := range tc.want {
			if got[i] != tc.want[i] {
				t.Fatalf("layer %d: got %v, want %v", tc.layer, got, tc.want)
			}
		}
	}
}
