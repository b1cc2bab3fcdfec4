package vramguard

import (
	"fmt"
	"testing"
)

// BenchmarkPlanRoom: the victim policy's cost by the number of models a
// device holds: exact up to 16 (every subset), a greedy pass past that.
func BenchmarkPlanRoom(b *testing.B) {
	for _, n := range []int{2, 4, 8, 12, 16, 32} {
		b.Run(fmt.Sprintf("models=%d", n), func(b *testing.B) {
			v := roomView{free: roomGiB}
			var total uint64
			for i := range n {
				c := model(fmt.Sprintf("m%02d", i), uint64(i%7+1))
				v.cands = append(v.cands, c)
				total += c.bytes
			}
			need := v.free + total/2 + 1 // half of everything: many subsets qualify
			b.ReportAllocs()
			for b.Loop() {
				if p := planRoom(v, need); !p.enough {
					b.Fatal("no plan")
				}
			}
		})
	}
}
