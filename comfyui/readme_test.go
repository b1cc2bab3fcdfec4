package comfyui_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/internal/testkit/readmecheck"
)

// TestHandOffInREADME: the README's ComfyUI section shows Example's hand-off
// as it is.
func TestHandOffInREADME(t *testing.T) { readmecheck.Part(t, "../README.md", "example_test.go") }

// launchBlock is the README's ComfyUI launch command.
var launchBlock = regexp.MustCompile("(?s)<!-- launch: comfyui -->\n```sh\n(.*?)\n```\n")

// TestLaunchInREADME: the launch command the README's ComfyUI section
// gives is read back as it says: a ComfyUI started with it (the fake, its
// argv the command's) reports DynamicVRAM, and SystemStats.GBFlag finds
// the reserve and the headroom the command sets; the fake configured with
// them has that argv; and the guidance explains every flag the command
// uses.
func TestLaunchInREADME(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := launchBlock.FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md shows no ComfyUI launch command")
	}
	args := strings.Fields(string(m[1]))
	if len(args) < 2 || args[0] != "python" || args[1] != "main.py" {
		t.Fatalf("launch command %q; want python main.py ...", m[1])
	}
	argv := args[1:]
	p := newPair(t, comfyuitest.Config{Argv: argv})
	c := p.client(t, p.ollama.GPU())
	st, err := c.SystemStats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode() != comfyui.ModeDynamicVRAM {
		t.Errorf("mode %q; want DynamicVRAM for the README's command", st.Mode())
	}
	reserve, rok := st.GBFlag("--reserve-vram")
	headroom, hok := st.GBFlag("--vram-headroom")
	if !rok || !hok || reserve != 10*gib || headroom != gib {
		t.Errorf("GBFlag: reserve %d (%v), headroom %d (%v); want 10 GiB and 1 GiB", reserve, rok, headroom, hok)
	}
	f, err := comfyuitest.NewServer(p.ollama, comfyuitest.Config{ReserveVRAM: reserve, VRAMHeadroom: headroom})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c2, err := comfyui.New(comfyui.Options{URL: f.URL().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	st2, err := c2.SystemStats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.DeleteFunc(slices.Clone(argv), func(a string) bool { return a == "--listen" || a == "--port" || a == "127.0.0.1" || a == "8188" }); !slices.Equal(st2.System.Argv, want) {
		t.Errorf("the fake with those flags has argv %q; want %q", st2.System.Argv, want)
	}
	section := string(readme[strings.Index(string(readme), "### Running ComfyUI beside Ollama"):])
	for _, a := range argv {
		if strings.HasPrefix(a, "--") && !strings.Contains(section, "`"+a) {
			t.Errorf("the guidance does not explain %s", a)
		}
	}
}
