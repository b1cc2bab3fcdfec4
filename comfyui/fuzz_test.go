package comfyui

import (
	"strings"
	"testing"
)

// FuzzOOMBytes: the bytes an out-of-memory text names are read without a
// panic, and only from the texts the library matches ("VRAM grow failed:
// N", torch's "Tried to allocate X unit").
func FuzzOOMBytes(f *testing.F) {
	f.Add("VRAM grow failed: 2013757440 bytes")
	f.Add("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 8.00 GiB")
	f.Add("Tried to allocate 99999999999999999999999.5 GiB")
	f.Add("VRAM grow failed: 99999999999999999999999999")
	f.Fuzz(func(t *testing.T, msg string) {
		n := oomBytes(msg)
		if n != 0 && !strings.Contains(msg, "VRAM grow failed: ") && !strings.Contains(msg, "Tried to allocate ") {
			t.Errorf("oomBytes(%q) = %d from a text that names no allocation", msg, n)
		}
	})
}

// FuzzGBFlag: any argv (what /system_stats reports, untrusted) reads
// without a panic, and a flag's value is never negative or past 1 PiB.
func FuzzGBFlag(f *testing.F) {
	f.Add("main.py --reserve-vram 4", "--reserve-vram")
	f.Add("main.py --reserve-vram=0.5 --vram-headroom", "--vram-headroom")
	f.Add("main.py --reserve-vram NaN", "--reserve-vram")
	f.Add("main.py --reserve-vram -0", "--reserve-vram")
	f.Fuzz(func(t *testing.T, argv, flag string) {
		var st SystemStats
		st.System.Argv = strings.Fields(argv)
		n, ok := st.GBFlag(flag)
		if !ok && n != 0 || n > 1<<50 {
			t.Errorf("GBFlag(%q) in %q = %d, %v", flag, argv, n, ok)
		}
		_ = st.Mode()
	})
}
