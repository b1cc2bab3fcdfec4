package vramguard

import "testing"

// TestFreedSharesClaim: the rules by which the unloads of one call share
// the rise in free memory (UnloadReport.VRAMFreed), claimed in the order
// their waits end: a measured runner's bytes, else size_vram, the last to
// end taking what is left; never more in total than the largest rise seen,
// never negative.
func TestFreedSharesClaim(t *testing.T) {
	type claim struct {
		back     memoryBack
		sizeVRAM int64
		want     int64
	}
	tests := []struct {
		name    string
		members int
		left    int // members that leave without claiming, first
		claims  []claim
	}{
		{name: "measured, each its own", members: 2, claims: []claim{
			{back: memoryBack{rise: 14, held: 8, measured: true}, sizeVRAM: 7, want: 8},
			{back: memoryBack{rise: 14, held: 6, measured: true}, sizeVRAM: 5, want: 6},
		}},
		{name: "measured, bounded by the rise not claimed", members: 2, claims: []claim{
			{back: memoryBack{rise: 8, held: 8, measured: true}, want: 8},
			{back: memoryBack{rise: 12, held: 6, measured: true}, want: 4},
		}},
		{name: "estimates, the last takes the rest", members: 2, claims: []claim{
			{back: memoryBack{rise: 9}, sizeVRAM: 8, want: 8},
			{back: memoryBack{rise: 15}, sizeVRAM: 6, want: 7},
		}},
		{name: "estimates, bounded by the rise", members: 3, claims: []claim{
			{back: memoryBack{rise: 5}, sizeVRAM: 8, want: 5},
			{back: memoryBack{rise: 6}, sizeVRAM: 6, want: 1},
		}},
		{name: "a member left: the last claimer takes the rest", members: 2, left: 1, claims: []claim{
			{back: memoryBack{rise: 10}, sizeVRAM: 6, want: 10},
		}},
		{name: "the rise fell: nothing, never negative", members: 2, claims: []claim{
			{back: memoryBack{rise: 8, held: 8, measured: true}, want: 8},
			{back: memoryBack{rise: 2}, sizeVRAM: 6, want: 0},
		}},
		{name: "alone, no estimate: the whole rise", members: 1, claims: []claim{
			{back: memoryBack{rise: 3}, want: 3},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &freedShares{members: tt.members}
			for range tt.left {
				f.leave()
			}
			for i, c := range tt.claims {
				if got := f.claim(c.back, c.sizeVRAM); got != c.want {
					t.Errorf("claim %d: %d, want %d", i, got, c.want)
				}
			}
		})
	}
	var none *freedShares
	none.leave()
	if got := none.claim(memoryBack{rise: 5, held: 5, measured: true}, 5); got != 0 {
		t.Errorf("a nil group claimed %d", got)
	}
}
