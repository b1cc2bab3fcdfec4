package smi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv("SMI_TEST_HELPER") != "" {
		helperMain()
		return
	}
	goleak.VerifyTestMain(m)
}

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseGPUs(t *testing.T) {
	tests := []struct {
		file    string
		want    []GPU
		wantErr string
	}{
		{file: "gpus_rtx4090.txt", want: []GPU{{
			Index: 0, Name: "NVIDIA GeForce RTX 4090", UUID: "GPU-5c2f8b4e-0c3a-7d1e-9f2b-3a4d5e6f7a8b",
			Total: 24564 * mib, Used: 18234 * mib, Free: 5879 * mib, MemoryKnown: true,
		}}},
		{file: "gpus_windows_crlf.txt", want: []GPU{{
			Index: 0, Name: "NVIDIA GeForce RTX 3080 Laptop GPU", UUID: "GPU-1f0a3b5c-7d9e-2f4a-6b8c-0d1e2f3a4b5c",
			Total: 16384 * mib, Used: 1234 * mib, Free: 14892 * mib, MemoryKnown: true,
		}}},
		{file: "gpus_placeholders.txt", want: []GPU{
			{Index: 0, Name: "NVIDIA A100-SXM4-40GB", UUID: "GPU-3d2c1b0a-9f8e-7d6c-5b4a-392817161514"},
			{Index: 1, Name: "GRID A100-4C", UUID: "GPU-aa11bb22-cc33-dd44-ee55-ff6677889900"},
		}},
		{file: "gpus_no_devices.txt"},
		{file: "gpus_driver_failed.txt", wantErr: "line 1"},
		{file: "gpus_garbage.txt", wantErr: "(4 lines): line 2", want: []GPU{
			{Index: 0, Name: "NVIDIA GeForce RTX 4090", UUID: "GPU-5c2f8b4e-0c3a-7d1e-9f2b-3a4d5e6f7a8b",
				Total: 24564 * mib, Used: 18234 * mib, Free: 5879 * mib, MemoryKnown: true},
			{Index: 3, Name: "Weird, Name, With Commas", UUID: "GPU-v",
				Total: 100 * mib, Used: 50 * mib, Free: 50 * mib, MemoryKnown: true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := ParseGPUs(readTestdata(t, tt.file))
			checkErr(t, err, tt.wantErr)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseGPUsDGX(t *testing.T) {
	got, err := ParseGPUs(readTestdata(t, "gpus_dgx_h100.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 {
		t.Fatalf("%d GPUs, want 8", len(got))
	}
	for i, g := range got {
		if g.Index != i || !g.MemoryKnown || g.Total != 81559*mib || g.Used+g.Free > g.Total {
			t.Errorf("GPU %d = %+v", i, g)
		}
	}
}

func TestParseApps(t *testing.T) {
	const u4090 = "GPU-5c2f8b4e-0c3a-7d1e-9f2b-3a4d5e6f7a8b"
	tests := []struct {
		file    string
		want    []App
		wantErr string
	}{
		{file: "apps_ollama_comfyui.txt", want: []App{
			{GPUUUID: u4090, PID: 2345, UsedBytes: 9870 * mib, UsedKnown: true, Name: "/usr/local/bin/ollama"},
			{GPUUUID: u4090, PID: 3456, UsedBytes: 7640 * mib, UsedKnown: true, Name: "/home/ada/ComfyUI/venv/bin/python"},
		}},
		{file: "apps_container_na.txt", want: []App{
			{GPUUUID: u4090, PID: 4567, Name: "python3"},
			{GPUUUID: u4090, PID: 4568},
		}},
		{file: "apps_windows.txt", want: []App{
			{GPUUUID: "GPU-1f0a3b5c-7d9e-2f4a-6b8c-0d1e2f3a4b5c", PID: 11844, Name: `C:\Program Files\NVIDIA Corporation\NVIDIA Share.exe`},
			{GPUUUID: "GPU-1f0a3b5c-7d9e-2f4a-6b8c-0d1e2f3a4b5c", PID: 13300, Name: `C:\Windows\explorer.exe`},
		}},
		{file: "apps_empty.txt"},
		{file: "apps_no_processes.txt"},
		{file: "apps_comma_name.txt", want: []App{
			{GPUUUID: u4090, PID: 5555, UsedBytes: 512 * mib, UsedKnown: true, Name: "/opt/odd, name/bin/app"},
		}},
		{file: "apps_garbage.txt", wantErr: "(6 lines): line 2", want: []App{
			{GPUUUID: "GPU-a", PID: 1, UsedBytes: 2 * mib, UsedKnown: true, Name: "x"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := ParseApps(readTestdata(t, tt.file))
			checkErr(t, err, tt.wantErr)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("unexpected error: %v", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Errorf("error = %v, want one containing %q", err, want)
	}
}

func TestParseHostile(t *testing.T) {
	inputs := []string{
		strings.Repeat(",", 10000),
		strings.Repeat("0, a, b, 1, 1, 1\n", 3) + "\x00\xff\xfe",
		"0, x, GPU-1, 18446744073709551615, 1, 1",
		"0, x, GPU-1, 17592186044416, 1, 1", // the first MiB count that overflows
		"99999999999999999999999, x, GPU-1, 1, 1, 1",
		"[N/A], [N/A], [N/A], [N/A], [N/A], [N/A]",
		"\n\n\r\n",
		"[], [], [], [], [], []",
	}
	for _, in := range inputs {
		gpus, _ := ParseGPUs([]byte(in))
		apps, _ := ParseApps([]byte(in))
		checkGPUs(t, gpus)
		checkApps(t, apps)
	}
}

func FuzzParseGPUs(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		gpus, err := ParseGPUs(b)
		checkGPUs(t, gpus)
		if err == nil && len(gpus) == 0 && strings.Contains(string(b), ",") {
			// every line with a comma was either parsed or reported
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, ",") {
					t.Fatalf("line %q neither parsed nor reported", line)
				}
			}
		}
	})
}

func FuzzParseApps(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		apps, _ := ParseApps(b)
		checkApps(t, apps)
	})
}

func addSeeds(f *testing.F) {
	names, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b) // both parsers get every sample: each is the other's garbage
	}
}

func checkGPUs(t testing.TB, gpus []GPU) {
	t.Helper()
	seen := map[int]bool{}
	for _, g := range gpus {
		if g.Index < 0 || g.Index >= maxIndex || seen[g.Index] {
			t.Fatalf("bad or repeated index in %+v", g)
		}
		seen[g.Index] = true
		if !g.MemoryKnown && (g.Total|g.Used|g.Free) != 0 {
			t.Fatalf("unknown memory with figures: %+v", g)
		}
		if (g.Total|g.Used|g.Free)%mib != 0 {
			t.Fatalf("figures not whole MiB: %+v", g)
		}
		if g.Name != strings.TrimSpace(g.Name) || g.UUID != strings.TrimSpace(g.UUID) {
			t.Fatalf("untrimmed text: %+v", g)
		}
	}
}

func checkApps(t testing.TB, apps []App) {
	t.Helper()
	for _, a := range apps {
		if a.GPUUUID == "" || strings.ContainsAny(a.GPUUUID, ",\n") {
			t.Fatalf("bad uuid: %+v", a)
		}
		if !a.UsedKnown && a.UsedBytes != 0 {
			t.Fatalf("unknown memory with a figure: %+v", a)
		}
		if strings.Contains(a.Name, "\n") {
			t.Fatalf("name spans lines: %+v", a)
		}
	}
}

// helperMain is the child process of the Run tests: it behaves as the
// SMI_TEST_HELPER variable says.
func helperMain() {
	switch os.Getenv("SMI_TEST_HELPER") {
	case "ok":
		fmt.Println("0, Fake GPU, GPU-1, 100, 10, 90")
	case "fail":
		fmt.Println("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
		os.Exit(9)
	case "flood":
		line := strings.Repeat("x", 1<<16) + "\n"
		for range 2 * MaxOutput / len(line) {
			os.Stdout.WriteString(line)
		}
	case "hang":
		time.Sleep(time.Minute)
	}
	os.Exit(0)
}

func runHelper(t *testing.T, ctx context.Context, mode string) ([]byte, error) {
	t.Setenv("SMI_TEST_HELPER", mode)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Run(ctx, exe)
}

func TestRun(t *testing.T) {
	out, err := runHelper(t, t.Context(), "ok")
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := ParseGPUs(out)
	if err != nil || len(gpus) != 1 || gpus[0].Free != 90*mib {
		t.Fatalf("ParseGPUs(%q) = %+v, %v", out, gpus, err)
	}
}

func TestRunFailure(t *testing.T) {
	_, err := runHelper(t, t.Context(), "fail")
	if err == nil || !strings.Contains(err.Error(), "exit status 9: NVIDIA-SMI has failed") {
		t.Fatalf("err = %v", err)
	}
}

func TestRunFlood(t *testing.T) {
	_, err := runHelper(t, t.Context(), "flood")
	if !errors.Is(err, errTooMuchOutput) {
		t.Fatalf("err = %v, want errTooMuchOutput", err)
	}
}

func TestRunCanceled(t *testing.T) {
	cause := errors.New("deadline for the probe")
	ctx, cancel := context.WithTimeoutCause(t.Context(), 200*time.Millisecond, cause)
	defer cancel()
	start := time.Now()
	_, err := runHelper(t, ctx, "hang")
	if !errors.Is(err, cause) {
		t.Fatalf("err = %v, want the cause", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Run took %v after cancel", d)
	}
}

func TestRunMissing(t *testing.T) {
	_, err := Run(t.Context(), filepath.Join(t.TempDir(), "nvidia-smi"))
	if err == nil {
		t.Fatal("Run of a missing program succeeded")
	}
}
